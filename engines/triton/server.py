"""A CPU Triton Inference Server node: the real ``tritonserver`` binary that
``nvidia-pytriton`` bundles, run directly on a model repository written by
engines.triton.models (no pytriton Python layer in between).

Two traps decide how it is started (both seen on these machines):

* The Python backend stub embeds the system's ``libpython3.X``; a venv from
  another 3.X build then mixes two standard libraries ("'_thread.RLock'
  object has no attribute '_recursion_count'"). The interpreter's own lib
  directory goes first in LD_LIBRARY_PATH.
* The stub was built against numpy 1: with numpy 2 every output tensor
  arrives empty ("output tensor shape does not match size of output"). The
  stub ignores PYTHONPATH and the venv, but its ``sys.path`` starts with the
  working directory; the server runs in a directory holding only numpy 1.26
  (``stub_site_dir()``, made by ``python -m engines.triton.server prepare``,
  which .ci/setup runs). Nothing outside the suite's cache is changed.

The node serves HTTP (KServe v2), gRPC and Prometheus metrics; it writes a
per-request trace (Triton's TIMESTAMPS level) beside its log, which the
engine adapter reads for ``trace(op)``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path

from engines.triton.models import (
    GENERATE_MODEL,
    ONCE_MODEL,
    SEQUENCE_MODEL,
    UNCHECKED_SEQUENCE_MODEL,
    repository_digest,
    write_repository,
)
from nodes.local import LocalNode
from nodes.process import ManagedProcess
from nodes.waits import wait_http_ok
from ordeal.faketime import faketime_env, prepare_clock_file
from ordeal.topology import Endpoint, NodeNotReady

STUB_NUMPY = "numpy==1.26.4"
MODELS = (GENERATE_MODEL, ONCE_MODEL, SEQUENCE_MODEL, UNCHECKED_SEQUENCE_MODEL)
TRITON_HINT = ("the node is the tritonserver binary from nvidia-pytriton; its argv and "
               "output are in the log. Run `python -m engines.triton.server check` to see "
               "what is missing")


class TritonMissing(RuntimeError):
    """This machine cannot run a CPU Triton node; the message says what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get("ORDEAL_CACHE", Path.home() / ".cache" / "ordeal"))


def stub_site_dir() -> Path:
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    return cache_dir() / f"triton-stub-site-{tag}-{STUB_NUMPY.replace('==', '-')}"


