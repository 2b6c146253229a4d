"""Run configuration: plain, typed, validated up front with errors that say
what was wrong and what to do. Nothing here starts a process."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
#: One part of a compound duration (``1h30m``, ``2m30s``, ``1d12h``).
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def state_dir() -> Path:
    """Where the fault ledger and process records live: $ORDEAL_STATE_DIR, or
    ~/.cache/ordeal/state. One place, read by every layer."""
    base = os.environ.get("ORDEAL_STATE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ordeal", "state"
    )
    return Path(base)


class ConfigError(ValueError):
    """A bad setting. The message names the setting, the value and a fix."""


def parse_duration(text: str | float | int, setting: str = "duration") -> float:
    """'90', '90s', '5m', '72h', '1.5h', '1h30m' -> seconds."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        m = _DURATION.match(str(text))
        compact = str(text).strip().replace(" ", "")
        parts = _PART.findall(compact)
        if m:
            seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
        elif parts and "".join(n + u for n, u in parts) == compact:
            # Each unit once, largest first: "1h30m", not "30m1h" or "1m1m".
            order = [list(_UNIT_S).index(u) for _, u in parts]
            if order != sorted(order, reverse=True) or len(set(order)) != len(order):
                raise ConfigError(f"{setting}: {text!r}: give each unit once, largest first, "
                                  "e.g. 1h30m or 2m30s")
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
        else:
            raise ConfigError(
                f"{setting}: cannot read {text!r} as a duration; "
                "write a number with an optional unit, e.g. 90, 90s, 5m, 72h, 1h30m"
            )
    if seconds <= 0:
        raise ConfigError(f"{setting}: must be more than zero, got {text!r}")
    return seconds


BACKENDS = ("local", "docker", "ray", "external")
#: How a --cluster docker replica gets its engine (see ClusterSpec.docker_engine).
DOCKER_ENGINES = ("mounted", "image")
#: --replica-cpus: where a vLLM replica's processes may run (ClusterSpec.replica_cpus).
REPLICA_CPUS = ("own", "shared")
#: The router's settings Ordeal may add (engines/vllm/nodes.py ROUTER_PROFILES):
#: "ordeal" (fast health checks and circuit breaker, so a short run sees a
#: recovery) or "stock" (the router as it ships: none of them).
ROUTER_PROFILES = ("ordeal", "stock")
#: Replica flags Ordeal sets itself and needs as they are: given again in
#: --engine-args, they would break the wiring (ports, the node header).
RESERVED_ENGINE_FLAGS = ("--host", "--port", "--middleware", "--model",
                         "--served-model-name", "--tokenizer", "--max-model-len")
#: What makes vLLM refuse every /v1 request without a key. The replicas
#: Ordeal starts serve its own readiness probe (a completion), load and fault
#: probes, which carry no key: each would end 401, so these are refused with
#: the way to qualify a stack behind a key (never echoing the key).
API_KEY_FLAGS = ("--api-key",)
API_KEY_ENV = ("VLLM_API_KEY",)
API_KEY_WHY = ("makes every replica refuse requests without the key, and the replicas Ordeal "
               "starts are asked by its own readiness probe, load and fault probes, which send "
               "none (the cluster would fail its start with 401). To qualify a stack behind "
               "an API key, start it yourself and run with --cluster external and a target "
               "file whose api_key_env names the variable that holds the key (docs/external.md)")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Environment names whose values are never written anywhere (summary, logs).
SECRET_ENV = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
#: Flags whose value is a secret, by whole words of the flag's name: a
#: substring test hid ``--max-num-batched-tokens 4096`` and
#: ``--tokenizer /m`` and broke the replay line; ``--api-key``,
#: ``--hf-token``, ``--password``, ``--auth-token`` match.
SECRET_FLAG = re.compile(r"(?:^|[-_.])(?:token|key|apikey|secret|password|passwd|passphrase|"
                         r"credentials?|auth|authorization|bearer)(?:$|[-_.])", re.IGNORECASE)


def redact_env(env: dict[str, str] | tuple[tuple[str, str], ...]) -> dict[str, str]:
    """``env`` as a report may show it: secret-looking values replaced."""
    items = env.items() if isinstance(env, dict) else env
    return {k: ("<redacted>" if SECRET_ENV.search(k) else v) for k, v in items}


def read_input(p: Path, where: str, fix: str) -> bytes:
    """The bytes of a file the user named; a ``ConfigError`` that names it
    (``where``) and, when it is missing, what to give instead (``fix``)."""
    try:
        return p.read_bytes()
    except FileNotFoundError as e:
        raise ConfigError(f"{where}: no such file; {fix}") from e
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e})") from e


