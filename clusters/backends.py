"""Choose the backend: ``--cluster local``, ``docker``, ``ray`` or
``external`` (a running deployment, ``--target FILE``). All
give the same Cluster (ordeal.topology), so suites, faults and checkers
never ask which one runs."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from clusters.docker import DockerCluster, DockerError
from clusters.docker_image import ImageError
from clusters.external import ExternalCluster
from clusters.local import LocalCluster
from clusters.ray import RayCluster
from clusters.ray_runtime import RayError
from engines.triton.haproxy import HaproxyMissing
from engines.triton.server import TritonMissing
from ordeal.config import ClusterSpec, ConfigError
from ordeal.containers import DockerUnavailable
from ordeal.target import TargetSpec

#: Errors that mean "this backend cannot start here", each with a message
#: that says what to do: shown as such, without a stack trace.
BACKEND_ERRORS = (DockerUnavailable, DockerError, ImageError, RayError, HaproxyMissing,
                  TritonMissing)


def make_cluster(spec: ClusterSpec, cluster_id: str, log_dir: Path,
                 progress: Callable[[str], None] = print, target: TargetSpec | None = None
                 ) -> LocalCluster | DockerCluster | RayCluster | ExternalCluster:
    """``target``: the --target file, for ``--cluster external``."""
    if spec.backend == "external":
        if target is None:
            raise ConfigError("--cluster external needs --target FILE.toml")
        return ExternalCluster(spec, target, cluster_id, log_dir, progress=progress)
    if spec.backend == "ray":
        return RayCluster(spec, cluster_id, log_dir, progress=progress)
    if spec.backend == "docker":
        return DockerCluster(spec, cluster_id, log_dir, progress=progress)
    return LocalCluster(spec, cluster_id, log_dir, progress=progress)
