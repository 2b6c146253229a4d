"""Triton Inference Server. ``server``: the real tritonserver for
``--engine triton``, behind HAProxy (``haproxy``), with generated model
repositories (``models``), its client (``client``) and adapter
(``adapter``). ``pytriton``: the PyTriton node of the GPU scenario."""
