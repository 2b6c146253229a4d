"""CI's time report: each step's time, the slowest tests, the tests over
twice their figure in ``tests/ci_budget.toml``, and how many clusters CI
started. A report, never a gate: a slow test is named as a warning (this
machine is noisy; a timed assert would fail CI on its noise), and this
script exits 0 whatever it reads.

    python .ci/budget.py .ci-out     # after bash .ci/run; stdlib only

``.ci/run`` writes, per step N: ``N.xml`` (pytest's JUnit XML), ``N.log``
(the step's output) and ``N.time`` (``name<TAB>seconds``), and points
``ORDEAL_CLUSTER_STARTS`` at ``cluster-starts.tsv``: every cluster start of
the run, the tests' own and those of child pytests included, appends a line
there (clusters/base.py ``note_start``). Without that file, the progress
lines ``... cluster ready in Ns`` of the logs are counted (the plugin's
session clusters only).
"""

from __future__ import annotations

import re
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET = ROOT / "tests" / "ci_budget.toml"
SLOWEST = 20
OVER = 2.0  # a test over this many times its figure is named
READY = re.compile(r"\] (?:(\w+) )?cluster ready in (\d+)s")


def test_times(xml: Path) -> dict[str, float]:
    """node id -> seconds, from one JUnit XML file (setup, call and
    teardown together, as pytest writes ``time``)."""
    out: dict[str, float] = {}
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return out
    for case in root.iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        node = f"{path}.py::{case.get('name')}"
        out[node] = out.get(node, 0.0) + float(case.get("time") or 0.0)
    return out


def read_budget(path: Path = BUDGET) -> dict[str, float]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        print(f"budget: cannot read {path}: {e}")
        return {}
    return {k: float(v) for k, v in (data.get("tests") or {}).items()}


def budget_of(node: str, budget: dict[str, float]) -> float | None:
    """A test's figure: its own node id, its id without parameters, or its
    file's (a figure for every test of the file)."""
    for key in (node, node.split("[", 1)[0], node.split("::", 1)[0]):
        if key in budget:
            return budget[key]
    return None


def report(out_dir: Path) -> str:
    lines = ["=== CI time report (.ci/budget.py; warnings only) ==="]
    times: dict[str, float] = {}
    starts = 0
    by_kind: dict[str, int] = {}
    for step in sorted(out_dir.glob("*.time")):
        name, _, secs = step.read_text().strip().partition("\t")
        lines.append(f"step {step.stem}: {secs:>6}s  {name}")
    for xml in sorted(out_dir.glob("*.xml")):
        for node, t in test_times(xml).items():
            times[f"{xml.stem}: {node}"] = t
    by_file: dict[str, list[float]] = {}
    tsv = out_dir / "cluster-starts.tsv"
    if tsv.exists():
        for row in tsv.read_text(errors="replace").splitlines():
            cols = row.split("\t")
            if len(cols) < 5:
                continue
            starts += 1
            kind = f"{cols[0]}/{cols[1]}"
            by_kind[kind] = by_kind.get(kind, 0) + 1
            by_file.setdefault(cols[4].split("::", 1)[0], []).append(float(cols[3] or 0))
    else:
        for log in sorted(out_dir.glob("*.log")):
            for m in READY.finditer(log.read_text(errors="replace")):
                starts += 1
                kind = m.group(1) or "local"
                by_kind[kind] = by_kind.get(kind, 0) + 1
    lines.append(f"cluster starts: {starts} "
                 f"({', '.join(f'{k} {n}' for k, n in sorted(by_kind.items())) or 'none'})")
    for where, secs in sorted(by_file.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"  {len(secs):3d} start(s), {sum(secs):6.0f}s to ready: {where}")
    lines.append(f"the {SLOWEST} slowest tests:")
    for node, t in sorted(times.items(), key=lambda kv: -kv[1])[:SLOWEST]:
        lines.append(f"  {t:7.1f}s  {node}")
    budget = read_budget()
    over, unlisted = [], 0
    for key, t in sorted(times.items()):
        node = key.split(": ", 1)[1]
        figure = budget_of(node, budget)
        if figure is None:
            unlisted += t >= 30.0
            continue
        if t > OVER * figure:
            over.append(f"  WARNING {t:.0f}s > {OVER:g} x {figure:.0f}s: {node}")
    lines.append(f"tests over {OVER:g}x their figure in tests/ci_budget.toml: {len(over)}")
    lines.extend(over)
    if unlisted:
        lines.append(f"  ({unlisted} test(s) of 30 s or more have no figure there: add them)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    out_dir = Path(argv[1]) if len(argv) > 1 else ROOT / ".ci-out"
    try:
        print(report(out_dir))
    except Exception as e:  # noqa: BLE001 - a report never fails CI
        print(f"budget: the report failed: {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
