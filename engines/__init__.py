"""Inference engines behind one interface (``base.Engine``): ``vllm/``
(replicas, vllm-router, the tiny model, the in-replica journal middleware)
and ``triton/`` (tritonserver behind HAProxy for ``--engine triton``, and the
PyTriton node of the GPU scenario). ``base.engine_for`` picks one."""
