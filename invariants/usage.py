"""Usage is honest: the tokens the engine bills (``usage.completion_tokens``)
are the tokens it streamed, and never more than ``max_tokens``.

The exact check needs the token ids of every chunk (vLLM sends them with
``return_token_ids``): vLLM merges several tokens into one chunk when the
client reads slower than the engine writes, so chunks are not tokens. Without
token ids the check falls back to what still must hold (at least one chunk,
no more chunks than tokens) and says so in ``details["exactness"]``.

Every stream the workload sends asks for usage (``stream_options.include_usage``).
An ``ok`` stream that ended without it, in a run where the stack gave usage
on other answers, is a violation (``streams_without_usage``): its end was not
the engine's (failure zoo: a truncated stream "completed" by a proxy,
faults/zoo/truncation_looks_complete.py). A stack that never gives usage
stays "unknown", as before.
"""

from __future__ import annotations

from typing import Any

from ordeal.history.ops import HARNESS, Op, stream_texts

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker, op_brief


def usage_problems(value: dict[str, Any], limit: int) -> tuple[str, list[str]]:
    """Judge the billing of one ``ok`` completion's ``value``; ``limit`` is its
    invoke's ``max_tokens`` (0: unknown). Pure. Returns how it could be checked
    ("no_usage", "unstreamed", "exact" or "bounded_only") and the problems."""
    usage = value.get("usage") or {}
    billed = usage.get("completion_tokens")
    if not isinstance(billed, int):
        return "no_usage", []
    found: list[str] = []
    if limit and billed > limit:
        found.append(f"completion_tokens {billed} > max_tokens {limit}")
    if value.get("finish_reason") == "length" and limit and billed != limit:
        found.append(f"finish_reason 'length' but {billed} tokens of max_tokens {limit}")
    stream = value.get("stream")
    if not isinstance(stream, dict):
        return "unstreamed", found
    streamed = stream.get("n_token_ids")
    if isinstance(streamed, int):
        if streamed != billed:
            found.append(f"streamed {streamed} token ids but usage says {billed}")
        return "exact", found
    content = sum(1 for text in stream_texts(stream) if text)
    if not 1 <= content <= billed:
        found.append(f"{content} content chunks for {billed} billed tokens")
    return "bounded_only", found


class UsageMatchesTokens(StreamingChecker):
    name = "usage_matches_tokens"

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.max_tokens: dict[Any, int] = {}
        self.counts = {"checked": 0, "exact": 0, "bounded_only": 0, "no_usage": 0,
                       "streams_without_usage": 0, "violations": 0}
        self.examples: list[dict[str, Any]] = []
        self.unbilled: list[dict[str, Any]] = []  # streams without usage, judged at the end

    def _bad(self, op: Op, why: str) -> None:
        self.counts["violations"] += 1
        if len(self.examples) < MAX_COUNTEREXAMPLES:
            self.examples.append({"problem": why, **op_brief(op)})

    def feed(self, op: Op) -> None:
        if op.process in HARNESS:
            return
        if op.type == "invoke":
            self.max_tokens[op.process] = int(op.value.get("max_tokens") or 0)
            return
        limit = self.max_tokens.pop(op.process, 0)
        if op.type != "ok":
            return
        how, problems = usage_problems(op.value, limit)
        if how == "no_usage":
            self.counts["no_usage"] += 1
            if isinstance(op.value.get("stream"), dict):
                self.counts["streams_without_usage"] += 1
                if len(self.unbilled) < MAX_COUNTEREXAMPLES:
                    self.unbilled.append({"problem": "the stream asked for usage "
                                          "(include_usage) and ended without it",
                                          **op_brief(op)})
            return
        self.counts["checked"] += 1
        if how in ("exact", "bounded_only"):
            self.counts[how] += 1
        for why in problems:
            self._bad(op, why)

    def result(self) -> Result:
        c = self.counts
        exactness = ("exact: every stream carried token ids" if c["bounded_only"] == 0
                     else f"{c['bounded_only']} stream(s) without token ids checked only "
                          "as 1 <= content chunks <= billed tokens")
        examples = list(self.examples)
        violations = c["violations"]
        if c["checked"] and c["streams_without_usage"]:
            # the stack gives usage: an answer that came without it did not end
            # as the engine ended it (result() may be asked again: nothing kept)
            violations += c["streams_without_usage"]
            examples += self.unbilled[:max(0, MAX_COUNTEREXAMPLES - len(examples))]
        details = {**c, "violations": violations, "exactness": exactness}
        if violations:
            return Result(self.name, False, details, examples)
        return Result(self.name, True if c["checked"] else "unknown", details)
