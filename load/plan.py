"""The seeded request plan (pure): ``plan_requests`` turns a WorkloadSpec
into the requests a run sends, each with its time (open loop) or its
client (closed loop), canaries among them. The same spec and seed give the
same plan, so a failure replays, and the engines' own clients (Triton's)
send the very plan the OpenAI client does."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Iterator

from load.spec import (
    ASSISTANT_PLACEHOLDER,
    CANARY_PROMPTS,
    WORDS,
    Conversation,
    Endpoint,
    WorkloadSpec,
)


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
