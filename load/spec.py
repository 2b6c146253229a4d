"""The workload spec (pure): what a run's traffic is, as the ``--load-*``
options and a workload file give it (``WorkloadSpec``), with its
distributions, datasets and its description for summary.json.

Beyond today's knobs (all off by default; a spec built with the original
fields only plans exactly the requests it always did, byte for byte):

- ``arrival="constant"``: open loop with even gaps of 1/rate (no randomness).
- ``prompt_tokens`` / ``output_tokens``: a ``Distribution`` (fixed, uniform,
  normal, log-normal, clamped to min..max) instead of the uniform
  ``prompt_words`` / ``max_tokens`` ranges. Prompt length "in tokens" is
  counted in words of ``WORDS``: the client has no tokenizer. One word is
  about one token in common tokenizers (each is a common English word), but
  2-6 tokens (about 3.7 on average) in the tiny model's BPE, which is trained
  on syllable pseudo-words: size prompts for its max-model-len (512) with
  that in mind. Output lengths are exact: they are ``max_tokens``.
- ``turns``: multi-turn chat. A chat request that starts a conversation is
  followed in the plan by its next turns (consecutive non-canary requests);
  each turn sends the previous turns' messages. The plan is pure and cannot
  know the answers, so each earlier answer is ``ASSISTANT_PLACEHOLDER``
  (or, with a dataset, the dataset's own answer). Turns do not wait for the
  previous answer: they arrive like any other request.
- ``prefix_groups`` + ``prefix_tokens``: every non-canary request belongs to
  one of N groups; requests of a group share a seeded common prefix of
  ``prefix_tokens`` words (prefix caching). The prefix comes before the
  drawn prompt (the prompt length does not include it); in a conversation it
  opens the first user message, so later turns carry it in their history.
- ``dataset``: prompts (or conversations) drawn, seeded, from a JSONL file
  (``load_dataset``); they replace the drawn words and are sent as they are
  (their length is the dataset's: mind the model's max-model-len).

Canaries are never touched by any of these: same prompts, greedy, 16 tokens.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ordeal.config import ConfigError, read_input

Endpoint = Literal["completions", "chat"]


PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


WORDS = ("the cluster replica router token stream fault heal latency packet clock model "
         "server queue batch cache memory process restart health prompt answer quick brown "
         "fox jumps over lazy dog alpha beta gamma delta").split()


CANARY_PROMPTS = ("the quick brown fox jumps over", "alpha beta gamma delta",
                  "router replica health")


#: What a multi-turn request's history says the model answered before: the
#: plan is pure and cannot know the real answers.
ASSISTANT_PLACEHOLDER = "(an earlier answer)"


DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")


#: The parameters each distribution takes (min and max clamp every one).
DISTRIBUTION_PARAMS = {"fixed": ("value",), "uniform": ("min", "max"),
                       "normal": ("mean", "stddev", "min", "max"),
                       "lognormal": ("mean", "sigma", "min", "max")}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


@dataclass(frozen=True)
class Distribution:
    """A length in tokens, drawn per request, rounded and clamped to
    ``min..max`` (``max`` None: no upper clamp).

    fixed: always ``value``. uniform: an integer in ``min..max``, both given.
    normal: ``mean`` and ``stddev``. lognormal: ``mean`` is the mean of the
    lengths themselves (not of their log) and ``sigma`` the spread of the
    underlying normal, so mu = ln(mean) - sigma**2/2. The clamp moves the
    mean a little when it bites; ``mean`` must lie within ``min..max``.
    """

    kind: str
    value: int | None = None
    mean: float | None = None
    stddev: float | None = None
    sigma: float | None = None
    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in DISTRIBUTIONS:
            raise ConfigError(f"distribution {self.kind!r}: use one of {list(DISTRIBUTIONS)}")
        takes = DISTRIBUTION_PARAMS[self.kind]
        given = {k for k in ("value", "mean", "stddev", "sigma", "max")
                 if getattr(self, k) is not None}
        if self.min != 1:
            given.add("min")
        extra = sorted(given - set(takes))
        if extra:
            raise ConfigError(f"{self.kind} distribution does not take {extra}; "
                              f"it takes {list(takes)}")
        needs = takes if self.kind == "uniform" else [k for k in takes if k not in ("min", "max")]
        missing = [k for k in needs if getattr(self, k) is None]
        if missing:
            raise ConfigError(f"{self.kind} distribution needs {missing} "
                              f"(it takes {list(takes)})")
        if self.kind == "fixed":
            if not _count(self.value) or self.value < 1:
                raise ConfigError(f"fixed value {self.value!r}: must be a whole number of "
                                  "tokens, at least 1")
            return
        if not _count(self.min) or self.min < 1:
            raise ConfigError(f"{self.kind} min {self.min!r}: must be a whole number, at least 1")
        if self.max is not None:
            if not _count(self.max):
                raise ConfigError(f"{self.kind} max {self.max!r}: must be a whole number")
            if self.min > self.max:
                raise ConfigError(f"{self.kind} min {self.min} > max {self.max}: "
                                  "need min <= max")
        if self.kind == "uniform":
            return
        if not _number(self.mean) or self.mean <= 0:
            raise ConfigError(f"{self.kind} mean {self.mean!r}: must be more than 0 tokens")
        if not self.min <= self.mean <= (self.max if self.max is not None else math.inf):
            raise ConfigError(f"{self.kind} mean {self.mean} lies outside min..max "
                              f"{self.min}..{self.max}: move the mean or widen the clamp")
        spread = "stddev" if self.kind == "normal" else "sigma"
        value = getattr(self, spread)
        if not _number(value) or value <= 0:
            raise ConfigError(f"{self.kind} {spread} {value!r}: must be more than 0 "
                              f"(for a constant length use dist = \"fixed\")")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            assert self.value is not None
            return self.value
        if self.kind == "uniform":
            assert self.max is not None
            return rng.randint(self.min, self.max)
        assert self.mean is not None
        if self.kind == "normal":
            assert self.stddev is not None
            x = rng.normalvariate(self.mean, self.stddev)
        else:
            assert self.sigma is not None
            x = rng.lognormvariate(math.log(self.mean) - self.sigma ** 2 / 2, self.sigma)
        n = max(self.min, round(x))
        return n if self.max is None else min(self.max, n)

    def bounds(self) -> tuple[int, int | None]:
        """The smallest and largest length it can give (None: unbounded)."""
        if self.kind == "fixed":
            assert self.value is not None
            return self.value, self.value
        return self.min, self.max

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, in the workload file's shape (``dist`` and its params)."""
        out: dict[str, Any] = {"dist": self.kind}
        for k in DISTRIBUTION_PARAMS[self.kind]:
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Distribution:
        """Back from ``to_dict`` (or from ``dataclasses.asdict``)."""
        kw = {k: v for k, v in d.items() if k not in ("dist", "kind")}
        bad = sorted(set(kw) - {"value", "mean", "stddev", "sigma", "min", "max"})
        if bad:
            raise ConfigError(f"distribution {d!r}: unknown key(s) {bad}")
        if d.get("min") is None:
            kw.pop("min", None)
        return cls(d.get("dist", d.get("kind")), **kw)


