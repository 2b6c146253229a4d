"""``python -m reports``: the run store from a terminal.

    list               runs, newest first: verdict, suite, start, ops
    show [RUN]         a run's summary (latest by default)
    compare RUN_A RUN_B  invariants and key figures side by side
    compare-baseline RUN BASELINE [--thresholds FILE] [--all] [--json]
                       qualify RUN against an earlier run: regressions per
                       invariant and SLO figure (reports/baseline.py);
                       exit 0 pass, 1 regressed, 2 bad input
    render [RUN]       (re)write the run's report.html
    open               print the path of the latest report.html (no browser:
                       these machines have none, and CI must not start one)

RUN is a run id under the runs directory, ``latest``, or a path to a run
directory. ``--runs-dir`` defaults to ./reports/runs, where a pytest run from
this directory writes (in a checkout: the one beside this package).
Exit status: 0 done, 2 a missing or unknown run or a damaged summary
(compare-baseline: 1 when the run regressed).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ordeal.config import ConfigError

from .baseline import Comparison, load_baseline
from .baseline import compare as compare_baseline
from .html import load_summary, render_report
from .html_common import REPORT_NAME
from .thresholds import load_thresholds

#: Where the plugin writes runs (``<rootdir>/reports/runs``) when pytest runs
#: from here: in a checkout that is this package's own runs/, for an installed
#: Ordeal the directory the team runs from.
DEFAULT_RUNS = Path("reports") / "runs"
COMPARE_FIGURES = ("invoked", "ok", "fail", "info")


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def resolve_run(runs_dir: Path, run: str | None) -> Path:
    """A run directory from an id, ``latest`` or a path; says what exists
    when it cannot find one."""
    if run and Path(run).is_dir() and (Path(run) / "summary.json").exists():
        return Path(run)
    name = run or "latest"
    path = runs_dir / name
    if path.is_dir():
        return path.resolve() if name == "latest" else path
    if not runs_dir.is_dir():
        raise CliError(f"no runs directory at {runs_dir} (use --runs-dir DIR)")
    if run is None:
        raise CliError(f"no latest run in {runs_dir}: run a suite first, or name a run")
    near = [d.name for d in _run_dirs(runs_dir) if name in d.name][:5]
    hint = f"; runs matching: {', '.join(near)}" if near else "; see `python -m reports list`"
    raise CliError(f"unknown run {name!r} in {runs_dir}{hint}")


def _run_dirs(runs_dir: Path) -> list[Path]:
    """Run directories, newest first (ids start with a UTC stamp)."""
    if not runs_dir.is_dir():
        return []
    return sorted((d for d in runs_dir.iterdir()
                   if d.is_dir() and not d.is_symlink() and not d.name.startswith(".")),
                  key=lambda d: d.name, reverse=True)


def read_summary(run_dir: Path) -> dict[str, Any]:
    summary, why = load_summary(run_dir)
    if why:
        raise CliError(why)
    return summary


def cmd_list(runs_dir: Path, out: Any) -> int:
    dirs = _run_dirs(runs_dir)
    if not dirs:
        raise CliError(f"no runs in {runs_dir}")
    out.write(f"{'verdict':8} {'started':25} {'ops':>7}  suite  (run id)\n")
    for d in dirs:
        summary, why = load_summary(d)
        if why:
            out.write(f"{'damaged':8} {'?':25} {'?':>7}  {d.name}  ({why})\n")
            continue
        ops = summary.get("ops") if isinstance(summary.get("ops"), dict) else {}
        out.write(f"{summary.get('verdict', '?')!s:8} {summary.get('started', '?')!s:25} "
                  f"{ops.get('invoked', '?')!s:>7}  {summary.get('suite', '?')}  ({d.name})\n")
    return 0


def _figures(details: Any, limit: int = 6) -> str:
    if not isinstance(details, dict):
        return ""
    items = [(k, v) for k, v in details.items()
             if isinstance(v, (str, int, float, bool)) or v is None][:limit]
    return ", ".join(f"{k}={v}" for k, v in items)


#: ``show``'s exit status by verdict: a script can gate on it.
SHOW_EXIT = {"pass": 0, "fail": 1}


def cmd_show(run_dir: Path, out: Any, all_faults: bool = False) -> int:
    """The verdict and what it rests on, most important first: the verdict,
    its scope (what was not judged), the findings (known ones marked, with
    their bounds beside the figures), the invariants, then the faults folded
    by kind (``all_faults``: one line each). Exit 0 pass, 1 fail, 2 unknown."""
    s = read_summary(run_dir)
    verdict = str(s.get("verdict", "unknown"))
    out.write(f"run      {s.get('run_id', run_dir.name)}\n"
              f"suite    {s.get('suite', '?')}\n"
              f"time     {s.get('started', '?')} .. {s.get('ended', '?')}\n"
              f"verdict  {verdict.upper()}\n")
    scope = s.get("scope") if isinstance(s.get("scope"), dict) else {}
    for name, v in (scope.get("not_judged") or {}).items():
        if isinstance(v, dict):  # what the verdict does not cover, first (issue 47)
            out.write(f"scope    not judged: {name}"
                      f"{' (REQUIRED by --require-judged)' if v.get('required') else ''}: "
                      f"{str(v.get('why', ''))[:200]}\n")
    for f in s.get("findings") or []:
        if not isinstance(f, dict):
            continue
        if f.get("known"):
            mark = "known   "
            tail = f" [known: {'; '.join(map(str, f['known']))[:160]}; bounds: " \
                   f"{'; '.join(map(str, f.get('known_bounds') or []))[:160]}]"
        else:
            mark, tail = "FINDING ", ""
        out.write(f"{mark} {f.get('invariant')}: {str(f.get('what', ''))[:200]}{tail}\n")
        for beyond in f.get("beyond_known") or []:
            out.write(f"         beyond a known finding: {str(beyond)[:200]}\n")
    out.write(f"ops      {json.dumps(s.get('ops', {}))}\n")
    out.write("invariants:\n")
    for inv in s.get("invariants") or []:
        if not isinstance(inv, dict):
            continue
        cx = inv.get("counterexamples") or []
        first = ""
        if cx and isinstance(cx[0], dict):
            first = f"; first: op {cx[0].get('index', '?')} {str(cx[0].get('problem', ''))[:80]}"
        out.write(f"  {inv.get('valid')!s:7} {inv.get('name')}: {_figures(inv.get('details'))}"
                  f"{' (known)' if inv.get('known') else ''}"
                  f"{f' [{len(cx)} counterexamples{first}]' if cx else ''}\n")
    faults = [f for f in s.get("faults") or [] if isinstance(f, dict)]
    if all_faults:
        for f in faults:
            out.write(f"fault    {f.get('kind')} on {f.get('target')}: {f.get('injected')} .. "
                      f"{f.get('healed')}"
                      f"{'  ERROR ' + str(f['error']) if f.get('error') else ''}\n")
    else:
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for f in faults:
            by_kind.setdefault(str(f.get("kind")), []).append(f)
        for kind, fs in by_kind.items():
            targets = sorted({str(f.get("target")) for f in fs})
            errors = sum(1 for f in fs if f.get("error"))
            out.write(f"faults   {kind} x{len(fs)} on {', '.join(targets)[:120]}"
                      f"{f'; {errors} with an error' if errors else ''}\n")
        if faults:
            out.write(f"         ({len(faults)} fault(s); --faults lists each)\n")
    for e in s.get("errors") or []:
        out.write(f"error    {str(e)[:300]}\n")
    report = run_dir / REPORT_NAME
    out.write(f"report   {report if report.exists() else '(none; python -m reports render)'}\n")
    return SHOW_EXIT.get(verdict, 2)


def cmd_compare(a_dir: Path, b_dir: Path, out: Any) -> int:
    a, b = read_summary(a_dir), read_summary(b_dir)
    width = 24
    out.write(f"{'':{width}} {'A':>12}   {'B':>12}\n")
    out.write(f"{'run':{width}} {a_dir.name[:40]}  |  {b_dir.name[:40]}\n")
    out.write(f"{'verdict':{width}} {a.get('verdict')!s:>12}   {b.get('verdict')!s:>12}\n")
    for k in COMPARE_FIGURES:
        va = (a.get("ops") or {}).get(k, "-")
        vb = (b.get("ops") or {}).get(k, "-")
        out.write(f"{'ops.' + k:{width}} {va!s:>12}   {vb!s:>12}\n")
    invs_a = {i.get("name"): i for i in a.get("invariants") or [] if isinstance(i, dict)}
    invs_b = {i.get("name"): i for i in b.get("invariants") or [] if isinstance(i, dict)}
    names = list(invs_a) + [n for n in invs_b if n not in invs_a]
    for name in names:
        ia, ib = invs_a.get(name, {}), invs_b.get(name, {})
        va, vb = str(ia.get("valid", "-")), str(ib.get("valid", "-"))
        mark = "" if va == vb else "   <- differs"
        out.write(f"{str(name)[:width]:{width}} {va:>12}   {vb:>12}{mark}\n")
        fa, fb = _figures(ia.get("details"), 4), _figures(ib.get("details"), 4)
        if fa != fb:
            out.write(f"{'':{width}}   A: {fa}\n{'':{width}}   B: {fb}\n")
    return 0


def _baseline_dir(runs_dir: Path, run: str) -> Path:
    """A path as given (load_baseline says what is wrong with it), otherwise
    a run id or ``latest`` under the runs directory."""
    return Path(run) if Path(run).exists() or "/" in run else resolve_run(runs_dir, run)


def _num(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _change(r: dict[str, Any]) -> str:
    if r.get("kind") == "invariant":
        return str(r["change"])
    if r.get("kind") in ("error_rate", "goodput", "availability"):
        return f"{r['change'] * 100:+.2f} pp"
    rel = r.get("relative_change")
    return f"{r['change']:+.4g}" + (f" ({rel:+.1%})" if rel is not None else "")


def print_comparison(cmp: Comparison, out: Any, show_all: bool = False) -> None:
    d = cmp.to_dict()
    out.write(f"run       {d['current_run']}\nbaseline  {d['baseline_run']}\n"
              f"rules     {cmp.thresholds.describe()}\n")
    for w in d["warnings"]:
        out.write(f"WARNING   {w}\n")
    rows = list(d["regressions"]) + list(d["improvements"]) + list(d["reported"])
    if show_all:
        rows += [i.to_dict() for i in cmp.invariants if i.status == "unchanged"]
        rows += [f.to_dict() for f in cmp.figures if f.status == "unchanged"]
    width = max([len(r["figure"]) for r in rows] + [30])
    out.write(f"\n{'status':10} {'figure':{width}} {'baseline':>10} {'current':>10}  "
              f"{'change':18} threshold\n")
    for r in rows:
        out.write(f"{r['status'].upper():10} {r['figure']:{width}} {_num(r['baseline']):>10} "
                  f"{_num(r['current']):>10}  {_change(r):18} {r['threshold']}\n")
    if not rows:
        out.write("(no regression or improvement beyond its threshold)\n")
    if d["not_compared"]:
        out.write(f"\nnot compared ({len(d['not_compared'])}):\n")
        for n in d["not_compared"]:
            out.write(f"  {n['figure']}: {n['why']}\n")
    out.write(f"\nqualification {d['verdict'].upper()}: {len(d['regressions'])} regressed, "
              f"{d['improved']} improved, {d['unchanged']} unchanged, "
              f"{len(d['not_compared'])} not compared "
              f"({d['compared']['invariants']} invariants, {d['compared']['figures']} figures "
              f"compared)\n")


def cmd_compare_baseline(run_dir: Path, baseline_dir: Path, thresholds: Path | None,
                         out: Any, show_all: bool = False, as_json: bool = False) -> int:
    try:
        t = load_thresholds(thresholds)
        current = load_baseline(run_dir, role="run")
        base = load_baseline(baseline_dir)
        cmp = compare_baseline(current, base, t)
    except ConfigError as e:
        raise CliError(str(e)) from e
    if as_json:
        out.write(json.dumps({"baseline_dir": str(baseline_dir), **cmp.to_dict()}, indent=1)
                  + "\n")
    else:
        print_comparison(cmp, out, show_all)
    return 1 if cmp.verdict == "regressed" else 0


def cmd_render(run_dir: Path, out: Any) -> int:
    read_summary(run_dir)  # a damaged summary is an error here, not only a note in the page
    path = render_report(run_dir)
    if not path.exists():
        raise CliError(f"could not write {path}")
    out.write(f"{path}\n")
    return 0


def cmd_open(runs_dir: Path, out: Any) -> int:
    run_dir = resolve_run(runs_dir, None)
    report = run_dir / REPORT_NAME
    if not report.exists():
        raise CliError(f"{report} does not exist yet: python -m reports render")
    out.write(f"{report}\n")
    return 0


def main(argv: Sequence[str] | None = None, out: Any = None) -> int:
    out = out or sys.stdout
    p = argparse.ArgumentParser(prog="python -m reports", description=__doc__.split("\n")[0])
    p.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="runs with verdict, suite, start, ops")
    show = sub.add_parser("show", help="a run's verdict, scope, findings, invariants and "
                                       "faults (exit 0 pass, 1 fail, 2 unknown)")
    show.add_argument("run", nargs="?")
    show.add_argument("--faults", action="store_true", help="every fault, one line each "
                                                            "(default: folded by kind)")
    c = sub.add_parser("compare", help="two runs side by side")
    c.add_argument("run_a")
    c.add_argument("run_b")
    q = sub.add_parser("compare-baseline",
                       help="qualify a run against a baseline run (exit 1 if regressed)")
    q.add_argument("run", help="the run to qualify: id, latest or directory")
    q.add_argument("baseline", help="the earlier run: id, latest or directory")
    q.add_argument("--thresholds", type=Path, default=None, metavar="FILE",
                   help="TOML thresholds file (see reports/baseline.py); defaults otherwise")
    q.add_argument("--all", action="store_true", help="list unchanged figures too")
    q.add_argument("--json", action="store_true", help="print the comparison as JSON")
    sub.add_parser("render", help="(re)write report.html").add_argument("run", nargs="?")
    sub.add_parser("open", help="print the latest report's path")
    args = p.parse_args(argv)
    try:
        if args.cmd == "list":
            return cmd_list(args.runs_dir, out)
        if args.cmd == "show":
            return cmd_show(resolve_run(args.runs_dir, args.run), out, args.faults)
        if args.cmd == "compare":
            return cmd_compare(resolve_run(args.runs_dir, args.run_a),
                               resolve_run(args.runs_dir, args.run_b), out)
        if args.cmd == "compare-baseline":
            return cmd_compare_baseline(_baseline_dir(args.runs_dir, args.run),
                                        _baseline_dir(args.runs_dir, args.baseline),
                                        args.thresholds, out, args.all, args.json)
        if args.cmd == "render":
            return cmd_render(resolve_run(args.runs_dir, args.run), out)
        return cmd_open(args.runs_dir, out)
    except CliError as e:
        print(f"python -m reports {args.cmd}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `python -m reports list | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