def triton_home() -> Path:
    """The ``tritonserver`` tree inside the installed pytriton wheel."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonMissing("nvidia-pytriton is not installed (it bundles tritonserver); run "
                            "bash .ci/setup, or pip install --no-deps nvidia-pytriton==0.7.0 "
                            "tritonclient==2.51.0")
    home = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    if not (home / "bin" / "tritonserver").exists():
        raise TritonMissing(f"{home}/bin/tritonserver is missing: reinstall nvidia-pytriton")
    return home


def backend_dir() -> Path:
    """A backends directory whose python backend holds the stub for this
    interpreter's version (pytriton keeps one stub per Python version apart
    and links the right one at start; we do the same, once, in the cache)."""
    home = triton_home()
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = home / "python_backend_stubs" / ver / "triton_python_backend_stub"
    if not stub.exists():
        raise TritonMissing(f"pytriton has no Python backend stub for Python {ver} ({stub})")
    # One directory per installation: two venvs on one machine must not
    # flip each other's links.
    tag = hashlib.sha256(str(home).encode()).hexdigest()[:8]
    out = cache_dir() / f"triton-backends-{ver}-{tag}" / "python"
    out.mkdir(parents=True, exist_ok=True)
    for src in (home / "backends" / "python" / "libtriton_python.so",
                home / "backends" / "python" / "triton_python_backend_utils.py", stub):
        link = out / src.name
        if not (link.is_symlink() and os.readlink(link) == str(src)):
            link.unlink(missing_ok=True)
            link.symlink_to(src)
    return out.parent


def prepare_stub_site() -> Path:
    """Install numpy 1.26 into the stub's site dir (idempotent; needs the
    package index once)."""
    site = stub_site_dir()
    if (site / "numpy" / "__init__.py").exists():
        return site
    tmp = site.with_name(site.name + ".tmp")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--target", str(tmp), STUB_NUMPY], check=True)
    tmp.rename(site)
    return site


def check() -> list[str]:
    """What is missing for a CPU Triton node; empty when it can run."""
    problems = []
    try:
        backend_dir()
    except TritonMissing as e:
        problems.append(str(e))
    if not (stub_site_dir() / "numpy" / "__init__.py").exists():
        problems.append(f"{stub_site_dir()} has no numpy 1.26 for Triton's Python backend stub; "
                        "run: python -m engines.triton.server prepare (bash .ci/setup does)")
    for mod in ("tritonclient.grpc.aio", "tritonclient.http.aio"):
        if importlib.util.find_spec(mod.split(".")[0]) is None:
            problems.append(f"{mod} is not importable; pip install tritonclient[http,grpc]")
            break
    return problems


def server_env(clock_file: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libdir, env.get("LD_LIBRARY_PATH")]))
    # One BLAS thread per model instance: instances are the parallelism, and a
    # node's CPU use then follows its load (what gpu_throttle's quota acts on).
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    if clock_file is not None:
        prepare_clock_file(clock_file)
        env.update(faketime_env(clock_file))
    return env


class TritonServerNode(LocalNode):
    """A Triton replica on CPU: ``endpoint`` is its HTTP port."""

    engine = "triton"
    #: Samples the monitor keeps (label sets summed over models). Triton's
    #: counters have no _total in their family names; prometheus_client's
    #: parser adds it to their samples.
    metrics_keep = ("nv_inference_request_success_total", "nv_inference_request_failure_total",
                    "nv_inference_count_total", "nv_inference_exec_count_total",
                    "nv_inference_pending_request_count", "nv_inference_queue_duration_us_total",
                    "nv_inference_compute_infer_duration_us_total", "nv_cpu_memory_used_bytes",
                    "nv_cpu_utilization")

    def __init__(self, name: str, http: Endpoint, grpc_port: int, metrics_port: int,
                 repo: Path, log_path: Path, cluster_id: str, clock_file: Path | None = None,
                 models: tuple[str, ...] = MODELS, digest: str | None = None):
        """``models``: those the node must have loaded to be ready (the
        first is the one the probe asks for); ``digest``: the repository's,
        for the fingerprint (None: Ordeal's generated models)."""
        problems = check()
        if problems:
            raise TritonMissing("cannot start a Triton node: " + "; ".join(problems))
        self.trace_path = log_path.with_suffix(".trace.json")
        argv = [str(triton_home() / "bin" / "tritonserver"),
                "--model-repository", str(repo), "--backend-directory", str(backend_dir()),
                "--http-address", http.host, "--http-port", str(http.port),
                "--grpc-address", http.host, "--grpc-port", str(grpc_port),
                "--metrics-address", http.host, "--metrics-port", str(metrics_port),
                "--allow-gpu-metrics", "false", "--strict-readiness", "true",
                "--exit-timeout-secs", "5", "--log-verbose", "0",
                # A per-request timeline (queue, compute) for trace(op), flushed
                # every 20 requests into trace.json.N files.
                "--trace-config", f"triton,file={self.trace_path}",
                "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                "--trace-config", "count=-1", "--trace-config", "triton,log-frequency=20"]
        proc = ManagedProcess(name, argv, server_env(clock_file), log_path, cluster_id,
                              cwd=stub_site_dir())
        super().__init__(name, "replica", http, proc, hint=f"see {log_path}; {TRITON_HINT}")
        self._clock_file = clock_file
        self.grpc_endpoint = Endpoint(http.host, grpc_port)
        self.health_url = f"{http.url}/v2/health/ready"
        self.models = models
        self.digest = digest or repository_digest()
        self.model_ready_url = f"{http.url}/v2/models/{models[0]}/ready"
        self.metrics_url = f"http://{http.host}:{metrics_port}/metrics"

    def wait_ready(self, timeout: float) -> None:
        for url in [self.health_url, *(f"{self.endpoint.url}/v2/models/{m}/ready"
                                       for m in self.models)]:
            wait_http_ok(name=self.name, url=url, timeout=timeout,
                         is_running=self.process.is_running, exit_code=self.process.exit_code,
                         log_tail=self.process.log_tail, hint=self.hint)
        self._fingerprint = probe_triton_fingerprint(self.endpoint.url, self.digest)


def probe_triton_fingerprint(base_url: str, digest: str, timeout: float = 5.0) -> str:
    """The server's own name and version (GET /v2) plus the repository's digest."""
    try:
        with urllib.request.urlopen(f"{base_url}/v2", timeout=timeout) as r:
            meta = json.loads(r.read())
    except (OSError, ValueError) as e:
        raise NodeNotReady(f"{base_url}/v2 did not answer with server metadata: {e}") from e
    return f"{meta.get('name', 'triton')}-{meta.get('version', '?')}+models-{digest}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engines.triton.server")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="install numpy 1.26 for the Python backend stub (once)")
    sub.add_parser("check", help="say what a CPU Triton node still needs")
    w = sub.add_parser("write-repo", help="write the model repository into DIR")
    w.add_argument("dir", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "prepare":
        print(f"stub site: {prepare_stub_site()}")
    if args.cmd == "write-repo":
        print(write_repository(args.dir))
        return 0
    problems = check()
    for line in problems:
        print(f"missing: {line}")
    if not problems:
        print(f"ok: tritonserver {triton_home() / 'bin' / 'tritonserver'}, backends "
              f"{backend_dir()}, stub site {stub_site_dir()}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