#: One dataset entry: its user turns, each with the answer the dataset
#: recorded for it (None: none recorded).
Conversation = tuple[tuple[str, "str | None"], ...]


_USER_ROLES = ("human", "user")


_ASSISTANT_ROLES = ("gpt", "assistant", "chatgpt", "bing", "bard", "model")


@dataclass(frozen=True)
class Dataset:
    """Prompts or conversations read from a JSONL file (``load_dataset``)."""

    path: str
    sha256: str
    conversations: tuple[Conversation, ...]
    #: Entries of a JSON array with no human turn (ShareGPT as published has
    #: empty conversations): left out, and counted here.
    skipped: int = 0

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256,
                "entries": len(self.conversations),
                "turns": sum(len(c) for c in self.conversations),
                **({"skipped_without_a_human_turn": self.skipped} if self.skipped else {})}


def load_dataset(path: str | Path) -> Dataset:
    """Read a dataset: JSONL, one entry per line (blank lines skipped), or
    one JSON array of entries (ShareGPT's files as published, e.g.
    ``ShareGPT_V3_unfiltered_cleaned_split.json``):

    - ``{"prompt": "..."}``: one single-turn prompt;
    - ShareGPT's shape, ``{"conversations": [{"from": "human", "value": "..."},
      {"from": "gpt", "value": "..."}, ...]}``: the human turns are prompts,
      each gpt turn the recorded answer to the human turn before it.
      ``user``/``assistant`` are read as human/gpt; ``system`` turns and
      answers before the first human turn are skipped. Other keys on a line
      (ShareGPT's ``id``) are ignored.

    Anything else is a ``ConfigError`` naming the file and the first bad line.
    """
    p = Path(path)
    where = f"dataset {str(p)!r}"
    raw = read_input(p, where, "give the path of a JSONL file (relative paths in a "
                               "workload file start at that file)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text ({e})") from e
    entries: list[Conversation] = []
    if text.lstrip().startswith("["):
        # ShareGPT as it is published: one JSON array of entries.
        try:
            array = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ConfigError(f"{where}: starts with '[' but is not a JSON array ({e}); give "
                              "one JSON array of entries, or one JSON object per line") from e
        if not isinstance(array, list):
            raise ConfigError(f"{where}: not a JSON array")
        skipped = 0
        for i, obj in enumerate(array):
            if isinstance(obj, dict) and isinstance(obj.get("conversations"), list) and not any(
                    isinstance(t, dict) and t.get("from") in _USER_ROLES
                    and isinstance(t.get("value"), str) and t["value"].strip()
                    for t in obj["conversations"]):
                skipped += 1  # an empty conversation, as published files have
                continue
            entries.append(_dataset_entry(obj, f"{where} entry {i}"))
        if not entries:
            raise ConfigError(f"{where}: no entry with a human turn ({len(array)} in the "
                              "array); give at least one")
        return Dataset(str(p), hashlib.sha256(raw).hexdigest(), tuple(entries), skipped)
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        at = f"{where} line {n}"
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise ConfigError(f"{at}: not JSON ({e}); each line must be one JSON object") from e
        entries.append(_dataset_entry(obj, at))
    if not entries:
        raise ConfigError(f"{where}: no entries; write one JSON object per line, "
                          '{"prompt": ...} or {"conversations": [...]}')
    return Dataset(str(p), hashlib.sha256(raw).hexdigest(), tuple(entries))


