"""The workload: seeded request plans (pure) and an async client that sends
them and records every request in the history (thin adapter).

Arrivals follow ``vllm bench serve``: open loop with gamma-distributed gaps
of mean 1/rate (shape = burstiness; 1.0 is Poisson), or closed loop with a
fixed number of concurrent clients. Each request is its own history process
(open loop) or belongs to its client (closed loop), so every process has at
most one request in flight, which is what the checkers pair on.

Classification (Jepsen's rule: ``fail`` only when the request certainly did
not take effect or the server said it failed):
  connection refused before sending ........ fail
  HTTP 4xx (rejected before running) ....... fail
  HTTP 5xx ................................. info (a router's 500 "error sending
                                             request" after its upstream died may
                                             come after the replica took the work)
  error event in a stream (even under 200) . fail
  malformed SSE data / malformed JSON body . fail
  timeout, connection lost, no [DONE] ...... info (it may have run)

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

import asyncio
import hashlib
import json
import math
import os
import random
import ssl
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator, Literal, Protocol

import aiohttp

from load.sse import SSEParser, StreamRecorder
from ordeal.config import ConfigError, read_input
from ordeal.history.writer import History, HistoryWriteError
from ordeal.ownership import SESSION_NETWORKS, NotOurs
from ordeal.topology import Endpoint as Address

Endpoint = Literal["completions", "chat"]
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
WORDS = ("the cluster replica router token stream fault heal latency packet clock model "
         "server queue batch cache memory process restart health prompt answer quick brown "
         "fox jumps over lazy dog alpha beta gamma delta").split()
CANARY_PROMPTS = ("the quick brown fox jumps over", "alpha beta gamma delta", "router replica health")
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
        for name, (lo, hi) in (("prompt_words", self.prompt_words), ("max_tokens", self.max_tokens)):
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


@dataclass(frozen=True)
class PlannedRequest:
    seq: int
    at_s: float  # offset from the start of the load (open loop; 0 in closed)
    endpoint: Endpoint
    stream: bool
    prompt: str
    max_tokens: int
    temperature: float
    canary: bool
    # Multi-turn chat: the earlier (role, content) messages, oldest first;
    # ``prompt`` is this turn's user message.
    history: tuple[tuple[str, str], ...] = ()
    conversation: int | None = None  # seq of the conversation's first turn
    prefix_group: int | None = None  # the shared-prefix group (None: none)

    @property
    def turn(self) -> int:
        """1 for a single request or a conversation's first turn."""
        return len(self.history) // 2 + 1

    def messages(self) -> list[dict[str, str]]:
        """The chat messages: the history, then this turn's prompt."""
        return [*({"role": r, "content": c} for r, c in self.history),
                {"role": "user", "content": self.prompt}]

    def body(self, model: str, return_token_ids: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens,
                                "temperature": self.temperature, "stream": self.stream}
        if return_token_ids:
            body["return_token_ids"] = True
        if self.endpoint == "chat":
            body["messages"] = self.messages()
        else:
            body["prompt"] = self.prompt
        if self.stream:
            # continuous usage: each chunk carries the running completion_tokens,
            # the stream's sequence number (load.sse checks it).
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return body


