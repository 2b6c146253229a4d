"""The user's own stack (issue 22): --model, --served-model-name, --tokenizer,
--max-model-len, --engine-args, --engine-env, --router-args, --router-profile.

Unit tests for the refusals and the command lines; one cluster test serves a
second model (another architecture and size, made here) with the user's
flags through the router as it ships, and one shows an engine flag vLLM
rejects coming back with vLLM's own error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from clusters.local import LocalCluster
from engines.vllm.model import ensure_tiny_model, resolve_model
from engines.vllm.nodes import (
    ORDEAL_ENGINE_DEFAULTS,
    ROUTER_PROFILES,
    ReplicaConfig,
    VllmReplica,
    replica_argv,
    replica_env,
    router_argv,
)
from nodes.ports import free_ports
from nodes.process import REPO_ROOT
from ordeal.config import ClusterSpec, ConfigError, parse_env_pairs, redact_argv, redact_env
from ordeal.topology import Endpoint, NodeNotReady

# -- refusals, before anything starts ------------------------------------------------


@pytest.mark.parametrize("kw, match", [
    ({"engine_args": ("--port", "9")}, "--port cannot be given here: Ordeal sets it"),
    ({"engine_args": ("--model=x",)}, "use Ordeal's own option --model"),
    ({"router_profile": "fast"}, "--router-profile 'fast': use one of ordeal, stock"),
    ({"max_model_len": 8}, "--max-model-len 8: give the context length"),
    ({"served_model_name": "my model"}, "without spaces"),
    ({"engine": "triton", "engine_args": ("--max-num-seqs", "4")},
     "apply to --engine vllm"),
])
def test_a_bad_stack_setting_is_refused_with_the_fix(kw, match):
    with pytest.raises(ConfigError, match=match):
        ClusterSpec(**kw)


@pytest.mark.parametrize("kw", [
    {"engine_args": ("--api-key", "s3cret-Z")}, {"engine_args": ("--api-key=s3cret-Z",)},
    {"engine_env": (("VLLM_API_KEY", "s3cret-Z"),)}])
def test_an_api_key_on_the_embedded_replicas_is_refused_with_the_way_and_never_echoed(kw):
    """vLLM's --api-key (or VLLM_API_KEY) makes the replicas Ordeal starts
    refuse its own probes and load (401 at start, seen 2026-12-07): refused
    before anything starts, with the way to qualify a stack behind a key,
    and the key itself is in no message."""
    with pytest.raises(ConfigError) as err:
        ClusterSpec(**kw)
    msg = str(err.value)
    assert "makes every replica refuse requests without the key" in msg
    assert "--cluster external" in msg and "api_key_env" in msg
    assert "s3cret" not in msg


def test_engine_env_pairs_are_checked():
    assert parse_env_pairs(["A=1", "B_2=x=y", "C="], "--engine-env") == (
        ("A", "1"), ("B_2", "x=y"), ("C", ""))
    for bad in ("NOEQUALS", "1A=2", "=v", "A B=1"):
        with pytest.raises(ConfigError, match=f"--engine-env '{bad}': write KEY=VALUE"):
            parse_env_pairs([bad], "--engine-env")


def test_secrets_never_reach_the_record():
    assert redact_argv(["vllm", "--api-key", "s3cret", "--hf-token=abc", "--port", "1"]) == [
        "vllm", "--api-key", "<redacted>", "--hf-token=<redacted>", "--port", "1"]
    assert redact_env((("HF_TOKEN", "abc"), ("OPENAI_API_KEY", "k"), ("OMP_NUM_THREADS", "2"))) \
        == {"HF_TOKEN": "<redacted>", "OPENAI_API_KEY": "<redacted>", "OMP_NUM_THREADS": "2"}


def test_a_missing_model_is_refused_with_the_fix(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="no such directory"):
        resolve_model(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no config.json"):
        resolve_model(str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ConfigError, match="not in the local Hugging Face cache.*never downloads"):
        resolve_model("some-org/some-model")


def test_a_model_name_is_found_in_the_local_hugging_face_cache(tmp_path, monkeypatch):
    # The cache's own layout: models--org--name/refs/main -> snapshots/<rev>/.
    repo = tmp_path / "hub" / "models--some-org--some-model"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    model = resolve_model("some-org/some-model")
    assert model.path == snap and model.source == "hf-cache"
    facts = model.describe()
    assert facts["architectures"] == ["LlamaForCausalLM"] and facts["size_bytes"] > 0
    assert facts["config_sha256"] == model.sha256


def test_user_flags_come_after_ordeals_own_and_env_wins():
    config = ReplicaConfig("my-model", 1024, "/tok", ("--dtype", "bfloat16"),
                           (("VLLM_CPU_KVCACHE_SPACE", "3"),))
    argv = replica_argv("python", Path("/m"), "127.0.0.1", 8000, config)
    assert argv[argv.index("--served-model-name") + 1] == "my-model"
    assert argv[argv.index("--tokenizer") + 1] == "/tok"
    assert argv[argv.index("--max-model-len") + 1] == "1024"
    # vLLM takes the last value of a flag: the user's dtype wins over Ordeal's.
    dtypes = [argv[i + 1] for i, a in enumerate(argv) if a == "--dtype"]
    assert dtypes == ["float32", "bfloat16"]
    assert argv[-2:] == ["--dtype", "bfloat16"]
    assert replica_env({}, config=config)["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert replica_env({})["VLLM_CPU_KVCACHE_SPACE"] == "1"
    default = replica_argv("python", Path("/m"), "127.0.0.1", 8000)
    assert "--tokenizer" not in default
    assert default[default.index("--served-model-name") + 1] == "ordeal-tiny"


def test_router_profiles_and_args():
    ordeal = router_argv("vllm-router", "127.0.0.1", 1, ["http://a"], profile="ordeal")
    stock = router_argv("vllm-router", "127.0.0.1", 1, ["http://a"], profile="stock",
                        extra_args=("--policy", "power_of_two"))
    for flag in ROUTER_PROFILES["ordeal"][::2]:
        assert flag in ordeal
    for flag in ("--health-check-interval-secs", "--cb-timeout-duration-secs"):
        assert flag not in stock
    assert stock[-2:] == ["--policy", "power_of_two"]


def test_bad_stack_options_stop_pytest_before_any_cluster(tmp_path):
    """The plugin refuses at once: no cluster starts, no process is left."""
    for args, message in (
            (["--model", str(tmp_path / "no-model")], "no such directory"),
            (["--engine-args", "--port 1"], "--port cannot be given here"),
            (["--engine-args", "'unclosed"], "cannot split it as a shell would"),
            (["--engine-env", "JUSTAKEY"], "write KEY=VALUE")):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "suites/test_smoke.py", "-p", "no:randomly",
             "-p", "no:cacheprovider", "--runs-dir", str(tmp_path / "runs"), *args],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
            env={**os.environ, "ORDEAL_STATE_DIR": str(tmp_path / "state")})
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and message in out, out[-2000:]
        assert "starting 2 vllm replica" not in out, out[-2000:]
        assert not (tmp_path / "clusters").exists()


# -- against real vLLM ---------------------------------------------------------------


@pytest.mark.cluster
def test_a_second_model_with_the_users_flags_behind_the_stock_router(tmp_path):
    """Another architecture (Qwen2, 3 layers) than the default tiny Llama,
    served under the user's name with the user's engine flags and env,
    behind vllm-router as it ships plus the user's router flags; the record
    names the model and every node's exact command."""
    second = ensure_tiny_model(0, arch="qwen2")
    spec = ClusterSpec(replicas=1, model=str(second.path), served_model_name="team-model",
                       engine_args=("--max-num-seqs", "8"),
                       engine_env=(("VLLM_CPU_KVCACHE_SPACE", "1"), ("TEAM_API_TOKEN", "s3cret")),
                       router_args=("--max-payload-size", "8388608"), router_profile="stock",
                       clock_faults=False)
    with LocalCluster(spec, "stack-test", tmp_path / "logs", progress=lambda m: None) as cluster:
        record = cluster.describe()
        body = json.dumps({"model": "team-model", "prompt": "the quick brown fox",
                           "max_tokens": 8, "temperature": 0}).encode()
        req = urllib.request.Request(cluster.entrypoint.url + "/v1/completions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            answer = json.loads(resp.read())
        with urllib.request.urlopen(cluster.entrypoint.url + "/v1/models", timeout=30) as resp:
            models = [m["id"] for m in json.loads(resp.read())["data"]]
    assert answer["usage"]["completion_tokens"] == 8 and models == ["team-model"]
    assert record["model"]["architectures"] == ["Qwen2ForCausalLM"]
    assert record["model"]["path"] == str(second.path) and record["model"]["source"] == "directory"
    assert record["model"]["config_sha256"] and record["model"]["size_bytes"] > 1_000_000
    stack = record["stack"]
    assert stack["router_profile"] == "stock" and stack["router_profile_flags"] == []
    assert stack["engine_env"] == {"VLLM_CPU_KVCACHE_SPACE": "1", "TEAM_API_TOKEN": "<redacted>"}
    assert stack["ordeal_engine_flags"] == list(ORDEAL_ENGINE_DEFAULTS)
    # The build the replicas run, found at start (engines/vllm/gpus.py): CPU here.
    assert stack["vllm_build"]["distribution"] == "vllm-cpu", stack["vllm_build"]
    assert stack["vllm_build"]["device"] == "cpu" and "replica_gpus" not in stack
    nodes = {n["name"]: n for n in record["nodes"]}
    replica, router = nodes["replica-0"]["command"], nodes["router"]["command"]
    assert replica[replica.index("--model") + 1] == str(second.path)
    assert replica[-2:] == ["--max-num-seqs", "8"]
    assert router[-2:] == ["--max-payload-size", "8388608"]
    assert "--health-check-interval-secs" not in router
    assert "s3cret" not in json.dumps(record)


@pytest.mark.cluster
def test_an_engine_flag_vllm_rejects_comes_back_with_vllms_own_error(tmp_path):
    model = ensure_tiny_model(0)
    node = VllmReplica("bad-flag", Endpoint("127.0.0.1", free_ports(1)[0]), model.path,
                       tmp_path / "bad-flag.log", "bad-flag-run",
                       config=ReplicaConfig(engine_args=("--no-such-flag-ordeal",)))
    node.start()
    try:
        with pytest.raises(NodeNotReady, match="exited with code") as err:
            node.wait_ready(120)
        assert "--no-such-flag-ordeal" in str(err.value)  # vLLM's own message, in the tail
    finally:
        node.stop()
    assert not node.process.is_running()


def test_the_report_shows_the_stack_and_every_command():
    from reports.html import section_head

    summary = {"verdict": "pass", "cluster": {
        "backend": "local", "engine": "vllm",
        "model": {"name": "team/model", "source": "hf-cache", "architectures": ["Qwen2ForCausalLM"],
                  "size_bytes": 2_000_000, "config_sha256": "abcdef0123456789"},
        "stack": {"served_model_name": "team-model", "router_profile": "stock",
                  "engine_args": ["--max-num-seqs", "8"]},
        "nodes": [{"name": "replica-0", "role": "replica", "fingerprint": "vllm-x",
                   "command": ["python", "-m", "vllm", "--max-num-seqs", "8"]}]}}
    page = section_head(summary, None, [])
    assert "team/model" in page and "Qwen2ForCausalLM" in page and "2.0 MB" in page
    assert "router_profile" in page and "stock" in page
    assert "python -m vllm --max-num-seqs 8" in page