def _dataset_entry(obj: Any, at: str) -> Conversation:
    shape = ('each line is {"prompt": "..."} or {"conversations": '
             '[{"from": "human"|"gpt", "value": "..."}, ...]}')
    if not isinstance(obj, dict):
        raise ConfigError(f"{at}: a {type(obj).__name__}, not an object; {shape}")
    if "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"{at}: prompt must be a non-empty string, got {prompt!r:.80}")
        return ((prompt, None),)
    turns = obj.get("conversations")
    if not isinstance(turns, list):
        raise ConfigError(f"{at}: neither 'prompt' nor a 'conversations' list; {shape}")
    pairs: list[tuple[str, str | None]] = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise ConfigError(f"{at}: conversations[{i}] is not "
                              '{"from": ..., "value": "<text>"}')
        role = turn.get("from")
        if role in _USER_ROLES:
            pairs.append((turn["value"], None))
        elif role in _ASSISTANT_ROLES:
            if pairs and pairs[-1][1] is None:
                pairs[-1] = (pairs[-1][0], turn["value"])
        elif role != "system":
            raise ConfigError(f"{at}: conversations[{i}] from {role!r}: use 'human' or 'gpt'")
    if not pairs or not any(u.strip() for u, _ in pairs):
        raise ConfigError(f"{at}: no human turn with text; {shape}")
    return tuple(pairs)


