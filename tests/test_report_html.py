"""report.html and ``python -m reports``.

The unit tests build run directories from synthetic histories (hostile
model output, damaged lines, 10^5 ops over 72 hours); the cluster test
renders the report of a real short run and looks at it in headless
Chromium (Debian's ``chromium`` package): a screenshot that is not blank
and a DOM with the verdict and drawn plots.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ordeal.history.ops import Op
from ordeal.history.writer import History
from reports.__main__ import main as cli
from reports.collect import CLOUD_POINTS, MAX_BUCKETS
from reports.findings import findings_of
from reports.html import render_report
from reports.run_dir import RunDir
from reports.summary import build_summary

SCRIPT = "<script>alert(1)</script>"
BOLD = "<b>bold</b>"
IMG = '<img src=x onerror="alert(2)">'
SECRET = "Bearer sk-SECRET-TOKEN-123"


def summary_for(run_id: str, *, started: str = "2026-12-01T00:00:00.000Z",
                ended: str = "2026-12-01T00:00:20.000Z", invariants: list | None = None,
                ok: int = 10) -> dict:
    invs = invariants if invariants is not None else [
        {"name": "no_silent_loss", "valid": True, "details": {"invoked": ok},
         "counterexamples": []}]
    return build_summary(
        run_id=run_id, suite="test_synthetic", started=started, ended=ended,
        cluster={"backend": "local", "engine": "vllm",
                 "nodes": [{"name": "replica-0", "role": "replica",
                            "url": "http://user:pw@127.0.0.1:1", "fingerprint": "vllm-x"}]},
        counts={"invoke": ok, "ok": ok}, nemesis_counts={"info": 4}, faults=[],
        invariants=invs, workload={"rate": 4.0, "duration_s": 20.0})


def hostile_run(root: Path) -> RunDir:
    """A short real-format history whose model output, errors and node
    names carry HTML, and whose invokes carry an auth header."""
    rd = RunDir.create(root, "hostile")
    with History(rd.history_path) as h:
        h.append("info", "monitor", "sample", {"node": "replica-0", "health": 200,
                                               "rss_bytes": 10**9,
                                               "metrics": {"vllm:num_requests_running": 1.0}})
        for i in range(6):
            h.append("invoke", i, "completions", {"prompt": f"say {BOLD}", "request_id": f"r{i}",
                                                  "headers": {"authorization": SECRET}})
            # Even ops: each event's text as a column (``texts``); odd ones as
            # histories before 2026-12-05 kept it (a dict per event).
            stream = ({"texts": [SCRIPT, BOLD]} if i % 2 == 0 else
                      {"chunks": [{"t_ms": 5.0, "text": SCRIPT, "n_tokens": 1},
                                  {"t_ms": 9.0, "text": BOLD, "n_tokens": 1}]})
            h.append("ok", i, "completions", {"node": "replica-0", "status": 200, "ttft_ms": 5.0,
                                              "e2e_ms": 12.0 + i, "itl_ms": [4.0],
                                              "stream": stream})
        h.append("info", "nemesis", "inject", {"kind": "http_fault", "target": f"link{IMG}",
                                               "phase": "begin"})
        h.append("invoke", 9, "chat", {"prompt": "x", "request_id": "r9",
                                       "headers": {"Authorization": SECRET}})
        h.append("fail", 9, "chat", {"node": "replica-<i>0</i>", "status": 400},
                 error=f"http 400: {IMG} {SCRIPT}")
        h.append("info", "nemesis", "heal", {"kind": "http_fault", "target": f"link{IMG}",
                                             "phase": "end"})
        h.append("info", "monitor", "sample", {"node": "replica-<i>0</i>", "health": 503})
    cx = {"problem": f"got {SCRIPT}", "index": 3, "got": f"{BOLD}{SCRIPT}", "golden": "ok"}
    rd.write_summary(summary_for(rd.run_id, ok=6, invariants=[
        {"name": "canary_determinism", "valid": False, "details": {"canaries": 6},
         "counterexamples": [cx]}]))
    return rd


def test_untrusted_text_is_escaped_and_secrets_never_reach_the_page(tmp_path):
    rd = hostile_run(tmp_path)
    page = render_report(rd.path).read_text()
    assert "<script" not in page.lower()  # the page has no script of its own either
    assert BOLD not in page and "<i>0</i>" not in page and "<img" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # shown, as text
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    assert "SECRET-TOKEN" not in page and "user:pw" not in page
    assert "Verdict: FAIL" in page
    assert 'href="#op-3"' in page and 'id="op-3"' in page  # counterexample -> ops around it
    assert 'id="op-15"' in page and "fail: http 400" in page  # the failed request, in context
    assert "http_fault@link&lt;img" in page  # fault window label, escaped


def test_page_is_self_contained(tmp_path):
    page = render_report(hostile_run(tmp_path).path).read_text()
    assert not re.search(r"(src|href)\s*=\s*\"?(https?:)?//", page)  # nothing fetched
    assert "<svg" in page and "<path" in page and "<circle" in page


def write_long_history(path: Path, n_ops: int, span_s: float) -> None:
    """n_ops ops spread over span_s seconds, in the history's own format
    (written directly: History stamps the real clock, and 72 hours are
    simulated here). Requests, a monitor sample every 200 ops, and a fault
    window every 10,000 ops."""
    step = int(span_s * 1e9 / n_ops)
    t0 = 10**12
    with path.open("w") as f:
        i = 0
        while i < n_ops:
            t = t0 + i * step
            if i % 10_000 == 0:
                kind = "inject" if (i // 10_000) % 2 == 0 else "heal"
                phase = "begin" if kind == "inject" else "end"
                op = Op(i, t, "w", "info", "nemesis", kind,
                        {"kind": "process_pause", "target": "replica-1", "phase": phase})
            elif i % 200 == 0:
                op = Op(i, t, "w", "info", "monitor", "sample",
                        {"node": f"replica-{i % 2}", "health": 200, "rss_bytes": 2e9 + i,
                         "metrics": {"vllm:kv_cache_usage_perc": 0.1}})
            elif i % 2 == 1:
                op = Op(i, t, "w", "invoke", i % 7, "completions", {"prompt": "p" * 50})
            else:
                kind = "fail" if i % 97 == 0 else "ok"
                op = Op(i, t, "w", kind, (i - 1) % 7, "completions",
                        {"node": "replica-0", "ttft_ms": 10 + i % 50, "e2e_ms": 50 + i % 300,
                         "itl_ms": [3.0, 4.0, 5.0], "stream": {"chunks": [{"text": "x" * 40}]}},
                        error="http 500: boom" if kind == "fail" else None)
            f.write(op.to_json() + "\n")
            i += 1


@pytest.mark.parametrize("claimed_s", [72 * 3600, 60], ids=["summary-72h", "summary-says-60s"])
def test_a_72_hour_history_gives_a_small_report(tmp_path, claimed_s):
    """Bounded whatever the run's length, also when the summary's duration
    is wrong (the buckets then coarsen as the history goes on)."""
    rd = RunDir.create(tmp_path, "long")
    write_long_history(rd.history_path, 100_000, 72 * 3600)
    ended = "2026-12-04T00:00:00.000Z" if claimed_s > 60 else "2026-12-01T00:01:00.000Z"
    rd.write_summary(summary_for(rd.run_id, ended=ended))
    assert rd.history_path.stat().st_size > 15_000_000
    page = render_report(rd.path).read_text()
    assert len(page.encode()) < 400_000, len(page.encode())
    assert page.count("<circle") <= 2 * CLOUD_POINTS
    m = re.search(r"([\d.]+) s buckets", page)
    assert m and 72 * 3600 / float(m.group(1)) <= MAX_BUCKETS
    assert "process_pause@replica-1" in page and "info: http 500" not in page
    assert "fail: http 500" in page  # the error kind is plotted


def test_damaged_history_and_summary_never_raise_and_say_what_is_wrong(tmp_path):
    rd = hostile_run(tmp_path)
    with rd.history_path.open("a") as f:
        f.write("{not json}\n")
        f.write('{"index": 99, "time_ns": 1, "wall": "w", "type": "bogus", '
                '"process": 1, "f": "x"}\n')
        f.write('{"index": 100, "time_')  # torn tail
    rd.summary_path.write_text('{"verdict": "pass", "invariants": [')  # torn summary
    page = render_report(rd.path).read_text()
    assert "summary.json is damaged" in page
    assert "torn final line" in page and "not a valid op" in page
    assert "<svg" in page  # what could be read is still drawn
    (rd.history_path).unlink()
    rd.summary_path.unlink()
    page = render_report(rd.path).read_text()
    assert "history.jsonl is missing" in page and "summary.json is missing" in page


def run_cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli(list(args), out=out), out.getvalue()


def two_runs(root: Path) -> tuple[RunDir, RunDir]:
    a = hostile_run(root)
    b = RunDir.create(root, "second")
    with History(b.history_path) as h:
        h.append("invoke", 0, "completions", {"prompt": "x"})
        h.append("ok", 0, "completions", {"e2e_ms": 5.0, "ttft_ms": 1.0})
    b.write_summary(summary_for(b.run_id, ok=1, invariants=[
        {"name": "canary_determinism", "valid": True, "details": {"canaries": 1},
         "counterexamples": []}]))
    return a, b


def test_cli_list_show_compare_render_open(tmp_path):
    a, b = two_runs(tmp_path)
    rc, out = run_cli("--runs-dir", str(tmp_path), "list")
    assert rc == 0 and a.run_id in out and b.run_id in out and "fail" in out and "pass" in out
    rc, out = run_cli("--runs-dir", str(tmp_path), "show")  # latest = b
    assert rc == 0 and b.run_id in out and "PASS" in out and "canary_determinism" in out
    rc, out = run_cli("--runs-dir", str(tmp_path), "show", a.run_id)
    assert rc == 1 and "FAIL" in out and "1 counterexamples" in out  # exit 1: fail
    rc, out = run_cli("--runs-dir", str(tmp_path), "compare", a.run_id, b.run_id)
    assert rc == 0 and "differs" in out and "canaries=6" in out and "canaries=1" in out
    assert run_cli("--runs-dir", str(tmp_path), "open")[0] == 2  # not rendered yet
    rc, out = run_cli("--runs-dir", str(tmp_path), "render")
    assert rc == 0 and (b.path / "report.html").exists()
    rc, out = run_cli("--runs-dir", str(tmp_path), "open")
    assert rc == 0 and out.strip().endswith(f"{b.run_id}/report.html")
    rc, out = run_cli("--runs-dir", str(tmp_path), "render", str(a.path))  # a path works too
    assert rc == 0 and (a.path / "report.html").exists()


def test_a_pass_with_a_scope_says_what_it_left_out_first(tmp_path):
    """Issue 47: right under the verdict (report.html) and before anything
    else of the run (``reports show``): each invariant not judged, why, and
    whether --require-judged named it."""
    rd = RunDir.create(tmp_path, "scoped")
    with History(rd.history_path) as h:
        h.append("invoke", 0, "completions", {"prompt": "x"})
        h.append("ok", 0, "completions", {"e2e_ms": 5.0, "ttft_ms": 1.0})
    why = {"node_attribution": "the replicas do not name <themselves>"}
    summary = summary_for(rd.run_id, ok=1, invariants=[
        {"name": "goodput", "valid": True, "details": {}, "counterexamples": []},
        {"name": "failover", "valid": "unknown", "details": {"not_judgeable": why},
         "counterexamples": []}])
    assert summary["verdict"] == "pass"
    rd.write_summary(summary)
    render_report(rd.path)
    page = (rd.path / "report.html").read_text()
    verdict, scope, suite = (page.index('id="verdict"'), page.index('id="scope"'),
                             page.index("suite <b>"))
    assert verdict < scope < suite
    assert "1 invariant(s) not judged" in page and "&lt;themselves&gt;" in page
    rc, out = run_cli("show", str(rd.path))
    lines = out.splitlines()
    assert rc == 0 and lines[3] == "verdict  PASS", lines
    assert lines[4].startswith("scope    not judged: failover: node_attribution: the"), lines


def test_show_puts_findings_first_marks_known_ones_and_folds_faults(tmp_path):
    """Issue 43: the verdict, then findings (a known one marked, with its
    bounds beside the figure), invariants, then faults by kind; --faults
    lists each; exit 0 pass, 1 fail, 2 unknown."""
    rd = RunDir.create(tmp_path, "findings")
    with History(rd.history_path) as h:
        h.append("invoke", 0, "completions", {"prompt": "x"})
        h.append("ok", 0, "completions", {"e2e_ms": 5.0, "ttft_ms": 1.0})
    known = [{"reason": "vllm-router ejects after ~6 s", "bounds": {"max_ejection_s": 9.0},
              "measured": {"max_ejection_s": 6.2}, "beyond": []}]
    summary = summary_for(rd.run_id, ok=1, invariants=[
        {"name": "failover", "valid": False, "known": known, "details": {"windows": 3},
         "counterexamples": [{"index": 7, "problem": "sent to replica-1 6.2s after"}]},
        {"name": "goodput", "valid": False, "details": {"goodput": 0.5},
         "counterexamples": [{"index": 9, "problem": "half missed"}]}])
    summary["faults"] = [{"kind": "process_pause", "target": f"replica-{i % 2}",
                          "injected": "t0", "healed": "t1"} for i in range(5)]
    summary["findings"] = findings_of(summary)
    rd.write_summary(summary)
    rc, out = run_cli("show", str(rd.path))
    lines = out.splitlines()
    assert rc == 1 and lines[3] == "verdict  FAIL", lines
    assert lines[4].startswith("known    failover: the router kept sending") and (
        "bounds: max_ejection_s 6.2 <= 9" in lines[4]), lines
    assert lines[5].startswith("FINDING  goodput: too few requests"), lines
    assert out.index("invariants:") < out.index("faults   process_pause x5 on replica-0, "
                                                 "replica-1")
    rc, every = run_cli("show", "--faults", str(rd.path))
    assert every.count("fault    process_pause on replica-") == 5
    summary["verdict"] = "unknown"
    rd.write_summary(summary)
    assert run_cli("show", str(rd.path))[0] == 2


def test_cli_errors_are_clear(tmp_path, capsys):
    a, _ = two_runs(tmp_path)
    assert run_cli("--runs-dir", str(tmp_path), "show", "no-such-run")[0] == 2
    assert "unknown run 'no-such-run'" in capsys.readouterr().err
    assert run_cli("--runs-dir", str(tmp_path), "show", "hostile")[0] == 2
    assert "runs matching: " + a.run_id in capsys.readouterr().err
    a.summary_path.write_text("{torn")
    assert run_cli("--runs-dir", str(tmp_path), "show", a.run_id)[0] == 2
    assert "summary.json is damaged" in capsys.readouterr().err
    rc, out = run_cli("--runs-dir", str(tmp_path), "list")
    assert rc == 0 and "damaged" in out
    assert run_cli("--runs-dir", str(tmp_path / "none"), "show")[0] == 2
    assert "no runs directory" in capsys.readouterr().err


# --- the real thing: a real run's report in a real browser ---------------------------------

def no_chromium() -> str | None:
    """Asked when the test is set up (``needs``: under CI a missing chromium
    fails the test, elsewhere it skips)."""
    if shutil.which("chromium") is None:
        return ("chromium is not installed: the screenshot test needs Debian's `chromium` "
                "package (apt-get install -y chromium)")
    return None


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [shutil.which("chromium") or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", *args],
        check=False, capture_output=True, text=True, timeout=120)


@pytest.mark.cluster
@pytest.mark.needs("chromium", no_chromium)
def test_real_run_report_renders_in_headless_chromium(ordeal_cluster, tmp_path):
    from load.spec import WorkloadSpec
    from runs.run import OrdealRun

    run = OrdealRun(RunDir.create(tmp_path / "runs", "report_screenshot"), "report_screenshot",
                    ordeal_cluster, progress=lambda _: None)
    run.load(WorkloadSpec(duration_s=8.0, rate=4.0, seed=0))
    run.check()
    summary = run.finish()
    assert summary["ops"]["ok"] > 10  # a real run: the cluster answered
    report = render_report(run.run_dir.path)
    url = report.resolve().as_uri()

    png = tmp_path / "report.png"
    shot = chromium(tmp_path, f"--screenshot={png}", "--window-size=1200,2000", url)
    assert png.exists() and png.stat().st_size > 20_000, shot.stderr[-2000:]
    from PIL import Image  # in the venv (a dependency of vLLM)

    with Image.open(png) as im:
        assert im.size == (1200, 2000)
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20) or []
        assert len(colours) > 50  # text, tables and plots, not a blank page
        badge = {"pass": (0x2C, 0xA0, 0x2C), "fail": (0xD6, 0x27, 0x28)}.get(
            summary["verdict"], (0xE6, 0x95, 0x00))
        top = rgb.crop((0, 0, 1200, 200)).getcolors(maxcolors=1 << 20) or []
        assert any(c == badge and n > 500 for n, c in top), "verdict badge not visible at the top"

    dom = chromium(tmp_path, "--dump-dom", url).stdout
    assert f"Verdict: {summary['verdict'].upper()}" in dom
    assert dom.count("<svg") >= 5
    drawn = re.findall(r'<path class="line" d="M[\d.]+,[\d.]+L', dom)
    assert len(drawn) >= 4, "no plot line was drawn"
    assert dom.count("<circle") >= 10  # the latency point cloud
    for name in ("replica-0", "replica-1"):
        assert name in dom  # per-node health
