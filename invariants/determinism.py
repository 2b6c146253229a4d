"""Greedy canaries are deterministic: every greedy canary answer equals the
golden answer recorded for its prompt at the start of the run.

vLLM does not promise batch invariance: greedy output may change with the
batch a request lands in. The tolerance is therefore a setting, stated in
the result: ``exact`` (whole text) or the first ``k`` tokens. On the tiny CPU
model greedy output was measured identical under concurrent load, direct and
through the router (tests/test_real_cluster.py), so the default is exact.
"""

from __future__ import annotations

from typing import Any, Iterable

from ordeal.history import NEMESIS, Op

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, op_brief


class CanaryDeterminism:
    name = "canary_determinism"

    def check(self, history: Iterable[Op], ctx: RunContext) -> Result:
        k = ctx.extra.get("determinism_prefix_tokens")
        prompts: dict[Any, str] = {}
        golden: dict[str, dict[str, Any]] = {}
        counts = {"canaries": 0, "matched": 0, "differed": 0}
        examples: list[dict[str, Any]] = []
        for op in history:
            if op.process == NEMESIS:
                continue
            if op.type == "invoke":
                if op.value.get("canary"):
                    prompts[op.process] = str(op.value.get("prompt"))
                continue
            prompt = prompts.pop(op.process, None)
            if prompt is None or op.type != "ok" or "text" not in op.value:
                continue
            counts["canaries"] += 1
            answer = {"text": op.value["text"], "token_ids": op.value.get("token_ids"),
                      "index": op.index, "node": op.value.get("node")}
            base = golden.setdefault(prompt, answer)
            if base is answer:
                continue
            if self._same(base, answer, k):
                counts["matched"] += 1
            else:
                counts["differed"] += 1
                if len(examples) < MAX_COUNTEREXAMPLES:
                    examples.append({"prompt": prompt, "golden": base["text"][:200],
                                     "golden_index": base["index"], "got": answer["text"][:200],
                                     "node": answer["node"], **op_brief(op)})
        tolerance = ("exact text" if not k else f"first {k} token ids")
        details = {**counts, "prompts": len(golden), "tolerance": tolerance,
                   "why": "greedy output of this engine measured identical under load"
                          if not k else "engine not batch invariant; prefix compared"}
        if counts["differed"]:
            return Result(self.name, False, details, examples)
        return Result(self.name, True if counts["matched"] else "unknown", details)

    @staticmethod
    def _same(a: dict[str, Any], b: dict[str, Any], k: int | None) -> bool:
        if not k:
            return a["text"] == b["text"]
        if a["token_ids"] is None or b["token_ids"] is None:
            return a["text"] == b["text"]
        return a["token_ids"][:k] == b["token_ids"][:k]