@dataclass(frozen=True)
class WorkloadSpec:
    """Every knob of the load, seeded: the same spec gives the same requests."""

    model: str = "ordeal-tiny"
    duration_s: float = 30.0
    mode: Literal["open", "closed"] = "open"
    rate: float = 8.0  # requests/s (open loop)
    burstiness: float = 1.0  # gamma shape: 1 = Poisson, <1 burstier, >1 steadier
    concurrency: int = 4  # clients (closed loop); also the open-loop cap
    seed: int = 0
    prompt_words: tuple[int, int] = (4, 32)
    max_tokens: tuple[int, int] = (8, 32)
    stream_share: float = 0.8  # share of requests that stream
    chat_share: float = 0.3  # share of requests sent to /v1/chat/completions
    canary_every: int = 10  # one greedy canary in each n requests (0: none; is_canary)
    temperature: float = 0.7
    timeout_s: float = 30.0
    max_in_flight: int = 256  # open loop: past this, arrivals wait (their lag_ms)
    # vLLM's extension: token ids in every chunk, so usage can be checked
    # against the tokens really streamed (chunks merge tokens under load).
    return_token_ids: bool = True
    # Beyond here: off by default, see the module docstring.
    arrival: Literal["gamma", "constant"] = "gamma"  # open loop: gamma (Poisson at 1.0)
    prompt_tokens: Distribution | None = None  # None: uniform prompt_words
    output_tokens: Distribution | None = None  # None: uniform max_tokens
    turns: int = 1  # user turns per chat conversation
    prefix_groups: int = 0  # groups of requests sharing a prefix (0: none)
    prefix_tokens: int = 0  # words of each group's shared prefix
    dataset: Dataset | None = None  # a path is read with load_dataset

    def __post_init__(self) -> None:
        # The JSON forms (spec_to_dict, a summary or a schedule file) come back.
        for name in ("prompt_tokens", "output_tokens"):
            if isinstance(getattr(self, name), dict):
                object.__setattr__(self, name, Distribution.from_dict(getattr(self, name)))
        if isinstance(self.dataset, (str, Path)):
            object.__setattr__(self, "dataset", load_dataset(self.dataset))
        elif isinstance(self.dataset, dict) and "path" in self.dataset:
            loaded = load_dataset(self.dataset["path"])
            want = self.dataset.get("sha256")
            if want is not None and want != loaded.sha256:
                raise ConfigError(f"dataset {loaded.path!r}: its sha256 is {loaded.sha256}, "
                                  f"not {want} as recorded: the file changed; restore it to "
                                  "replay the same prompts")
            object.__setattr__(self, "dataset", loaded)
        if self.duration_s <= 0:
            raise ConfigError("workload duration must be more than zero seconds")
        if self.mode not in ("open", "closed"):
            raise ConfigError(f"workload mode {self.mode!r}: use 'open' or 'closed'")
        if self.mode == "open" and self.rate <= 0:
            raise ConfigError(f"workload rate {self.rate}: must be more than zero requests/s")
        if self.burstiness <= 0:
            raise ConfigError(f"burstiness {self.burstiness}: must be more than zero")
        if self.concurrency < 1:
            raise ConfigError(f"concurrency {self.concurrency}: must be at least 1")
        for name, (lo, hi) in (("prompt_words", self.prompt_words),
                               ("max_tokens", self.max_tokens)):
            if not 1 <= lo <= hi:
                raise ConfigError(f"{name} range {(lo, hi)}: need 1 <= low <= high")
        for name in ("stream_share", "chat_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} {getattr(self, name)}: must be within 0..1")
        if self.arrival not in ("gamma", "constant"):
            raise ConfigError(f"arrival {self.arrival!r}: use 'gamma' (Poisson at burstiness "
                              "1.0) or 'constant'")
        if self.arrival == "constant" and self.mode != "open":
            raise ConfigError("arrival 'constant' is an open-loop process: a closed loop "
                              "sends when an answer comes; leave arrival at 'gamma'")
        for name in ("prompt_tokens", "output_tokens"):
            d = getattr(self, name)
            if d is not None and not isinstance(d, Distribution):
                raise ConfigError(f"{name} {d!r}: must be a Distribution or None")
        if not _count(self.turns) or self.turns < 1:
            raise ConfigError(f"turns {self.turns!r}: must be a whole number, at least 1")
        if self.turns > 1 and self.chat_share == 0:
            raise ConfigError(f"turns {self.turns}: conversations are chat requests, and "
                              "chat_share is 0; raise chat_share or set turns = 1")
        for name in ("prefix_groups", "prefix_tokens"):
            if not _count(getattr(self, name)) or getattr(self, name) < 0:
                raise ConfigError(f"{name} {getattr(self, name)!r}: must be a whole number, "
                                  "0 or more")
        if (self.prefix_groups > 0) != (self.prefix_tokens > 0):
            raise ConfigError(f"prefix_groups {self.prefix_groups} with prefix_tokens "
                              f"{self.prefix_tokens}: set both above 0 (shared prefixes) "
                              "or both to 0 (none)")
        if self.dataset is not None and not isinstance(self.dataset, Dataset):
            raise ConfigError(f"dataset {self.dataset!r}: give a path or a Dataset")
        if self.dataset is not None and self.prompt_tokens is not None:
            raise ConfigError("prompt_tokens and dataset both choose the prompts: "
                              "keep one of them")


