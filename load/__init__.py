"""Load and measurement: the seeded workload and its client (``workload``,
``sse``), the monitor that samples every node (``monitor``, ``metrics``,
``gpu_telemetry``), the full-chain health probe, the router watch and the
harness's own memory (``heap``). Knows no engine by name: an engine plugs in
through ``EngineClient`` and a metrics mapping."""
