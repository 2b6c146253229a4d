"""A workload from a file: ``--workload FILE.toml`` (issue 22).

The file describes the shape of the load; the suite decides how long it runs,
its seed and the model. Every table and key is optional; what the file leaves
out keeps the suite's value, or ``WorkloadSpec``'s default. The schema
(docs/examples/workloads/README.md explains each key)::

    description = "free text for humans"     # optional, recorded as is

    [arrival]
    process = "poisson"    # poisson | gamma | constant | closed (required here)
    rate = 8.0             # requests/s (poisson, gamma, constant)
    burstiness = 1.0       # gamma only: vllm bench serve's --burstiness (shape)
    users = 4              # closed only: concurrent clients

    [prompt]
    tokens = { dist = "uniform", min = 4, max = 32 }

    [output]
    tokens = { dist = "lognormal", mean = 300, sigma = 0.3, min = 200, max = 400 }

    [mix]
    chat_share = 0.3       # share of requests sent to /v1/chat/completions
    stream_share = 0.8     # share of requests that stream
    canary_every = 10      # one greedy canary in each n requests (0: none)
    temperature = 0.7

    [conversation]
    turns = 1              # user turns per chat conversation

    [prefix]
    groups = 0             # groups of requests sharing a prefix (0: none)
    tokens = 0             # words of each group's prefix

    [dataset]
    path = "prompts.jsonl" # relative to this file; {"prompt"} or ShareGPT lines

    [client]
    timeout_s = 30.0       # per request
    max_in_flight = 256    # open loop: past this, arrivals wait

Token distributions (``tokens = ...``): ``16`` (fixed), ``{dist = "fixed",
value = 16}``, ``{dist = "uniform", min, max}``, ``{dist = "normal", mean,
stddev, min?, max?}``, ``{dist = "lognormal", mean, sigma, min?, max?}``;
``min`` defaults to 1, ``max`` to no clamp. Prompt lengths are counted in
words of ``load.spec.WORDS`` (the client has no tokenizer): about one
token each in common tokenizers, 2-6 (3.7 on average) in the tiny model's
BPE. Output lengths are exact (``max_tokens``).

Precedence, lowest first: ``WorkloadSpec``'s defaults, then the suite's base
(``WorkloadFile.spec(**base)``), then the file. The file cannot set
``duration_s``, ``seed``, ``model`` or ``return_token_ids``: those are always
the suite's. A process sets the loop: poisson/gamma/constant an open loop
(poisson is gamma with burstiness 1.0), closed a closed loop of ``users``.

Every bad input is a ``ConfigError`` naming the file, the key and the fix,
raised by ``read_workload_file`` before anything starts: a missing file,
TOML that does not parse, an unknown table or key (with the accepted ones), a
wrong type, an impossible distribution (mean <= 0, min > max, sigma <= 0,
mean outside min..max), a share outside 0..1, a rate <= 0, an unknown
process, and a dataset that is missing or has a bad line (its number named).
"""

from __future__ import annotations

import hashlib
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from load.spec import (
    DISTRIBUTION_PARAMS,
    DISTRIBUTIONS,
    Distribution,
    WorkloadSpec,
    describe_spec,
    load_dataset,
)
from ordeal.config import ConfigError, read_input

__all__ = ["PROCESSES", "SCHEMA", "WorkloadFile", "describe_spec", "read_workload_file"]

PROCESSES = ("poisson", "gamma", "constant", "closed")
#: Every table and its keys; ``description`` is the one top-level key.
SCHEMA: dict[str, tuple[str, ...]] = {
    "arrival": ("process", "rate", "burstiness", "users"),
    "prompt": ("tokens",),
    "output": ("tokens",),
    "mix": ("chat_share", "stream_share", "canary_every", "temperature"),
    "conversation": ("turns",),
    "prefix": ("groups", "tokens"),
    "dataset": ("path",),
    "client": ("timeout_s", "max_in_flight"),
}
_TOP = ("description", *SCHEMA)
#: What the suite always decides: the file cannot set them.
SUITE_ONLY = ("duration_s", "seed", "model", "return_token_ids")