_DEFAULT_SPEC = WorkloadSpec()


#: The fields WorkloadSpec had before workload files: spec_to_dict always
#: writes them; the newer ones only when they differ from their default.
_FIRST_FIELDS = ("model", "duration_s", "mode", "rate", "burstiness", "concurrency", "seed",
                 "prompt_words", "max_tokens", "stream_share", "chat_share", "canary_every",
                 "temperature", "timeout_s", "max_in_flight", "return_token_ids")


def spec_to_dict(spec: WorkloadSpec) -> dict[str, Any]:
    """The spec as a JSON-ready dict that ``WorkloadSpec(**d)`` reads back
    (lists made tuples, as runs.explore.workload_spec does). For a spec of
    the original fields only it equals ``dataclasses.asdict(spec)``, so
    summaries and baselines from before stay comparable; a newer field is
    written only when set (a distribution as its ``to_dict``, a dataset as
    its path, sha256 and size, not its text)."""
    out: dict[str, Any] = {name: getattr(spec, name) for name in _FIRST_FIELDS}
    default = _DEFAULT_SPEC
    for name in ("arrival", "turns", "prefix_groups", "prefix_tokens"):
        if getattr(spec, name) != getattr(default, name):
            out[name] = getattr(spec, name)
    for name in ("prompt_tokens", "output_tokens"):
        d = getattr(spec, name)
        if d is not None:
            out[name] = d.to_dict()
    if spec.dataset is not None:
        out["dataset"] = spec.dataset.describe()
    return out


def describe_spec(spec: WorkloadSpec) -> dict[str, Any]:
    """The effective workload, JSON-ready, in the workload file's shape
    (docs/examples/workloads/README.md) plus what the suite decides
    (model, duration, seed): for summary.json's ``workload``."""
    if spec.mode == "closed":
        arrival: dict[str, Any] = {"process": "closed", "users": spec.concurrency}
    elif spec.arrival == "constant":
        arrival = {"process": "constant", "rate": spec.rate}
    elif spec.burstiness == 1.0:
        arrival = {"process": "poisson", "rate": spec.rate}
    else:
        arrival = {"process": "gamma", "rate": spec.rate, "burstiness": spec.burstiness}

    def tokens(d: Distribution | None, lo_hi: tuple[int, int]) -> dict[str, Any]:
        if d is not None:
            return d.to_dict()
        return {"dist": "uniform", "min": lo_hi[0], "max": lo_hi[1]}

    prompt = ({"tokens": "from the dataset"} if spec.dataset is not None
              else {"tokens": tokens(spec.prompt_tokens, spec.prompt_words)})
    return {
        "model": spec.model, "duration_s": spec.duration_s, "seed": spec.seed,
        "arrival": arrival,
        "prompt": prompt,
        "output": {"tokens": tokens(spec.output_tokens, spec.max_tokens)},
        "mix": {"chat_share": spec.chat_share, "stream_share": spec.stream_share,
                "canary_every": spec.canary_every, "temperature": spec.temperature},
        "conversation": {"turns": spec.turns},
        "prefix": {"groups": spec.prefix_groups, "tokens": spec.prefix_tokens},
        "dataset": spec.dataset.describe() if spec.dataset is not None else None,
        "client": {"timeout_s": spec.timeout_s, "max_in_flight": spec.max_in_flight,
                   "return_token_ids": spec.return_token_ids},
    }
