"""Greedy canaries are deterministic: every greedy canary answer equals the
golden answer recorded for its prompt at the start of the run.

vLLM does not promise batch invariance: greedy output may change with the
batch a request lands in. The tolerance is therefore a setting, stated in
the result: ``exact`` (whole text) or the first ``k`` tokens. On the tiny CPU
model greedy output was measured identical under concurrent load, direct and
through the router (tests/test_real_cluster.py), so the default is exact.
"""

from __future__ import annotations

from typing import Any

from ordeal.history.ops import HARNESS, Op

from .base import MAX_COUNTEREXAMPLES, Result, RunContext, StreamingChecker, op_brief


class CanaryDeterminism(StreamingChecker):
    name = "canary_determinism"

    def start(self, ctx: RunContext) -> None:
        super().start(ctx)
        self.k = ctx.settings.determinism_prefix_tokens
        self.prompts: dict[Any, str] = {}
        self.golden: dict[str, dict[str, Any]] = {}
        self.counts = {"canaries": 0, "matched": 0, "differed": 0}
        self.examples: list[dict[str, Any]] = []

    def feed(self, op: Op) -> None:
        if op.process in HARNESS:
            return
        if op.type == "invoke":
            if op.value.get("canary"):
                self.prompts[op.process] = str(op.value.get("prompt"))
            return
        prompt = self.prompts.pop(op.process, None)
        if prompt is None or op.type != "ok" or "text" not in op.value:
            return
        self.counts["canaries"] += 1
        answer = {"text": op.value["text"], "token_ids": op.value.get("token_ids"),
                  "index": op.index, "node": op.value.get("node")}
        base = self.golden.setdefault(prompt, answer)
        if base is answer:
            return
        if self._same(base, answer, self.k):
            self.counts["matched"] += 1
        else:
            self.counts["differed"] += 1
            if len(self.examples) < MAX_COUNTEREXAMPLES:
                self.examples.append({"prompt": prompt, "golden": base["text"][:200],
                                      "golden_index": base["index"],
                                      "got": answer["text"][:200], "node": answer["node"],
                                      **op_brief(op)})

    def result(self) -> Result:
        tolerance = "exact text" if not self.k else f"first {self.k} token ids"
        details = {**self.counts, "prompts": len(self.golden), "tolerance": tolerance,
                   "why": "greedy output of this engine measured identical under load"
                          if not self.k else "engine not batch invariant; prefix compared"}
        if self.counts["differed"]:
            return Result(self.name, False, details, self.examples)
        return Result(self.name, True if self.counts["matched"] else "unknown", details)

    @staticmethod
    def _same(a: dict[str, Any], b: dict[str, Any], k: int) -> bool:
        if not k:
            return a["text"] == b["text"]
        if a["token_ids"] is None or b["token_ids"] is None:
            return a["text"] == b["text"]
        return a["token_ids"][:k] == b["token_ids"][:k]
