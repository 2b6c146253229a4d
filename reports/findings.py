"""Findings: what the system did wrong, one entry per failed invariant, for
the top of summary.json (``findings``) and of report.html.

Each says in one sentence what went wrong (what the invariant guards, then
its first counterexample), with the invariant's leading figures, a few
example ops (their index in history.jsonl), whether a known-findings file
lists it (then it is not in the verdict; ``known_bounds``: each finding's
bounds beside the worst figure it covered), whether a known finding names
its fault window but a figure was beyond its bound (``beyond_known``: the
figure beside the bound; then it is a new finding, in the verdict), and the
command that runs the same test again (``replay``, set by the pytest
plugin). Pure: it reads a summary dict and nothing else.
"""

from __future__ import annotations

from typing import Any

#: What each invariant's failure means for a user of the stack.
WHAT = {
    "no_silent_loss": "requests were sent and never completed",
    "stream_wellformed": "a stream broke the SSE or OpenAI format",
    "usage_matches_tokens": "the tokens billed differ from the tokens delivered",
    "no_duplicate_execution": "a request ran more than once on the servers",
    "replica_errors": "a replica answered server errors outside any fault window (a router's "
                      "retries may have hidden them from the clients)",
    "canary_determinism": "the same greedy request got different answers",
    "stream_continuity": "a stream cut by a fault ended as a success with fewer tokens, or "
                         "failed without a cause",
    "slo_latency": "latency missed its target in steady state",
    "goodput": "too few requests met every SLO target in steady state",
    "error_rate": "too many requests failed in steady state",
    "availability": "too few requests succeeded inside a fault window",
    "recovery": "the SLO did not hold again soon enough after a heal",
    "restart_readiness": "a restarted node did not serve again within its bound",
    "failover": "the router kept sending new requests to a replica that had stopped "
                "answering, past the failover bound, or did not take it back",
    "fault_slo": "while a replica was down, the requests sent after the failover bound "
                 "missed their targets: the replicas left did not carry the load",
    "no_orphans": "a process of a killed node lived on past the bound (it holds memory, "
                  "a device and the port the restart needs)",
    "health_truthful": "/health said healthy while the replica made no progress",
    "counters_monotonic": "a server counter went backwards without a restart",
    "leak_bound": "memory after the load stayed above its bound",
    "sequence_consistent": "the server continued a sequence from state the client did not "
                           "build",
    "engine_consistency": "the engine's own counts disagree with what the client saw",
}
MAX_FIGURES = 6
MAX_EXAMPLES = 3


def findings_of(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One finding per invariant whose result is false, known ones included
    (marked), in the order of the invariants."""
    out = []
    for inv in summary.get("invariants") or []:
        if not isinstance(inv, dict) or inv.get("valid") is not False:
            continue
        name = str(inv.get("name"))
        examples = [c for c in inv.get("counterexamples") or [] if isinstance(c, dict)]
        first = examples[0].get("problem") or examples[0].get("why") if examples else None
        what = WHAT.get(name, f"{name} is false")
        details = inv.get("details") if isinstance(inv.get("details"), dict) else {}
        figures = {k: v for k, v in details.items()
                   if isinstance(v, (str, int, float, bool)) or v is None}
        known = inv.get("known")
        out.append({
            "invariant": name,
            "what": f"{what}" + (f": {first}" if first else ""),
            "known": [f.get("reason") for f in known if isinstance(f, dict)]
            if isinstance(known, list) else None,
            "known_bounds": [bounds_text(f) for f in known if isinstance(f, dict)]
            if isinstance(known, list) else None,
            "beyond_known": [f"{b.get('window')}: {bounds_text(b)}, beyond the known finding "
                             f"{b.get('reason')!r}" for b in inv.get("beyond_known") or []
                             if isinstance(b, dict)],
            "figures": dict(list(figures.items())[:MAX_FIGURES]),
            "examples": [{k: c.get(k) for k in ("index", "wall", "window", "problem")
                          if c.get(k) is not None} for c in examples[:MAX_EXAMPLES]],
            "replay": summary.get("replay"),
        })
    return out


def bounds_text(entry: dict[str, Any]) -> str:
    """A known finding's bounds beside what was measured (invariants.known:
    ``bounds``, ``measured`` keyed by bound, ``beyond`` the bounds exceeded):
    ``max_ejection_s 59.5 > 9`` or ``max_ejection_s 6.2 <= 9``."""
    bounds = entry.get("bounds") if isinstance(entry.get("bounds"), dict) else {}
    measured = entry.get("measured") if isinstance(entry.get("measured"), dict) else {}
    over = entry.get("beyond") if isinstance(entry.get("beyond"), list) else []
    parts = []
    for key, limit in bounds.items():
        value = measured.get(key)
        if not isinstance(value, (int, float)) or not isinstance(limit, (int, float)):
            parts.append(f"{key} not measured, bound {limit} (beyond)")
            continue
        floor = str(key).startswith("min_")
        rel = ("<" if floor else ">") if key in over else (">=" if floor else "<=")
        parts.append(f"{key} {value:g} {rel} {limit:g}")
    parts += [f"{key}: {measured.get(key)} (no known finding covers it)"
              for key in over if key not in bounds]
    return "; ".join(parts) if parts else "no bound (any size)"