def is_canary(seq: int, every: int) -> bool:
    """One greedy canary in each block of ``every`` requests, at an offset
    that steps by one from block to block (block j: request j*every + j %
    every). A fixed stride is blind behind a round-robin router: every 10th
    request of 2 replicas always reached the same one, and a replica that
    answered with another model's text passed (failure zoo,
    faults/zoo/wrong_model_text.py). Stepping offsets reach every replica."""
    return every > 0 and seq % every == (seq // every) % every


def plan_requests(spec: WorkloadSpec, limit_s: float | None = None) -> Iterator[PlannedRequest]:
    """The request plan: pure, seeded and endless; with ``limit_s`` an open
    loop plan stops at that offset. The runner decides when to stop.

    With none of the newer knobs set, the draws (and so the requests) are
    exactly those of the original plan: one gap, then for a non-canary the
    prompt length, the endpoint, streaming, the words and max_tokens."""
    rng = random.Random(spec.seed)
    prefixes = group_prefixes(spec)
    at = 0.0
    seq = 0
    convo: _Conversation | None = None
    while True:
        if spec.mode == "open":
            if spec.arrival == "constant":
                at = (seq + 1) / spec.rate
            else:
                at += rng.gammavariate(spec.burstiness, 1.0 / (spec.rate * spec.burstiness))
            if limit_s is not None and at >= limit_s:
                return
        canary = is_canary(seq, spec.canary_every)
        if canary:
            prompt = CANARY_PROMPTS[(seq // spec.canary_every) % len(CANARY_PROMPTS)]
            req = PlannedRequest(seq, at, "completions", True, prompt, 16, 0.0, True)
        elif convo is not None:
            req = convo.next_turn(spec, rng, seq, at)
            if convo.done:
                convo = None
        else:
            entry: Conversation | None = None
            if spec.dataset is not None:
                entry = spec.dataset.conversations[rng.randrange(len(spec.dataset.conversations))]
                words = 0
            else:
                words = (spec.prompt_tokens.sample(rng) if spec.prompt_tokens is not None
                         else rng.randint(*spec.prompt_words))
            endpoint: Endpoint = "chat" if rng.random() < spec.chat_share else "completions"
            stream = rng.random() < spec.stream_share
            prompt = (entry[0][0] if entry is not None
                      else " ".join(rng.choice(WORDS) for _ in range(words)))
            max_tokens = _output_tokens(spec, rng)
            group = rng.randrange(spec.prefix_groups) if prefixes else None
            if group is not None:
                prompt = f"{prefixes[group]} {prompt}"
            turns = spec.turns if entry is None else min(spec.turns, len(entry))
            conversation = None
            if endpoint == "chat" and turns > 1:
                conversation = seq
                convo = _Conversation(seq, group, turns, entry, prompt)
            req = PlannedRequest(seq, at, endpoint, stream, prompt, max_tokens,
                                 spec.temperature, False, (), conversation, group)
        yield req
        seq += 1


def group_prefixes(spec: WorkloadSpec) -> tuple[str, ...]:
    """Each shared-prefix group's prefix, seeded apart from the plan's own
    draws (so adding groups does not reshuffle anything else)."""
    if spec.prefix_groups <= 0:
        return ()
    rng = random.Random(f"ordeal-prefix-{spec.seed}")
    return tuple(" ".join(rng.choice(WORDS) for _ in range(spec.prefix_tokens))
                 for _ in range(spec.prefix_groups))


def _output_tokens(spec: WorkloadSpec, rng: random.Random) -> int:
    if spec.output_tokens is not None:
        return spec.output_tokens.sample(rng)
    return rng.randint(*spec.max_tokens)


@dataclass
class _Conversation:
    """A multi-turn chat in progress in the plan."""

    first_seq: int
    group: int | None
    turns: int
    entry: Conversation | None  # a dataset's conversation, or drawn words
    first_prompt: str
    history: tuple[tuple[str, str], ...] = ()
    sent: int = 1

    def __post_init__(self) -> None:
        self.history = self._with_answer((), self.first_prompt, 0)

    def _with_answer(self, history: tuple[tuple[str, str], ...], prompt: str,
                     turn: int) -> tuple[tuple[str, str], ...]:
        answer = self.entry[turn][1] if self.entry is not None else None
        return (*history, ("user", prompt),
                ("assistant", answer if answer is not None else ASSISTANT_PLACEHOLDER))

    @property
    def done(self) -> bool:
        return self.sent >= self.turns

    def next_turn(self, spec: WorkloadSpec, rng: random.Random, seq: int,
                  at: float) -> PlannedRequest:
        if self.entry is not None:
            prompt = self.entry[self.sent][0]
        else:
            words = (spec.prompt_tokens.sample(rng) if spec.prompt_tokens is not None
                     else rng.randint(*spec.prompt_words))
            prompt = " ".join(rng.choice(WORDS) for _ in range(words))
        stream = rng.random() < spec.stream_share
        req = PlannedRequest(seq, at, "chat", stream, prompt, _output_tokens(spec, rng),
                             spec.temperature, False, self.history, self.first_seq,
                             self.group)
        self.history = self._with_answer(self.history, prompt, self.sent)
        self.sent += 1
        return req


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


def output_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:16]


@dataclass
class Outcome:
    type: Literal["ok", "fail", "info"]
    value: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _latencies(start_ns: int, end_ns: int, times: list[int], tokens: int) -> dict[str, Any]:
    """TTFT, ITL, TPOT and E2E exactly as ``vllm bench serve`` defines them."""
    out: dict[str, Any] = {"e2e_ms": round((end_ns - start_ns) / 1e6, 3)}
    if times:
        out["ttft_ms"] = round((times[0] - start_ns) / 1e6, 3)
        out["itl_ms"] = [round((b - a) / 1e6, 3) for a, b in zip(times, times[1:])]
        if tokens > 1:
            out["tpot_ms"] = round((end_ns - times[0]) / 1e6 / (tokens - 1), 3)
    return out


MAX_BODY = 8 << 20  # a non-streamed answer larger than this is a server fault


async def read_body(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The whole body, up to ``limit`` bytes. ``StreamReader.read(n)``
    returns what has arrived so far, not n bytes: on a slow link (seen under
    bandwidth_limit) one read gave half a JSON body, which the harness then
    blamed on the server."""
    parts: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await content.read(min(65536, limit + 1 - size))
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def answer_shape(payload: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, Any]] | str:
    """A non-streamed answer's first choice, its text and its usage, or
    what is wrong with the shape (the harness records it as a ``fail``; a
    hostile body must not end up as a harness error)."""
    choices = payload.get("choices")
    if choices is None:
        choices = [{}]
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return f"choices is not a list of objects ({type(choices).__name__})"
    choice = choices[0]
    text = choice.get("text")
    if text is None:
        message = choice.get("message") or {}
        text = message.get("content") if isinstance(message, dict) else None
    if text is None:
        text = ""
    if not isinstance(text, str):
        return f"the answer's text is a {type(text).__name__}, not a string"
    usage = payload.get("usage") or {}
    if not isinstance(usage, dict):
        return f"usage is a {type(usage).__name__}, not an object"
    tokens = usage.get("completion_tokens")
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool)
                               or tokens < 0):
        return f"usage.completion_tokens is not a count: {tokens!r:.80}"
    return choice, text, usage


NODE_HEADER = "x-ordeal-node"  # what Ordeal's own replicas add (engines/vllm/node_header.py)


def _ordeal_node(headers: Any) -> str | None:
    return headers.get(NODE_HEADER)


async def send_request(session: aiohttp.ClientSession, base_url: str, req: PlannedRequest,
                       model: str, timeout_s: float, return_token_ids: bool = False,
                       request_id: str | None = None,
                       post_kwargs: dict[str, Any] | None = None,
                       node_of: Callable[[Any], str | None] | None = None) -> Outcome:
    """Send one request and classify what happened. Never raises for anything
    the server or the network does; only cancellation propagates.

    ``node_of``: which replica answered, from the response headers
    (``ClientOptions.node_of``); by default Ordeal's own ``x-ordeal-node``.

    ``request_id`` goes out as ``x-request-id``; routers forward it and each
    replica's served journal records it, which is how a router's retry (one
    client request, two executions) becomes visible."""
    url = base_url + PATHS[req.endpoint]
    start = time.monotonic_ns()
    node = None
    status = None
    recorder = StreamRecorder(start)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        headers = {"x-request-id": request_id} if request_id else None
        async with session.post(url, json=req.body(model, return_token_ids),
                                timeout=timeout, headers=headers,
                                **(post_kwargs or {})) as resp:
            status = resp.status
            node = (node_of or _ordeal_node)(resp.headers)
            if status != 200:
                body = (await resp.content.read(2048)).decode("utf-8", errors="replace")
                kind = "info" if status >= 500 else "fail"
                return Outcome(kind, {"status": status, "node": node},
                               f"HTTP {status}: {body[:300]}")
            if req.stream:
                parser = SSEParser()
                async for chunk in resp.content.iter_any():
                    now = time.monotonic_ns()
                    for ev in parser.feed(chunk):
                        recorder.on_event(ev, now)
                for ev in parser.close():
                    recorder.on_event(ev)
                recorder.add_problems(parser.problems)
            else:
                raw = await read_body(resp.content, MAX_BODY)
                first = time.monotonic_ns()
                if len(raw) > MAX_BODY:
                    return Outcome("fail", {"status": status, "node": node},
                                   f"body larger than {MAX_BODY >> 20} MiB: not an answer")
                try:
                    payload = json.loads(raw)
                    if not isinstance(payload, dict):
                        raise ValueError("top level is not an object")
                except (ValueError, RecursionError) as e:  # nested too deep: Recursion
                    return Outcome("fail", {"status": status, "node": node},
                                   f"malformed JSON body ({type(e).__name__}: {e}): "
                                   f"{raw[:200]!r}")
                if "error" in payload:
                    return Outcome("fail", {"status": status, "node": node},
                                   f"error body under HTTP 200: {str(payload['error'])[:300]}")
                shape = answer_shape(payload)
                if isinstance(shape, str):
                    return Outcome("fail", {"status": status, "node": node},
                                   f"malformed answer: {shape}: {raw[:200]!r}")
                choice, text, usage = shape
                tokens = usage.get("completion_tokens") or 0
                end = time.monotonic_ns()
                value = {"status": status, "node": node, "id": payload.get("id"),
                         "finish_reason": choice.get("finish_reason"), "usage": usage,
                         "output_tokens": tokens, "output_hash": output_hash(text),
                         "fingerprint": payload.get("system_fingerprint"),
                         "created": payload.get("created"),
                         **_latencies(start, end, [first], tokens)}
                if req.canary:
                    value["text"] = text
                    if isinstance(choice.get("token_ids"), list):
                        value["token_ids"] = choice["token_ids"]
                return Outcome("ok", value)
    except aiohttp.ClientConnectorError as e:
        return Outcome("fail", {"node": node}, f"connect failed (request not sent): {e}")
    except asyncio.TimeoutError:
        kind = "stream" if recorder.record.n_chunks else "response"
        return Outcome("info", {"status": status, "node": node,
                                "stream": recorder.record.to_value(start) if req.stream else None},
                       f"timeout after {timeout_s}s waiting for the {kind}")
    except (aiohttp.ClientError, ConnectionError, OSError) as e:
        return Outcome("info", {"status": status, "node": node,
                                "stream": recorder.record.to_value(start) if req.stream else None},
                       f"connection lost: {type(e).__name__}: {e}")

    end = time.monotonic_ns()
    rec = recorder.record
    usage = rec.usage or {}
    tokens = usage.get("completion_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        if tokens is not None:
            recorder.add_problems([f"usage.completion_tokens is not a count: {tokens!r:.80}"])
        tokens = len(rec.token_times_ns)
    value = {"status": status, "node": node, "id": rec.ids[0] if rec.ids else None,
             "finish_reason": rec.finish_reasons[-1] if rec.finish_reasons else None,
             "usage": rec.usage, "output_tokens": tokens, "output_hash": output_hash(rec.text),
             "fingerprint": rec.system_fingerprint, "created": rec.created,
             "stream": rec.to_value(),
             **_latencies(start, end, rec.token_times_ns, tokens)}
    if req.canary:
        value["text"] = rec.text
        if rec.token_ids_seen:
            value["token_ids"] = rec.token_ids
    if rec.errors:
        return Outcome("fail", value, f"error event in stream: {rec.errors[0][:300]}")
    if rec.malformed:
        return Outcome("fail", value, f"malformed stream: {rec.malformed[0]}")
    if not rec.done:
        # The body ended in good order (a transport error is caught above):
        # the server closed the stream itself, and stream_wellformed judges it.
        value["stream"]["clean_eof"] = True
        return Outcome("info", value, "stream ended without [DONE]")
    return Outcome("ok", value)


Progress = Callable[[str], None]


def _plan_extras(req: PlannedRequest) -> dict[str, Any]:
    """What the invoke op records of the newer plan fields, only when set
    (a plain request's invoke op is what it always was)."""
    out: dict[str, Any] = {}
    if req.conversation is not None:
        out["conversation"] = req.conversation
        out["turn"] = req.turn
    if req.prefix_group is not None:
        out["prefix_group"] = req.prefix_group
    return out


def url_endpoint(url: str) -> Address:
    """The host and port a base URL sends to (default ports by scheme)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotOurs(f"load: {url!r} is not an http(s) URL with a host")
    return Address(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))


@dataclass
class Prepared:
    """A request made concrete for one engine: the history op name ``f``,
    what the invoke op records beyond the plan, and the call itself."""

    f: str
    invoke: dict[str, Any]
    call: Callable[[], Awaitable[Outcome]]


class EngineClient(Protocol):
    """The workload's side of an engine. ``prepare`` is synchronous so the
    invoke op is written before anything is sent; ``close`` ends pools."""

    def prepare(self, req: PlannedRequest, request_id: str) -> Prepared: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class ClientOptions:
    """How to reach a deployment Ordeal did not start (ordeal/target.py):
    extra headers, the API key's environment variable (read when the
    client is made, held only in its session's headers, never written),
    TLS verification or a CA file, and the TLS server name when the
    connection goes through the fault proxy on loopback."""

    headers: tuple[tuple[str, str], ...] = ()
    api_key_env: str | None = None
    verify: bool = True
    ca_file: str | None = None
    server_hostname: str | None = None
    host_header: str | None = None  # the deployment's own name, through the proxy
    follow_redirects: bool = True  # False: a redirect to an unchecked host is not followed
    #: The response header naming the replica that answered (the target
    #: file's ``replica_header``), and which value means which replica
    #: (value -> name: each replica's name, its URL's ``host:port`` and its
    #: ``served_as`` values). A value no replica claims is no node (the
    #: checkers count the answer as unplaced), never a guess.
    node_header: str = NODE_HEADER
    node_names: tuple[tuple[str, str], ...] = ()

    def node_of(self, headers: Any) -> str | None:
        value = headers.get(self.node_header)
        if value is None or not self.node_names:
            return value
        return dict(self.node_names).get(value.strip())

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def session_headers(self) -> dict[str, str]:
        out = dict(self.headers)
        if self.host_header:
            out["Host"] = self.host_header
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise ConfigError(f"the target file's api_key_env names {self.api_key_env}, "
                                  "which is not set (or empty) in the environment; export it "
                                  "before the run")
            out["Authorization"] = f"Bearer {key}"
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        """The same for urllib (health, metrics): None is the system's CAs."""
        if not self.verify:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None

    def ssl(self) -> Any:
        """What aiohttp's ``ssl=`` takes: False (no verification), a context
        with the CA file, or True (the system's CAs)."""
        if not self.verify:
            return False
        if self.ca_file:
            return ssl.create_default_context(cafile=self.ca_file)
        return True


def scrubbed(outcome: Outcome, secret: str) -> Outcome:
    """``outcome`` with ``secret`` replaced wherever it appears (the error,
    any string value): never in the history, whatever the server echoed."""
    text = json.dumps(outcome.value, default=str)
    if secret not in (outcome.error or "") and secret not in text:
        return outcome
    value = json.loads(text.replace(secret, "<redacted>"))
    error = outcome.error.replace(secret, "<redacted>") if outcome.error else outcome.error
    return Outcome(outcome.type, value, error)


class OpenAIClient:
    """The OpenAI API (vLLM, or any engine that speaks it) over one pooled
    aiohttp session: the default EngineClient."""

    def __init__(self, spec: WorkloadSpec, base_url: str, options: ClientOptions | None = None):
        self.spec = spec
        self.base_url = base_url.rstrip("/")
        options = options or ClientOptions()
        self.node_of = options.node_of
        self.post_kwargs: dict[str, Any] = {}
        if not options.follow_redirects:
            self.post_kwargs["allow_redirects"] = False
        # Held in memory only, to scrub from what the server says back (an
        # error page that echoes the request) before the history has it.
        self.secret = options.api_key()
        if self.base_url.startswith("https:"):
            self.post_kwargs["ssl"] = options.ssl()
            if options.server_hostname:
                self.post_kwargs["server_hostname"] = options.server_hostname
        self.session = aiohttp.ClientSession(
            headers=options.session_headers(),
            connector=aiohttp.TCPConnector(limit=spec.max_in_flight, force_close=False))

    def prepare(self, req: PlannedRequest, request_id: str) -> Prepared:
        async def call() -> Outcome:
            out = await send_request(self.session, self.base_url, req, self.spec.model,
                                     self.spec.timeout_s, self.spec.return_token_ids,
                                     request_id, self.post_kwargs, self.node_of)
            return scrubbed(out, self.secret) if self.secret else out
        return Prepared(req.endpoint, {}, call)

    async def close(self) -> None:
        await self.session.close()


class WorkloadRunner:
    """Drives a plan against ``base_url`` and records it in ``history``.
    ``client`` makes each planned request concrete for the engine (a
    callable returning an EngineClient, called inside the event loop);
    by default the OpenAI API at ``base_url``."""

    def __init__(self, spec: WorkloadSpec, base_url: str, history: History,
                 progress: Progress | None = None, progress_every_s: float = 5.0,
                 client: Callable[[], EngineClient] | None = None,
                 share: tuple[int, int] = (0, 1)):
        """``share`` (i, n): send only the plan's requests whose seq % n
        is i (a load worker's part: load/workers.py runs the load in
        several processes)."""
        self.make_client = client or (lambda: OpenAIClient(spec, base_url))
        self.share = share
        # A load worker's (load/workers.py): may the request due at this
        # time (time.monotonic()) be sent? Waits for the parent to say.
        self.gate: Callable[[float], Awaitable[bool]] | None = None
        self.spec = spec
        self.base_url = base_url.rstrip("/")
        # Before any request is sent (NotOurs names the address and the fix).
        SESSION_NETWORKS.require_ours(url_endpoint(self.base_url), "load")
        self.history = history
        self.progress = progress
        self.progress_every_s = progress_every_s
        self.in_flight = 0
        self.history_failure: HistoryWriteError | None = None
        self._stop = asyncio.Event()
        # Request ids are unique across runs: journals outlive a run.
        self.rid_prefix = f"ordeal-{uuid.uuid4().hex[:8]}"

    def stop(self) -> None:
        """Stop sending new requests; those in flight still complete."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    async def _one(self, client: Any, process: int | str, req: PlannedRequest,
                   due: float | None = None, queued: bool = False) -> None:
        try:
            await self._one_recorded(client, process, req, due, queued)
        except HistoryWriteError as e:
            # Nothing from here on would be recorded: stop sending, and let
            # run() raise it once what is in flight has ended.
            if self.history_failure is None:
                self.history_failure = e
                if self.progress:
                    self.progress(f"load: stopping, the history cannot be written: {e}")
            self.stop()

    async def _one_recorded(self, client: Any, process: int | str,
                            req: PlannedRequest, due: float | None = None,
                            queued: bool = False) -> None:
        rid = f"{self.rid_prefix}-{req.seq}"
        prepared = client.prepare(req, rid)
        f = prepared.f
        # Open loop: how late the request is sent against the schedule (the
        # in-flight limit, or a harness too busy to send on time). The
        # checkers add it to TTFT and E2E: a user would have waited too.
        # ``queued``: it found the in-flight limit reached and waited for a slot.
        lag = {} if due is None else {"lag_ms": round(max(0.0, time.monotonic() - due) * 1e3, 1),
                                      **({"queued": True} if queued else {})}
        self.history.append("invoke", process, f, {
            "seq": req.seq, "stream": req.stream, "max_tokens": req.max_tokens,
            "prompt": req.prompt, "temperature": req.temperature, "canary": req.canary,
            "request_id": rid, **lag, **_plan_extras(req), **prepared.invoke})
        self.in_flight += 1
        try:
            outcome = await prepared.call()
        except asyncio.CancelledError:
            self.history.append("info", process, f, {"seq": req.seq},
                                "cancelled by the harness before an answer")
            raise
        except Exception as e:  # noqa: BLE001 - a harness bug must not lose the op
            outcome = Outcome("info", {}, f"harness error: {type(e).__name__}: {e}")
        finally:
            self.in_flight -= 1
        self.history.append(outcome.type, process, f,
                            {"seq": req.seq, **outcome.value}, outcome.error)

    async def report_progress(self, t0: float) -> None:
        """A progress line every ``progress_every_s`` (until cancelled)."""
        while True:
            await asyncio.sleep(self.progress_every_s)
            c = self.history.counts
            if self.progress:
                self.progress(f"load {time.monotonic() - t0:5.0f}s/{self.spec.duration_s:.0f}s: "
                              f"invoked {c['invoke']} ok {c['ok']} fail {c['fail']} "
                              f"info {c['info']} in flight {self.in_flight}")

    async def run(self, until: Callable[[], bool] | None = None,
                  max_s: float | None = None, t0: float | None = None) -> None:
        """Run for ``duration_s``, and on past it while ``until`` says False
        (e.g. a fault has not healed yet), but never past ``max_s``. The
        plan's times count from ``t0`` (time.monotonic(); default: now),
        which load workers share."""
        t0 = self.t0 = time.monotonic() if t0 is None else t0
        hard_stop = t0 + (max_s if max_s is not None else self.spec.duration_s)

        def over() -> bool:
            now = time.monotonic()
            if self._stop.is_set() or now >= hard_stop:
                return True
            return now - t0 >= self.spec.duration_s and (until is None or until())

        reporter = asyncio.create_task(self.report_progress(t0))
        client = self.make_client()
        try:
            if self.spec.mode == "closed":
                await self._closed(client, over)
            else:
                await self._open(client, t0, over)
        finally:
            reporter.cancel()
            await client.close()
        if self.history_failure is not None:
            raise self.history_failure

    def _mine(self, req: PlannedRequest) -> bool:
        i, n = self.share
        return n == 1 or req.seq % n == i

    async def _open(self, client: Any, t0: float, over: Callable[[], bool]) -> None:
        tasks: set[asyncio.Task[None]] = set()
        sem = asyncio.Semaphore(self.spec.max_in_flight)

        async def bounded(req: PlannedRequest) -> None:
            queued = sem.locked()
            async with sem:
                await self._one(client, req.seq, req, due=t0 + req.at_s, queued=queued)

        try:
            for req in plan_requests(self.spec):
                if not self._mine(req):
                    continue
                # uvloop's timers run on a millisecond clock and may wake a
                # little early: sleep until the request is due by our clock,
                # so none is sent early and none due past the duration goes.
                # At most ~1 ms of extra turns per request, each a sleep.
                delay = t0 + req.at_s - time.monotonic()
                while delay > 0:
                    await asyncio.sleep(delay)
                    delay = t0 + req.at_s - time.monotonic()
                if over() or (self.gate is not None and not await self.gate(t0 + req.at_s)):
                    break
                task = asyncio.create_task(bounded(req))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()

    async def _closed(self, client: Any, over: Callable[[], bool]) -> None:
        plan = (req for req in plan_requests(self.spec) if self._mine(req))

        async def loop(cid: int) -> None:
            while not over():
                if self.gate is not None and not await self.gate(time.monotonic()):
                    return
                await self._one(client, f"c{cid}", next(plan))

        i, n = self.share  # a worker's streams: c{i}, c{i+n}, ...
        await asyncio.gather(*(loop(c) for c in range(i, self.spec.concurrency, n)))
