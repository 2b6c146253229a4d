"""The output directory: workflow.yaml, steps/*.yaml and summary.txt
(what was exported, what was not and why), written for
``python -m faults export --chaos-mesh``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .documents import Export
from .mapping import NOTES, Chaos
from .model import CHAOS_MESH_VERSION, RUN_ID, SUMMARY, SUMMARY_HEAD, ExportError, Held, num
from .yaml import to_yaml

# ------------------------------------------------------------ the files

def describe(c: Chaos) -> str:
    """``NetworkChaos delay on router-replica-0``, ``HTTPChaos abort ...``."""
    if c.crd == "HTTPChaos":
        what = "/".join(k for k in ("abort", "delay", "replace") if k in c.spec)
    elif c.crd == "TimeChaos":
        what = f"timeOffset {c.spec['timeOffset']}"
    elif c.crd == "StressChaos":
        what = "memory " + c.spec["stressors"]["memory"]["size"]
    else:
        what = c.spec.get("action", "")
    return f"{c.crd} {what} on {c.target}"


def summary_lines(x: Export, out: Path | None = None, fmt: str = "yaml") -> list[str]:
    o = x.options
    lines = [(f"{SUMMARY_HEAD} of {o.source or 'a schedule'} (Chaos Mesh {CHAOS_MESH_VERSION} "
              f"CRDs): run id {o.run_id}, namespace {o.namespace}")]
    total = len(x.exported) + len(x.left_out)
    lines.append(f"{len(x.exported)} of {total} fault(s) exported, {len(x.left_out)} not")
    if x.workflow:
        lines.append(f"workflow ordeal-{o.run_id}: {x.form} "
                     + ("(faults in turn, Suspend for the quiet gaps)" if x.form == "Serial" else
                        "(the faults overlap: one Serial branch per fault, Suspend until its "
                        "time)"))
    for e in x.exported:
        h = e.held
        lines.append(f"  exported {h.label} at {num(h.at_s)} s held {num(h.hold_s)} s: "
                     f"{h.kind} on {h.target} -> {', '.join(describe(c) for c in e.chaos)}")
    by_reason: dict[tuple[str, str, str], list[Held]] = {}
    for left in x.left_out:
        h = left.held
        by_reason.setdefault((h.kind, h.target, left.reason), []).append(h)
    for (kind, target, reason), hs in by_reason.items():
        when = ", ".join(f"{h.label} at {num(h.at_s)} s" for h in hs)
        lines.append(f"  NOT exported {kind} on {target} ({when}): {reason}")
    kinds = list(dict.fromkeys(e.held.kind for e in x.exported))
    if kinds:
        lines.append("how each exported kind differs from Ordeal's own fault:")
        lines += [f"  {k}: {NOTES[k]}" for k in kinds if k in NOTES]
    if x.workflow:
        where = f"{out}/" if out else ""
        lines.append(f"run it:   kubectl apply -f {where}workflow.{fmt}   (steps/: one fault at "
                     "a time, by hand, at its ordeal/at-s)")
        lines.append(f"stop it:  kubectl delete workflow -n {o.namespace} ordeal-{o.run_id}   "
                     "(its chaos objects go with it)")
        lines.append(f"by hand:  kubectl delete networkchaos,podchaos,timechaos,stresschaos,"
                     f"httpchaos -n {o.namespace} -l {RUN_ID}={o.run_id}")
    return lines


def write_export(x: Export, out: Path, fmt: str = "yaml",
                 say: Callable[[str], None] = lambda _: None) -> list[Path]:
    """Write the workflow, the standalone objects and summary.txt under
    ``out``. ``out`` must be new, empty, or an earlier export (whose files
    are replaced). Returns the paths written."""
    if fmt not in ("yaml", "json"):
        raise ExportError(f"--format {fmt!r}: use yaml or json")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        summary = out / SUMMARY
        if not (summary.is_file() and summary.read_text().startswith(SUMMARY_HEAD)):
            raise ExportError(f"--out {out}: not empty and not an earlier export (no {SUMMARY}); "
                              "give a new or empty directory")
        for old in [*out.glob("workflow.*"), summary]:
            old.unlink()
        if (out / "steps").is_dir():
            shutil.rmtree(out / "steps")
        say(f"replacing the earlier export in {out}")
    out.mkdir(parents=True, exist_ok=True)
    if x.objects:
        (out / "steps").mkdir()

    o = x.options
    head = (f"# Written by `python -m faults export --chaos-mesh` from "
            f"{o.source or 'a schedule'} (run id {o.run_id}); see {SUMMARY}\n")

    def dump(obj: dict[str, Any]) -> str:
        return json.dumps(obj, indent=2) + "\n" if fmt == "json" else head + to_yaml(obj)

    written = []
    if x.workflow is not None:
        path = out / f"workflow.{fmt}"
        path.write_text(dump(x.workflow))
        written.append(path)
        say(f"wrote {path} (Workflow ordeal-{o.run_id}, {x.form})")
    for stem, obj in x.objects:
        path = out / "steps" / f"{stem}.{fmt}"
        path.write_text(dump(obj))
        written.append(path)
        say(f"wrote {path} ({obj['kind']} {obj['metadata']['name']})")
    path = out / SUMMARY
    path.write_text("\n".join(summary_lines(x, out, fmt)) + "\n")
    written.append(path)
    return written
