"""The failure zoo's detection figure (issue 40): run ``pytest
suites/test_zoo.py -m zoo`` (every shape of faults/zoo/ planted in a real
cluster, plus a clean run) into a fresh runs dir, then write
bench/results/zoo.json and zoo.md: shape | source | caught by | time to
catch | verdict, and the clean run's false positives. A shape the verdict
misses makes its pytest test fail; the bench still writes the table."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import PY, RESULTS, ROOT, progress, write_json
from faults.zoo import PENDING
from runs.zoo import RESULTS_FILE, read_records, table


def run(quick: bool = False) -> None:
    runs = Path(tempfile.mkdtemp(prefix="ordeal-zoo-"))
    argv = [PY, "-m", "pytest", "suites/test_zoo.py", "-m", "zoo", "--runs-dir", str(runs),
            "-p", "no:cacheprovider", "-q"]
    progress(f"zoo: {' '.join(argv[1:])}")
    t0 = time.monotonic()
    rc = subprocess.run(argv, cwd=ROOT).returncode
    records = read_records(runs / RESULTS_FILE) if (runs / RESULTS_FILE).exists() else []
    if not records:
        raise RuntimeError(f"the zoo wrote no record (pytest exit {rc}); see its output above")
    shapes = [r for r in records if r["shape"] != "clean"]
    write_json("zoo", {"pytest_exit": rc, "seconds": round(time.monotonic() - t0),
                       "caught": sum(1 for r in shapes if r.get("caught")),
                       "shapes": len(shapes), "pending": sorted(PENDING),
                       "false_positives": sum(1 for r in records if r.get("false_positive")),
                       "records": records})
    md = ["# The failure zoo: how far to trust a pass",
          "",
          f"Written by `python -m bench --only zoo` "
          f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): "
          "each shape of `faults/zoo/` planted inside the serving path of the embedded "
          "cluster (2 vLLM CPU replicas behind vllm-router) 5 s into a 25 s load run, with "
          "the default checkers and nothing announced to them; time to catch runs from the "
          "plant to the first counterexample that points at a history op.",
          "", table(records), ""]
    if PENDING:
        md += ["Not planted yet (issue 40), so not measured, never counted as caught:", ""]
        md += [f"- `{name}`: {why}" for name, why in PENDING.items()] + [""]
    (RESULTS / "zoo.md").write_text("\n".join(md))
    progress(f"zoo: {RESULTS / 'zoo.md'} (pytest exit {rc})")
