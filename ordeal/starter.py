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
# slo = "slo.toml"                 # SLO targets (docs/invariants.md)
# known-findings = "auto"          # the shipped file for the embedded stack
''',
    "own-model": '''
# Your model and flags on Ordeal's replicas and router (docs/own-stack.md).
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
# hooks (kubectl delete pod, kubectl exec ... kill -STOP, ...): docs/external.md,
# "The target file".
cluster = "external"
target = "{target}"
# allow-target = ["10.0.0.0/24"]   # beyond loopback, only what you name
# require-judged = "failover,fault_slo"   # no pass unless these were judged
known-findings = "none"
''',
}

CI = '''# CI (any runner with Python >= 3.11), from the directory of ordeal.toml:
#   pip install "ordeal[vllm]"    # the light core alone for --cluster external
#   ordeal smoke                  # = pytest --pyargs suites -m smoke; ordeal endurance
# A pass, fail or unknown verdict is pytest's exit status; reports/runs/ keeps
# each run's summary.json, history and report.html: keep it as an artifact.
'''


def starter(kind: str, target: str = "target.toml") -> str:
    """The stack file for ``kind``; ``target`` is the target file it names
    (the external kind)."""
    if kind not in BODIES:
        raise ValueError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    return COMMON + BODIES[kind].replace("{target}", target) + "\n" + CI


TARGET = '''# The deployment Ordeal reaches and never starts (ordeal/target.py has every key).
entrypoint = "{url}"
model = "{model}"                  # the served model name clients send
entrypoint_health_path = "/health"
# api_key_env = "ORDEAL_TARGET_API_KEY"   # the variable that holds the key, never the key
fault_proxy = true                 # faults on the client link, through Ordeal's proxy
# [[replica]]                      # each replica, to judge failover and health
# name = "replica-0"
# url = "http://10.0.0.11:8000"
# [[hook]]                         # how to act on a node, per fault kind
# kind = "process_kill"
# node = "replica-0"
# inject = "kubectl -n llm delete pod vllm-0 --wait=false"
# heal = "kubectl -n llm rollout status deploy/vllm --timeout=300s"
'''


def target_file(url: str, model: str | None) -> str:
    """A starter target file for the deployment at ``url`` (an http or https
    URL with a host; anything else is a ValueError that says so)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--external {url!r}: give the entrypoint as http[s]://host:port")
    if any(c in url for c in '"\\\n'):
        raise ValueError(f"--external {url!r}: quotes, backslashes and newlines do not belong "
                         "in a URL")
    name = model or "your-model"
    if any(c in name for c in '"\\\n'):
        raise ValueError(f"--model {name!r}: quotes, backslashes and newlines do not belong "
                         "in a model name")
    return TARGET.replace("{url}", url).replace("{model}", name)
