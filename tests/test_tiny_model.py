"""The tiny model is built in a child process, so torch never enters the
harness: the same bytes as a build in the process itself, and a failed build
says why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engines.vllm.model import PROJECT_ROOT, _build_in_child

PROBE = """
import json, sys
from pathlib import Path
from engines.vllm import model
root = Path(sys.argv[1])
if sys.argv[2] == "child":
    m = model.ensure_tiny_model(0, cache_dir=root)
    sha = m.sha256
else:  # the reference: the build in this very process
    root.mkdir(parents=True)
    model._build(root, 0, "llama")
    sha = model._sha256(root / "model.safetensors")
print(json.dumps({"sha256": sha, "torch": "torch" in sys.modules}))
"""


def probe(path: Path, how: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, str(path), how], cwd=PROJECT_ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_model_is_built_in_a_child_with_the_same_bytes(tmp_path):
    child = probe(tmp_path / "cache", "child")
    here = probe(tmp_path / "here", "here")
    assert child["torch"] is False  # the caller never imported torch
    assert here["torch"] is True  # the probe can see it when it is there
    assert child["sha256"] == here["sha256"]


def test_a_failed_build_says_why(tmp_path):
    with pytest.raises(RuntimeError) as e:
        _build_in_child(tmp_path, 0, "no-such-arch")
    assert "exit code 2" in str(e.value) and "invalid choice" in str(e.value)
