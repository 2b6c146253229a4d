"""replica_errors: the replicas' own answers, from their served journals.
Planted 5xx answers outside any fault window fail the run even when a retry
answered each request in full afterwards (the client saw a success); inside
a window they are counted, not judged. And the planted server error of
Ordeal's middleware (the failure zoo's html_5xx_hidden_by_retries): POSTs
answered with the status and an HTML page, journaled; /health untouched.
The same shape against the real cluster: suites/test_zoo.py -m zoo."""

from __future__ import annotations

import asyncio
import json

from invariants import DEFAULT_CHECKERS, ReplicaErrors, RunContext
from ordeal.history.ops import MONITOR, NEMESIS, Op
from ordeal.planted import error_path, read_error

S = 1_000_000_000


def served(i, t, node, *entries):
    return Op(i, int(t * S), "w", "info", MONITOR, "served",
              {"node": node, "entries": [list(e) for e in entries]})


def nemesis(i, t, f, phase, kind="http_fault", target="router-replica-1"):
    return Op(i, int(t * S), "w", "info", NEMESIS, f,
              {"kind": kind, "target": target, "phase": phase})


def ok_answers(n, node="replica-0", t=1, start=0):
    return served(start, t, node, *[(f"ok-{node}-{t}-{k}", 200, True) for k in range(n)])


def test_replica_5xx_hidden_by_retries_fail_the_run():
    h = [ok_answers(100),
         served(1, 2, "replica-1", ("a", 503, True), ("b", 503, True)),
         served(2, 3, "replica-0", ("a", 200, True), ("b", 200, True))]
    r = ReplicaErrors().check(h, RunContext())
    assert r.valid is False, r.details
    d = r.details
    assert d["errors_outside_windows"] == 2 and d["retried_ok"] == 2
    assert d["by_node"] == {"replica-1": 2} and d["by_status"] == {"503": 2}
    assert d["violations"] == 2
    assert r.counterexamples[0]["index"] == 1
    assert "replica-1 answered 503 to request a outside any fault window" in \
        r.counterexamples[0]["problem"]
    assert ReplicaErrors in DEFAULT_CHECKERS


def test_errors_within_the_budget_or_inside_a_fault_window_pass():
    one_in_200 = [ok_answers(199), served(1, 2, "replica-1", ("x", 500, True))]
    r = ReplicaErrors().check(one_in_200, RunContext())
    assert r.valid is True and r.details["errors_outside_windows"] == 1  # 0.5% <= 1%
    windowed = [ok_answers(10), nemesis(1, 2, "inject", "begin"),
                served(2, 3, "replica-1", ("y", 503, True), ("z", 503, True)),
                nemesis(3, 4, "heal", "end"),
                served(4, 6, "replica-1", ("w", 502, True))]  # read 2 s after the heal
    r = ReplicaErrors().check(windowed, RunContext())
    assert r.valid is True and r.details["in_fault_windows"] == 3, r.details
    late = windowed + [served(5, 30, "replica-1", ("v", 503, True))]  # 26 s after it
    assert ReplicaErrors().check(late, RunContext()).valid is False


def test_no_journal_is_unknown():
    r = ReplicaErrors().check([nemesis(0, 1, "inject", "begin")], RunContext())
    assert r.valid == "unknown"


class App:
    """The app behind the middleware: answers 200 "ok" and says it ran."""

    def __init__(self):
        self.calls = []

    async def __call__(self, scope, receive, send):
        self.calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def call(mw, method, path, rid):
    sent = []
    body = [{"type": "http.request", "body": b'{"prompt": "x"}', "more_body": False}]

    async def receive():
        return body.pop(0) if body else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path,
             "headers": [(b"x-request-id", rid.encode())]}
    asyncio.run(mw(scope, receive, send))
    return sent


def test_the_planted_server_error_answers_posts_with_html_and_journals_them(tmp_path,
                                                                            monkeypatch):
    from engines.vllm.node_header import NodeHeaderMiddleware
    monkeypatch.setenv("ORDEAL_NODE", "replica-1")
    monkeypatch.setenv("ORDEAL_LOG_DIR", str(tmp_path))
    app = App()
    mw = NodeHeaderMiddleware(app)
    path = error_path(tmp_path, "replica-1")
    path.write_text("503")
    assert read_error(path) == 503
    sent = call(mw, "POST", "/v1/completions", "r1")
    assert sent[0]["status"] == 503 and (b"content-type", b"text/html") in sent[0]["headers"]
    assert b"<title>503 Service Unavailable</title>" in sent[1]["body"]
    assert app.calls == []  # never ran
    health = call(mw, "GET", "/health", "h1")
    assert health[0]["status"] == 200 and app.calls == ["/health"]
    path.unlink()
    mw.planted_checked = 0.0  # looked at once a second: look now
    assert call(mw, "POST", "/v1/completions", "r2")[0]["status"] == 200
    lines = [json.loads(x) for x in (tmp_path / "replica-1.served.jsonl").read_text().split("\n")
             if x]
    ends = [(x["rid"], x["status"]) for x in lines if x.get("phase") == "end"]
    assert ends == [("r1", 503), ("h1", 200), ("r2", 200)]
    path.write_text("200")  # not a server error: nothing planted
    assert read_error(path) == 0