@dataclass(frozen=True)
class WorkloadFile:
    """A read and checked workload file: ``overrides`` maps WorkloadSpec
    fields to the file's values (a dataset already loaded)."""

    path: str
    sha256: str
    overrides: dict[str, Any] = field(hash=False)
    description: str | None = None

    def spec(self, **base: Any) -> WorkloadSpec:
        """The effective spec: defaults < ``base`` (the suite's fields, e.g.
        duration_s, rate, seed, timeout_s) < the file. ``duration_s`` (and
        seed, model, return_token_ids) always come from ``base``: the file
        cannot set them."""
        merged = {**base, **self.overrides}
        try:
            return WorkloadSpec(**merged)
        except ConfigError as e:
            raise ConfigError(f"workload file {self.path}: {e}") from None

    def describe(self, **base: Any) -> dict[str, Any]:
        """JSON-ready, for summary.json: the file, its sha256, the spec
        fields it set, and the effective workload with ``base``."""
        return {"file": self.path, "sha256": self.sha256, "description": self.description,
                "set_by_file": sorted(self.overrides),
                "effective": describe_spec(self.spec(**base))}


def read_workload_file(path: str | Path) -> WorkloadFile:
    """Read and check a workload file (schema in the module docstring)."""
    p = Path(path)
    where = f"workload file {p}"
    raw = read_input(p, where, "give the path of a TOML workload file "
                               "(docs/examples/workloads/ has examples) or leave --workload "
                               "out for the default workload")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{where}: cannot read it as TOML ({e}); "
                          "docs/examples/workloads/default.toml shows the shape") from e
    _known(data, _TOP, where, "at the top level")
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        raise ConfigError(f"{where}: description must be a string, got {description!r:.80}")
    tables: dict[str, dict[str, Any]] = {}
    for name, keys in SCHEMA.items():
        if name not in data:
            continue
        table = data[name]
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: {name} must be a table ([{name}]), "
                              f"got {table!r:.80}")
        _known(table, keys, where, f"in [{name}]")
        tables[name] = table

    out: dict[str, Any] = {}
    if "arrival" in tables:
        out.update(_arrival(tables["arrival"], f"{where}: [arrival]"))
    for name, words, dist in (("prompt", "prompt_words", "prompt_tokens"),
                              ("output", "max_tokens", "output_tokens")):
        if "tokens" in tables.get(name, {}):
            d = _distribution(tables[name]["tokens"], f"{where}: [{name}] tokens")
            if d.kind == "uniform":
                assert d.max is not None
                out[words], out[dist] = (d.min, d.max), None  # today's range fields
            else:
                out[dist] = d
    mix = tables.get("mix", {})
    for key in ("chat_share", "stream_share"):
        if key in mix:
            out[key] = _share(mix[key], f"{where}: [mix] {key}")
    if "canary_every" in mix:
        out["canary_every"] = _whole(mix["canary_every"], f"{where}: [mix] canary_every", 0,
                                     "0 turns canaries off")
    if "temperature" in mix:
        out["temperature"] = _real(mix["temperature"], f"{where}: [mix] temperature",
                                   at_least=0.0, fix="0 is greedy")
    if "turns" in tables.get("conversation", {}):
        out["turns"] = _whole(tables["conversation"]["turns"], f"{where}: [conversation] turns",
                              1, "1 is single-turn")
    prefix = tables.get("prefix", {})
    if "groups" in prefix:
        out["prefix_groups"] = _whole(prefix["groups"], f"{where}: [prefix] groups", 0,
                                      "0 turns shared prefixes off")
    if "tokens" in prefix:
        out["prefix_tokens"] = _whole(prefix["tokens"], f"{where}: [prefix] tokens", 0,
                                      "0 with groups = 0")
    if ("prefix_groups" in out or "prefix_tokens" in out) and \
            (out.get("prefix_groups", 0) > 0) != (out.get("prefix_tokens", 0) > 0):
        raise ConfigError(f"{where}: [prefix] groups {out.get('prefix_groups', 0)} and tokens "
                          f"{out.get('prefix_tokens', 0)}: set both above 0 (shared prefixes) "
                          "or both to 0 (none)")
    if "path" in tables.get("dataset", {}):
        value = tables["dataset"]["path"]
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: [dataset] path must be a non-empty string, "
                              f"got {value!r:.80}")
        if "tokens" in tables.get("prompt", {}):
            raise ConfigError(f"{where}: [prompt] tokens and [dataset] path both choose the "
                              "prompts; keep one of them")
        target = Path(value).expanduser()
        if not target.is_absolute():
            target = p.parent / target  # relative to the workload file
        try:
            out["dataset"] = load_dataset(target)
        except ConfigError as e:
            raise ConfigError(f"{where}: [dataset] path: {e}") from None
    if "timeout_s" in tables.get("client", {}):
        out["timeout_s"] = _real(tables["client"]["timeout_s"], f"{where}: [client] timeout_s",
                                 above=0.0, fix="e.g. 30 (seconds)")
    if "max_in_flight" in tables.get("client", {}):
        out["max_in_flight"] = _whole(tables["client"]["max_in_flight"],
                                      f"{where}: [client] max_in_flight", 1, "e.g. 256")
    wf = WorkloadFile(str(p), hashlib.sha256(raw).hexdigest(), out, description)
    wf.spec()  # the cross-key checks (e.g. turns > 1 with chat_share = 0), now
    return wf