REDACTED = "<redacted>"
#: ``Name: value`` in one argument (a header given to curl -H, say).
_HEADER = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*)\s*:\s*\S")
#: ``scheme://user:password@`` in a URL.
_URL_CREDENTIALS = re.compile(r"(\w+://)[^/\s:@]+:[^/\s@]*@")
#: A flag: a dash, then no space before any ``=`` (an argument with a space
#: before its ``=`` is a command line in one argument, not a flag).
_FLAG = re.compile(r"^-[^\s=]*$")
#: Where a flag's value ends and more flags begin, in one argument.
_MORE_FLAGS = re.compile(r"\s+(?=-)")
#: A shell variable's name in place of a value (``--token=$KUBE_TOKEN``):
#: no secret, and shown, so a hook's command still says where its secret
#: comes from.
_REFERENCE = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")
#: Nested command lines deeper than this are hidden whole where they look secret.
_MAX_DEPTH = 6


def redact_argv(argv: list[str] | tuple[str, ...], _depth: int = 0) -> list[str]:
    """A command line as a report may show it, argument for argument: the
    value of a secret-looking flag (``--api-key X``, ``--hf-token=X``) and
    of a secret-looking ``NAME=value`` or ``Name: value`` replaced, and the
    same inside any argument that is itself a command line
    (``--engine-args "--api-key X --dtype bfloat16"``), which is split as a
    shell would, redacted and joined again. Everything else stays as it is,
    so the line still says what ran (``--seed 7`` keeps its 7)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            hide_next = False
            if not _FLAG.match(arg.partition("=")[0]):  # a flag of its own: no value to hide
                out.append(arg if _REFERENCE.fullmatch(arg) else REDACTED)
                continue
        name, eq, value = arg.partition("=")
        if _FLAG.match(name):
            secret = SECRET_FLAG.search(name.lstrip("-")) is not None
            if not eq:
                out.append(arg)
                hide_next = secret
            elif secret:
                out.append(f"{name}={_hidden(value, _depth)}")
            else:
                out.append(f"{name}={redact_value(value, _depth)}")
            continue
        out.append(redact_value(arg, _depth))
    return out


def _hidden(value: str, _depth: int) -> str:
    """The value of a secret flag's ``--name=value`` or of a secret
    ``NAME=value``, hidden (a ``$NAME`` reference stays: it is no secret).
    Where the argument goes on with more flags after a space
    (``"--api-key=X --dtype bfloat16"``, one argument of a command line
    given whole), those stay, redacted on their own; everything up to them
    is hidden, spaces or not."""
    if _REFERENCE.fullmatch(value):
        return value
    more = _MORE_FLAGS.search(value)
    if more is None:
        return REDACTED
    return f"{REDACTED}{more.group(0)}{redact_command(value[more.end():], _depth + 1)}"


def redact_value(text: str, _depth: int = 0) -> str:
    """One argument (or a flag's value) as a report may show it: a
    secret-looking ``NAME=value`` (an environment pair) or ``Name: value``
    (a header) hides its value, credentials in a URL are hidden, and an
    argument with spaces or quotes in it is taken for a command line and
    redacted argument by argument (``redact_argv``)."""
    text = _URL_CREDENTIALS.sub(rf"\1{REDACTED}@", text)
    name, eq, value = text.partition("=")
    if _FLAG.match(name):  # a flag as a value: --engine-args=--api-key=X
        return redact_argv([text], _depth)[0]
    if eq and _ENV_KEY.match(name):
        if not SECRET_ENV.search(name):
            return f"{name}={redact_value(value, _depth)}"
        return f"{name}={_hidden(value, _depth)}"
    header = _HEADER.match(text)
    if header and SECRET_ENV.search(header.group(1)):
        return f"{header.group(1)}: {REDACTED}"
    if not any(c.isspace() or c in "'\"" for c in text):
        return text
    return redact_command(text, _depth + 1)


def redact_command(text: str, _depth: int = 0) -> str:
    """A shell command line (a hook's command, an ``--engine-args`` value)
    as a report may show it: split as a shell would, redacted
    (``redact_argv``) and joined again; the text as it was when nothing in
    it is secret. One that cannot be split, or nests too deep, is shown
    whole only when nothing secret-looking is in it at all."""
    try:
        parts = shlex.split(text)
    except ValueError:
        parts = None
    if parts is None or _depth > _MAX_DEPTH:
        return text if not SECRET_ENV.search(text) else (
            f"{REDACTED} (a command line that cannot be split as a shell would, with a "
            "secret-looking word in it)")
    shown = redact_argv(parts, _depth)
    return text if shown == parts else shlex.join(shown)


def parse_env_pairs(values: list[str] | tuple[str, ...], option: str) -> tuple[tuple[str, str], ...]:
    """``["KEY=VALUE", ...]`` -> pairs; a malformed one names itself and the fix."""
    out = []
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise ConfigError(f"{option} {raw!r}: write KEY=VALUE with KEY a shell variable "
                              "name, e.g. VLLM_CPU_KVCACHE_SPACE=2")
        out.append((key, value))
    return tuple(out)
#: Inference engines a cluster can run (engines/base.py has their adapters).
ENGINES = ("vllm", "triton")


@dataclass(frozen=True)
class ClusterSpec:
    backend: str = "local"
    engine: str = "vllm"
    replicas: int = 2
    model_seed: int = 0
    ready_timeout_s: float = 300.0
    host: str = "127.0.0.1"
    # Put Ordeal's fault proxy on every link (client-router, router-replica-i)
    # so link faults (latency, bandwidth, resets, HTTP/SSE faults) can act.
    fault_proxy: bool = True
    # Start replicas under libfaketime (wall clock only, ~0% overhead
    # measured) so clock_drift can move their clocks.
    clock_faults: bool = True
    # --cluster docker only: the image every node runs (None: the suite's
    # own base image, built here with debootstrap), and per-container limits
    # (memory as Docker writes it, e.g. "4g"; CPUs as a fraction; GPUs for
    # an engine with the NVIDIA container runtime).
    docker_image: str | None = None
    docker_memory: str | None = None
    docker_cpus: float | None = None
    docker_gpus: int = 0
    # vLLM replicas on --cluster local or docker: "own" (default): each
    # replica's whole process tree runs on its own core(s) (engines.vllm.cpus),
    # as replicas on separate machines would; "shared": every process may
    # run on every core (only the compute threads are bound).
    replica_cpus: str = "own"
    # The GPU build of vLLM (engines/vllm/gpus.py): each replica's GPU,
    # "auto" (one each when there are enough, else shared), "shared" (all on
    # GPU 0) or indices "0,1"; and the interpreter the replicas and the
    # router run (None: the harness's own).
    replica_gpus: str = "auto"
    vllm_python: str | None = None
    # --cluster docker only: "mounted" (default): the base image runs this
    # machine's Python and vLLM, bind-mounted read-only; "image": the image's
    # own entrypoint and vLLM (the vLLM OpenAI-server image's convention),
    # with only the model (read-only) and the log directory mounted.
    docker_engine: str = "mounted"
    # --cluster ray only: join the Ray cluster at this GCS address (host:port,
    # loopback or a network named with --allow-target) instead of starting
    # one; else the number of simulated worker nodes started here (0: one
    # per replica, at least two).
    ray_address: str | None = None
    ray_nodes: int = 0
    # The user's stack (issue 22). ``model``: a local Hugging Face directory
    # or a name already in the local Hugging Face cache (resolved, never
    # downloaded, by engines.vllm.model.resolve_model); None: the tiny
    # model made here. The rest go on every replica's or the router's
    # command line; everything is recorded in summary.json.
    model: str | None = None
    served_model_name: str = "ordeal-tiny"
    tokenizer: str | None = None
    max_model_len: int = 512
    engine_args: tuple[str, ...] = ()
    engine_env: tuple[tuple[str, str], ...] = ()
    router_args: tuple[str, ...] = ()
    router_profile: str = "ordeal"
    # --engine triton only: serve this model repository (as it is, on every
    # replica) instead of Ordeal's generated models, and drive its model
    # through Triton's generate extension (engines.triton.user_repo).
    triton_model_repo: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"--cluster: unknown backend {self.backend!r}; available: {', '.join(BACKENDS)}"
            )
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine: unknown engine {self.engine!r}; available: "
                              f"{', '.join(ENGINES)}")
        if self.engine != "vllm" and self.backend != "local":
            raise ConfigError(f"--engine {self.engine} runs on --cluster local only for now "
                              f"(this run: --cluster {self.backend}); use --engine vllm there")
        if not 1 <= self.replicas <= 64:
            raise ConfigError(
                f"--replicas: {self.replicas} is out of range; use 1..64 "
                "(each local vLLM replica needs about 3 GB of memory)"
            )
        if self.ready_timeout_s <= 0:
            raise ConfigError("--ready-timeout: must be more than zero seconds")
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            raise ConfigError(
                f"host {self.host!r}: the local backend binds loopback only, "
                "so that no traffic leaves the machine"
            )
        if self.docker_cpus is not None and self.docker_cpus <= 0:
            raise ConfigError(f"--docker-cpus {self.docker_cpus}: give a number of CPUs above "
                              "zero (e.g. 1.5), or leave it out for no limit")
        if self.replica_cpus not in REPLICA_CPUS:
            raise ConfigError(f"--replica-cpus {self.replica_cpus!r}: use one of "
                              f"{', '.join(REPLICA_CPUS)}")
        if self.replica_gpus not in ("auto", "shared") and not all(
                x.strip().isdigit() for x in self.replica_gpus.split(",")):
            raise ConfigError(f"--replica-gpus {self.replica_gpus!r}: give auto, shared, or GPU "
                              "indices such as 0,1 (replica i gets the i-th, round robin)")
        if self.vllm_python is not None and "/" not in self.vllm_python:
            found = shutil.which(self.vllm_python)  # a name on PATH, as a shell finds it
            object.__setattr__(self, "vllm_python", found or self.vllm_python)
        if self.vllm_python is not None and not os.access(self.vllm_python, os.X_OK):
            raise ConfigError(f"--vllm-python {self.vllm_python}: not an executable file; give "
                              "the python of the environment vLLM is installed in (e.g. "
                              "/opt/vllm/.venv/bin/python)")
        if self.vllm_python is not None and self.backend != "local":
            raise ConfigError(f"--vllm-python applies to --cluster local (this run: "
                              f"{self.backend})")
        if self.docker_gpus < 0:
            raise ConfigError(f"--docker-gpus {self.docker_gpus}: give 0 or more")
        if self.backend != "ray" and (self.ray_address or self.ray_nodes):
            raise ConfigError("--ray-address/--ray-nodes apply to --cluster ray only "
                              f"(this run: {self.backend})")
        if self.ray_nodes < 0 or self.ray_nodes > 16:
            raise ConfigError(f"--ray-nodes {self.ray_nodes}: give 1..16 simulated nodes, "
                              "or 0 for one per replica (at least two)")
        if self.ray_address is not None and (":" not in self.ray_address
                                             or not self.ray_address.rsplit(":", 1)[1].isdigit()):
            raise ConfigError(f"--ray-address {self.ray_address!r}: give the head's GCS address "
                              "as HOST:PORT, e.g. 127.0.0.1:6379")
        if self.router_profile not in ROUTER_PROFILES:
            raise ConfigError(f"--router-profile {self.router_profile!r}: use one of "
                              f"{', '.join(ROUTER_PROFILES)} (docs/own-stack.md)")
        if not 16 <= self.max_model_len <= 10_000_000:
            raise ConfigError(f"--max-model-len {self.max_model_len}: give the context length "
                              "in tokens, at least 16")
        if not self.served_model_name.strip() or any(c.isspace() for c in self.served_model_name):
            raise ConfigError(f"--served-model-name {self.served_model_name!r}: give a name "
                              "without spaces, as clients will send it")
        for flag in self.engine_args:
            name = flag.split("=", 1)[0]
            if name in API_KEY_FLAGS:
                raise ConfigError(f"--engine-args: {name} {API_KEY_WHY}")
            if name in RESERVED_ENGINE_FLAGS:
                own = {"--model": "--model", "--served-model-name": "--served-model-name",
                       "--tokenizer": "--tokenizer", "--max-model-len": "--max-model-len"}
                fix = (f"use Ordeal's own option {own[name]} instead" if name in own else
                       "Ordeal sets it to wire the replica to the fault proxy and the router")
                raise ConfigError(f"--engine-args: {name} cannot be given here: {fix}")
        for key, _value in self.engine_env:
            if key in API_KEY_ENV:
                raise ConfigError(f"--engine-env: {key} (vLLM's --api-key) {API_KEY_WHY}")
        if self.engine != "vllm" and (self.model or self.engine_args or self.engine_env
                                      or self.router_args or self.tokenizer
                                      or self.router_profile != "ordeal"):
            raise ConfigError(f"--model/--tokenizer/--engine-args/--engine-env/--router-args/"
                              f"--router-profile apply to --engine vllm (this run: --engine "
                              f"{self.engine}; give Triton a repository with "
                              "--triton-model-repo)")
        if self.triton_model_repo and self.engine != "triton":
            raise ConfigError(f"--triton-model-repo applies to --engine triton (this run: "
                              f"--engine {self.engine}); for vLLM name the model with --model")
        if self.docker_engine not in DOCKER_ENGINES:
            raise ConfigError(f"--docker-engine {self.docker_engine!r}: use one of "
                              f"{', '.join(DOCKER_ENGINES)}")
        if self.docker_engine == "image" and not self.docker_image:
            raise ConfigError("--docker-engine image runs the image's own vLLM: name the image "
                              "with --docker-image (the suite's base image has no vLLM; "
                              "`python -m clusters.docker_engine_image` builds one that has)")
        if self.backend != "docker" and self.docker_engine != "mounted":
            raise ConfigError(f"--docker-engine applies to --cluster docker only (this run: "
                              f"{self.backend})")
        if self.backend != "docker" and (self.docker_image or self.docker_memory
                                         or self.docker_cpus or self.docker_gpus):
            raise ConfigError("--docker-image/--docker-memory/--docker-cpus/--docker-gpus "
                              f"apply to --cluster docker only (this run: {self.backend})")
