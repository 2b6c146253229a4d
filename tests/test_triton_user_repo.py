"""A user's own Triton model repository (``--triton-model-repo``): checked
before anything starts, served as it is, driven through Triton's generate
extension, judged like any run.

The real part serves docs/examples/triton-model-repo (word-llm, a model
that is not Ordeal's and follows the LLM backends' convention) on two real
CPU Triton replicas behind the real HAProxy. A model off the convention is
driven on tests/test_triton_engine.py's cluster (no cluster of its own).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from conftest import triton_cluster_of
from engines.triton.adapter import TritonEngine
from engines.triton.generate_client import _take, chat_text, generate_body
from engines.triton.user_repo import read_user_repository
from load.plan import PlannedRequest
from load.spec import WorkloadSpec
from ordeal.config import ClusterSpec, ConfigError
from reports.run_dir import RunDir
from runs.run import OrdealRun

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "triton-model-repo"


def model_dir(repo: Path, name: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text('backend: "python"\n')


# -- the repository, before anything starts -----------------------------------------------------

def test_a_missing_repository_is_refused_with_what_to_give(tmp_path):
    with pytest.raises(ConfigError, match="no such directory.*docs/examples/triton-model-repo"):
        read_user_repository(tmp_path / "nope", None)


def test_a_repository_without_models_is_refused(tmp_path):
    (tmp_path / "notes").mkdir()
    with pytest.raises(ConfigError, match="holds no model"):
        read_user_repository(tmp_path, None)


def test_several_models_need_a_name_and_a_wrong_name_lists_them(tmp_path):
    model_dir(tmp_path, "llm")
    model_dir(tmp_path, "tokenizer")
    with pytest.raises(ConfigError, match=r"holds 2 models \(llm, tokenizer\).*--served-model-name"):
        read_user_repository(tmp_path, None)
    with pytest.raises(ConfigError, match=r"no model 'other'.*llm, tokenizer"):
        read_user_repository(tmp_path, "other")
    assert read_user_repository(tmp_path, "llm").model == "llm"


def test_the_digest_follows_the_files_and_ignores_caches(tmp_path):
    model_dir(tmp_path, "llm")
    first = read_user_repository(tmp_path, None).digest
    (tmp_path / "llm" / "__pycache__").mkdir()
    (tmp_path / "llm" / "__pycache__" / "m.pyc").write_bytes(b"x")
    assert read_user_repository(tmp_path, None).digest == first
    (tmp_path / "llm" / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 0\n')
    assert read_user_repository(tmp_path, None).digest != first


def test_the_option_is_triton_s_and_the_engine_reads_it_at_construction(tmp_path):
    with pytest.raises(ConfigError, match="--triton-model-repo applies to --engine triton"):
        ClusterSpec(engine="vllm", triton_model_repo=str(EXAMPLE))
    spec = ClusterSpec(engine="triton", triton_model_repo=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="no such directory"):
        TritonEngine(spec)
    engine = TritonEngine(ClusterSpec(engine="triton", triton_model_repo=str(EXAMPLE)))
    assert engine.served_model_name == "word-llm"
    assert "sequence_consistent" not in {c.name for c in engine.checkers()}
    assert "ordeal-seq" in engine.unsupported("lsn_jump")
    assert engine.settings(None)["driven_model"] == "word-llm"


# -- what goes out, for the model's declared inputs ---------------------------------------------

def planned(endpoint="completions", history=()):
    return PlannedRequest(0, 0.0, endpoint, True, "hello", 7, 0.0, False, history)


def test_the_body_carries_only_what_the_model_declares():
    assert generate_body({"text_input"}, planned(), True) == {"text_input": "hello"}
    assert generate_body({"text_input", "stream", "max_tokens", "temperature"}, planned(),
                         True) == {"text_input": "hello", "stream": True, "max_tokens": 7,
                                   "temperature": 0.0}
    # The vLLM backend's convention: sampling parameters as one JSON string.
    body = generate_body({"text_input", "stream", "sampling_parameters",
                          "exclude_input_in_output"}, planned(), False)
    assert json.loads(body.pop("sampling_parameters")) == {"max_tokens": 7, "temperature": 0.0}
    assert body == {"text_input": "hello", "stream": False, "exclude_input_in_output": True}


def test_a_chat_turn_carries_its_history():
    req = planned("chat", (("user", "first question"), ("assistant", "first answer")))
    assert chat_text(req) == ("user: first question\nassistant: first answer\n"
                              "user: hello\nassistant:")
    assert generate_body({"text_input"}, req, True)["text_input"] == chat_text(req)


def test_a_response_is_text_output_or_a_said_failure():
    parts: list[str] = []
    assert _take('{"text_output": " a"}', parts) is None and parts == [" a"]
    assert "error from the server: boom" in _take('{"error": "boom"}', parts)
    assert "no text_output" in _take('{"token_ids": [1]}', parts)
    assert "not JSON" in _take("data", parts)


# -- real Triton ---------------------------------------------------------------------------------

needs_cluster = pytest.mark.cluster


@pytest.fixture(scope="module")
def user_cluster(tmp_path_factory):
    spec = ClusterSpec(engine="triton", replicas=2, triton_model_repo=str(EXAMPLE))
    with triton_cluster_of(spec, "test-triton-user",
                           tmp_path_factory.mktemp("triton-user")) as cluster:
        yield cluster


@needs_cluster
def test_the_users_repository_is_served_driven_and_judged(user_cluster, tmp_path):
    # Served as it is: the replicas hold the user's model and none of ours.
    node = user_cluster.replicas()[0]
    req = urllib.request.Request(f"{node.endpoint.url}/v2/repository/index", data=b"{}")
    with urllib.request.urlopen(req, timeout=10) as r:
        assert [m["name"] for m in json.loads(r.read())] == ["word-llm"]

    run = OrdealRun(RunDir.create(tmp_path, "user"), "user", user_cluster,
                    progress=lambda m: None)
    run.load(WorkloadSpec(duration_s=8, rate=8, seed=3, chat_share=0.3, stream_share=0.5))
    results = {r.name: r for r in run.check()}
    summary = run.finish()
    assert summary["verdict"] == "pass", [r.to_dict() for r in results.values()
                                          if r.valid is not True]
    consistency = results["engine_consistency"].details["checked"]
    assert consistency["generate+generate_stream"]["model"] == "word-llm", consistency
    assert consistency["generate+generate_stream"]["server_ran"] >= run.expected_requests(0.6)
    assert results["canary_determinism"].details["canaries"] > 0
    stack = summary["cluster"]["stack"]
    assert stack["driven_model"] == "word-llm" and stack["models"] == ["word-llm"], stack
    assert stack["repository_digest"] == read_user_repository(EXAMPLE, None).digest

    oks = [json.loads(line) for line in run.run_dir.history_path.open()
           if '"type":"ok"' in line and '"process":"nemesis"' not in line]
    assert {o["f"] for o in oks} == {"generate", "generate_stream"}
    # Which replica answered comes from the router (the model does not say).
    assert {o["value"]["node"] for o in oks} == {"replica-0", "replica-1"}
    # Streams arrive as the server sends them (the router forwards each
    # event: word-llm spends ~3 ms per word, so a stream of several words
    # has a gap between its events).
    gaps = [max(o["value"]["itl_ms"]) for o in oks
            if o["f"] == "generate_stream" and len(o["value"].get("itl_ms", [])) >= 4]
    assert gaps and max(gaps) >= 1.0, gaps
    assert all(o["value"]["output_tokens"] for o in oks if o["f"] == "generate_stream")
