"""Choose the backend: ``--cluster local`` or ``--cluster docker``. Both
give the same Cluster (ordeal.topology), so suites, faults and checkers
never ask which one runs."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from clusters.docker import DockerCluster, DockerError
from clusters.docker_image import ImageError
from clusters.local import LocalCluster
from clusters.ray import RayCluster, RayError
from engines.triton.haproxy import HaproxyMissing
from engines.triton.server import TritonMissing
from faults.containers import DockerUnavailable
from ordeal.config import ClusterSpec

#: Errors that mean "this backend cannot start here", each with a message
#: that says what to do: shown as such, without a stack trace.
BACKEND_ERRORS = (DockerUnavailable, DockerError, ImageError, RayError, HaproxyMissing,
                  TritonMissing)


def make_cluster(spec: ClusterSpec, cluster_id: str, log_dir: Path,
                 progress: Callable[[str], None] = print
                 ) -> LocalCluster | DockerCluster | RayCluster:
    if spec.backend == "ray":
        return RayCluster(spec, cluster_id, log_dir, progress=progress)
    if spec.backend == "docker":
        return DockerCluster(spec, cluster_id, log_dir, progress=progress)
    return LocalCluster(spec, cluster_id, log_dir, progress=progress)
