"""``python -m ordeal init``: a commented starter stack file (ordeal.toml,
read by ordeal/stack_file.py) for the kind of stack a team qualifies, and
the CI lines that run it. Pure text; ``ordeal/__main__.py`` writes it."""

from __future__ import annotations

KINDS = ("embedded", "own-model", "own-image", "external")

COMMON = '''# Ordeal's stack file: every run option this team sets, checked in beside the code.
# Keys are pytest's long options without "--" (pytest --help, group "ordeal");
# an option on the command line wins over this file. summary.json records what
# this file set and its sha256 (stack_file). Secrets: name a variable, never a value.
'''

BODIES = {
    "embedded": '''
# The embedded stack: Ordeal starts 2 vLLM CPU replicas of its tiny model behind
# vllm-router on this machine. Nothing is required; these are the defaults.
cluster = "local"
engine = "vllm"
replicas = 2
load-duration = "40s"
load-rate = 8
# slo = "slo.toml"                 # SLO targets (README: Invariants)
# known-findings = "auto"          # the shipped file for the embedded stack
''',
    "own-model": '''
# Your model and flags on Ordeal's replicas and router (README: Qualify your own stack).
cluster = "local"
engine = "vllm"
model = "/models/your-model"            # a local directory (or a name in the HF cache)
served-model-name = "your-model"
replicas = 2
engine-args = "--enable-prefix-caching"  # passed to every vLLM replica as they are
# max-model-len = 4096                  # Ordeal's own option (it sizes the workload too)
# router-args = "--policy round_robin"
# engine-env = ["HF_HOME=/models/hf"]   # KEY=VALUE for every replica; no secrets here
# replica-gpus = "auto"                 # on a GPU machine: one GPU each, or shared
# workload = "workload.toml"            # your prompts and output lengths
# slo = "slo.toml"
known-findings = "none"                 # the shipped file fits only the embedded stack
''',
    "own-image": '''
# Your own serving image: each node a container on a private Docker network.
cluster = "docker"
docker-image = "your-team/vllm-image:tag"   # already in the local Docker engine
docker-engine = "image"        # the image's own vLLM; only the model is mounted
model = "/models/your-model"
served-model-name = "your-model"
replicas = 2
# docker-memory = "8g"
# docker-gpus = 1
known-findings = "none"
''',
    "external": '''
# A deployment Ordeal did not start (a Kubernetes service, a hand-started stack):
# the target file names its entrypoint, replicas, API key variable and the fault
# hooks (kubectl delete pod, kubectl exec ... kill -STOP, ...): README, "Test a
# running deployment".
cluster = "external"
target = "target.toml"
# allow-target = ["10.0.0.0/24"]   # beyond loopback, only what you name
# require-judged = "failover,fault_slo"   # no pass unless these were judged
known-findings = "none"
''',
}

CI = '''# CI (any runner with Python >= 3.11), from the directory of ordeal.toml:
#   pytest /path/to/ordeal/suites -m smoke   # (bash .ci/setup there first: its .venv)
# A pass, fail or unknown verdict is pytest's exit status; reports/runs/ keeps
# each run's summary.json, history and report.html: keep it as an artifact.
'''


def starter(kind: str) -> str:
    if kind not in BODIES:
        raise ValueError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    return COMMON + BODIES[kind] + "\n" + CI
