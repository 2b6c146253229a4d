"""The embedded default cluster: N real replicas behind a real router, as
processes on this machine (``--cluster local``): vLLM replicas behind
vllm-router, or Triton replicas behind HAProxy (``--engine``); the engine
adapter (engines/base.py) makes the nodes, the backend wires them.

Use it as a context manager: every node is stopped in ``finally`` when the
block ends, whether it returns, fails or is interrupted, and teardown checks
that no process of the run is left.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from clusters.base import HostFrontCluster
from engines.registry import engine_for
from engines.vllm.model import TinyModel
from nodes.ports import free_ports
from ordeal.config import ClusterSpec

Progress = Callable[[str], None]


class LocalCluster(HostFrontCluster):
    backend = "local"

    def __init__(self, spec: ClusterSpec, cluster_id: str, log_dir: Path,
                 progress: Progress = print, model: TinyModel | None = None):
        super().__init__(spec, cluster_id, log_dir, progress, model)
        self.engine = spec.engine
        self.engine_adapter = engine_for(spec.engine, spec)
        # Where a sequence jump tells the Triton client what to do (faults/
        # sequence_jump.py); None for engines without request-chain sequences.
        self.sequence_jump_file: Path | None = (self.log_dir / "sequence-jump.json"
                                                if spec.engine == "triton" else None)
        # Replica indices to start together, wave after wave; None: all at
        # once. Set by the engine's prepare (vLLM replicas sharing a GPU:
        # engines/vllm/gpus.py start_waves).
        self.start_waves: list[list[int]] | None = None

    # -- lifecycle --------------------------------------------------------
    def start(self) -> "LocalCluster":
        t0 = time.monotonic()
        self.engine_adapter.prepare(self)
        host = self.spec.host
        per = self.engine_adapter.ports_per_replica()
        # The replicas bind theirs at once, before loading.
        ports = free_ports(self.spec.replicas * per, host)
        replicas = [self.engine_adapter.replica(self, i, ports[i * per:(i + 1) * per])
                    for i in range(self.spec.replicas)]
        self.nodes.extend(replicas)
        waves = self.start_waves or [list(range(len(replicas)))]
        self.progress(f"starting {len(replicas)} {self.engine} replica(s) on ports "
                      f"{[r.endpoint.port for r in replicas]}"
                      + (f" in {len(waves)} waves" if len(waves) > 1 else "")
                      + f"; logs in {self.log_dir}")
        def again(node: Any) -> Any:
            """The replica ``node`` stopped and made anew on new ports, started."""
            i = replicas.index(node)
            node.stop()
            fresh = self.engine_adapter.replica(self, i, free_ports(per, host))
            self.nodes[self.nodes.index(node)] = replicas[i] = fresh
            fresh.start()
            return fresh

        for wave in waves:
            for i in wave:
                replicas[i].start()
            self._wait_all([replicas[i] for i in wave], again=again)
        self._start_front(replicas)
        self.ready(t0, f"router at {self.router.endpoint.url} in front of "
                       f"{len(replicas)} replica(s)")
        return self

    def stop(self) -> None:
        """Stop every node, router first; collect failures and raise them at
        the end, so one stuck node never leaves the others running."""
        problems = []
        stoppable = [*reversed(self.nodes), *([self.proxy] if self.proxy else [])]
        for node in stoppable:
            try:
                node.stop()
            except Exception as e:  # noqa: BLE001 - keep stopping the rest
                problems.append(f"{node.name}: {e}")
        if problems:
            raise RuntimeError("teardown left problems: " + "; ".join(problems))
