"""What the harness, fixed after this run (failover and fault_slo itemise every
window's violations; the known-findings section never says a failed invariant
held), says about this run's history: run from the repository root on the
full history (110 MB, not committed):

    python docs/examples/endurance-72h-x72-2026-12-03/rejudge.py reports/runs/20261203T132129Z-endurance-e6f4
"""
import json, sys
from invariants import Failover, RunContext
from invariants.fault_slo import FaultSLO
from invariants.known import read_known_findings
from ordeal.history.reader import read_history
from reports.summary import build_summary

run = sys.argv[1]
s = json.load(open(f"{run}/summary.json"))
checkers = [Failover(), FaultSLO()]
ctx = RunContext(run_id="rejudge")
for c in checkers:
    c.start(ctx)
for op in read_history(f"{run}/history.jsonl", on_error=lambda m: None):
    for c in checkers:
        c.feed(op)
new = {c.name: c.result().to_dict() for c in checkers}
for n, r in new.items():
    d = r["details"]
    print(n, r["valid"], "violations", d.get("violations"), "by_window sum", sum(d["violations_by_window"].values()), "windows", len(d["violations_by_window"]))
    print("   kinds:", sorted({w.split("@")[0] for w in d["violations_by_window"]}))
invs = [new.get(i["name"], i) if i["name"] in new else {k: v for k, v in i.items() if k != "known"} for i in s["invariants"]]
kf = read_known_findings("suites/known_findings/vllm-0.32.0+vllm-router-0.1.17.toml")
out = kf.apply(invs, s["faults"])
print("matched", [(m["invariant"], m["fault"], m["violations"]) for m in out["matched"]])
print("not_seen", [(m["invariant"], m["fault"], m["why"][:40]) for m in out["not_seen"]])
for i in invs:
    if i["valid"] is not True:
        print(" ", i["name"], i["valid"], "known" if i.get("known") else "")
summ = build_summary(run_id="r", suite="s", started="", ended="", cluster={}, counts={},
                     nemesis_counts={}, faults=[], invariants=invs, workload={})
print("verdict", summ["verdict"])
