"""Cluster backends: where the nodes run. ``local`` (processes on this
machine), ``docker`` (containers; ``docker_image`` builds the base image),
``ray`` (simulated Ray nodes; ``ray_node_main`` is one node's process);
``base`` holds what they share (the fault proxy and router front),
``backends`` picks one from ``--cluster``."""