def _known(table: dict[str, Any], accepted: tuple[str, ...], where: str, at: str) -> None:
    unknown = sorted(set(table) - set(accepted))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown} {at}; accepted: {list(accepted)}")


def _arrival(table: dict[str, Any], where: str) -> dict[str, Any]:
    process = table.get("process")
    if process is None:
        raise ConfigError(f"{where}: process is missing; set process = one of {list(PROCESSES)}")
    if process not in PROCESSES:
        raise ConfigError(f"{where} process {process!r}: unknown arrival process; "
                          f"use one of {list(PROCESSES)}")
    allowed = {"poisson": ("rate",), "gamma": ("rate", "burstiness"),
               "constant": ("rate",), "closed": ("users",)}[process]
    for key in ("rate", "burstiness", "users"):
        if key in table and key not in allowed:
            hint = {"rate": "a closed loop sends when an answer comes: set users instead",
                    "burstiness": "burstiness is for process = \"gamma\" (poisson is gamma "
                                  "with burstiness 1.0)",
                    "users": "users is for process = \"closed\"; an open loop has a rate"}[key]
            raise ConfigError(f"{where} {key}: not used with process = {process!r}; {hint}")
    out: dict[str, Any] = {}
    if process == "closed":
        if "users" not in table:
            raise ConfigError(f"{where}: process = \"closed\" needs users (concurrent clients), "
                              "e.g. users = 4")
        out["mode"] = "closed"
        out["arrival"] = "gamma"
        out["concurrency"] = _whole(table["users"], f"{where} users", 1, "e.g. users = 4")
        return out
    out["mode"] = "open"
    out["arrival"] = "constant" if process == "constant" else "gamma"
    if "rate" in table:
        out["rate"] = _real(table["rate"], f"{where} rate", above=0.0,
                            fix="requests/s, e.g. rate = 8.0")
    if process == "poisson":
        out["burstiness"] = 1.0
    elif "burstiness" in table:
        out["burstiness"] = _real(table["burstiness"], f"{where} burstiness", above=0.0,
                                  fix="1.0 is Poisson, below 1 burstier, above 1 steadier")
    return out


def _distribution(value: Any, where: str) -> Distribution:
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"dist": "fixed", "value": value}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {value!r:.80} is neither a whole number of tokens nor a "
                          'table such as { dist = "uniform", min = 4, max = 32 }')
    kind = value.get("dist")
    if kind not in DISTRIBUTIONS:
        raise ConfigError(f"{where}: dist {kind!r}: use one of {list(DISTRIBUTIONS)}, e.g. "
                          '{ dist = "uniform", min = 4, max = 32 }')
    params = DISTRIBUTION_PARAMS[kind]
    _known(value, ("dist", *params), where, f"for dist = {kind!r}")
    kw: dict[str, Any] = {}
    for key in params:
        if key not in value:
            continue
        v = value[key]
        if key in ("value", "min", "max"):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{where}: {key} {v!r:.80} must be a whole number of tokens")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{where}: {key} {v!r:.80} must be a number")
        kw[key] = v
    try:
        return Distribution(kind, **kw)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _share(value: Any, where: str) -> float:
    v = _real(value, where, fix="a share within 0..1")
    if not 0.0 <= v <= 1.0:
        raise ConfigError(f"{where} {value!r}: a share must be within 0..1 (e.g. 0.3 is 30%)")
    return v


def _real(value: Any, where: str, above: float | None = None, at_least: float | None = None,
          fix: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: {value!r:.80} is not a number; {fix}")
    if above is not None and value <= above:
        raise ConfigError(f"{where} {value!r}: must be more than {above:g}; {fix}")
    if at_least is not None and value < at_least:
        raise ConfigError(f"{where} {value!r}: must be {at_least:g} or more; {fix}")
    return float(value)


def _whole(value: Any, where: str, least: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: {value!r:.80} is not a whole number; {fix}")
    if value < least:
        raise ConfigError(f"{where} {value!r}: must be {least} or more; {fix}")
    return value
