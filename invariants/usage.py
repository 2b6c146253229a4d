"""Usage is honest: the tokens the engine bills (``usage.completion_tokens``)
are the tokens it streamed, and never more than ``max_tokens``.

The exact check needs the token ids of every chunk (vLLM sends them with
``return_token_ids``): vLLM merges several tokens into one chunk when the
client reads slower than the engine writes, so chunks are not tokens. Without
token ids the check falls back to what still must hold (at least one chunk,
no more chunks than tokens) and says so in ``details["exactness"]``.
"""

from __future__ import annotations

from typing import Any, Iterable

from ordeal.history import NEMESIS, Op

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, op_brief


class UsageMatchesTokens:
    name = "usage_matches_tokens"

    def check(self, history: Iterable[Op], ctx: RunContext) -> Result:
        max_tokens: dict[Any, int] = {}
        counts = {"checked": 0, "exact": 0, "bounded_only": 0, "no_usage": 0, "violations": 0}
        examples: list[dict[str, Any]] = []

        def bad(op: Op, why: str) -> None:
            counts["violations"] += 1
            if len(examples) < MAX_COUNTEREXAMPLES:
                examples.append({"problem": why, **op_brief(op)})

        for op in history:
            if op.process == NEMESIS:
                continue
            if op.type == "invoke":
                max_tokens[op.process] = int(op.value.get("max_tokens") or 0)
                continue
            limit = max_tokens.pop(op.process, 0)
            if op.type != "ok":
                continue
            usage = op.value.get("usage") or {}
            billed = usage.get("completion_tokens")
            if not isinstance(billed, int):
                counts["no_usage"] += 1
                continue
            counts["checked"] += 1
            if limit and billed > limit:
                bad(op, f"completion_tokens {billed} > max_tokens {limit}")
            if op.value.get("finish_reason") == "length" and limit and billed != limit:
                bad(op, f"finish_reason 'length' but {billed} tokens of max_tokens {limit}")
            stream = op.value.get("stream")
            if not isinstance(stream, dict):
                continue
            streamed = stream.get("n_token_ids")
            if isinstance(streamed, int):
                counts["exact"] += 1
                if streamed != billed:
                    bad(op, f"streamed {streamed} token ids but usage says {billed}")
            else:
                counts["bounded_only"] += 1
                content = sum(1 for c in stream.get("chunks", []) if c.get("text"))
                if not 1 <= content <= billed:
                    bad(op, f"{content} content chunks for {billed} billed tokens")
        exactness = ("exact: every stream carried token ids" if counts["bounded_only"] == 0
                     else f"{counts['bounded_only']} stream(s) without token ids checked only "
                          "as 1 <= content chunks <= billed tokens")
        details = {**counts, "exactness": exactness}
        if counts["violations"]:
            return Result(self.name, False, details, examples)
        return Result(self.name, True if counts["checked"] else "unknown", details)
