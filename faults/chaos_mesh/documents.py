"""The objects of an export: one Workflow for the whole schedule (its
Suspend, Serial and Parallel templates timed as the schedule is), one
standalone object per fault and target, and ``export`` that makes them
all from a schedule. Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from faults.schedule import Step

from .mapping import Exported, LeftOut, map_fault
from .model import (
    API_VERSION,
    AT_S,
    ENTRY,
    HOLD_S,
    KIND,
    MANAGED_BY,
    RUN_ID,
    SOURCE,
    STEP,
    Held,
    Options,
    check_options,
    duration,
    held_faults,
    num,
)

#: A Workflow template's field for each embedded chaos (EmbedChaos).
EMBED = {"NetworkChaos": "networkChaos", "PodChaos": "podChaos", "TimeChaos": "timeChaos",
         "StressChaos": "stressChaos", "HTTPChaos": "httpChaos"}


def _dash(kind: str) -> str:
    return kind.replace("_", "-")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "x"


def _labels(o: Options, h: Held | None = None) -> dict[str, str]:
    labels = {MANAGED_BY: "ordeal", RUN_ID: o.run_id}
    if h is not None:
        labels.update({STEP: h.label, KIND: h.kind})
    return labels


def _metadata(name: str, o: Options, h: Held | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": o.namespace, "labels": _labels(o, h)}
    notes = {AT_S: num(h.at_s), HOLD_S: num(h.hold_s)} if h is not None else {}
    if o.source:
        notes[SOURCE] = o.source
    if notes:
        meta["annotations"] = notes
    return meta


def overlapping(exported: Sequence[Exported]) -> bool:
    """Whether any exported fault starts before an earlier one is healed."""
    end = 0.0
    for e in exported:
        if e.held.at_s < end:
            return True
        end = max(end, e.held.heal_s)
    return False


def workflow(exported: Sequence[Exported], o: Options) -> dict[str, Any]:
    """The Workflow that runs the exported faults at their times (the
    module's doc: Serial with Suspend gaps, or Parallel when they overlap)."""
    form = "Parallel" if overlapping(exported) else "Serial"
    templates: list[dict[str, Any]] = []
    children: list[str] = []
    end = 0.0
    for e in exported:
        h = e.held
        wait = round(h.at_s - end, 3) if form == "Serial" else h.at_s
        gap = []
        if wait > 0:
            templates.append({"name": f"wait-{h.label}", "templateType": "Suspend",
                              "deadline": duration(wait)})
            gap = [f"wait-{h.label}"]
        step = _fault_templates(e, templates)
        if form == "Serial":
            children += [*gap, step]
            end = h.heal_s
        else:
            templates.append({"name": f"at-{h.label}", "templateType": "Serial",
                              "children": [*gap, step]})
            children.append(f"at-{h.label}")
    templates.insert(0, {"name": ENTRY, "templateType": form, "children": children})
    meta = _metadata(f"ordeal-{o.run_id}", o)
    return {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": meta,
            "spec": {"entry": ENTRY, "templates": templates}}


def _fault_templates(e: Exported, templates: list[dict[str, Any]]) -> str:
    """Add one fault's chaos template(s); returns the name the entry runs."""
    h = e.held
    base = f"{h.label}-{_dash(h.kind)}"
    names = [base] if len(e.chaos) == 1 else [f"{base}-{i}" for i in range(len(e.chaos))]
    if len(e.chaos) > 1:
        templates.append({"name": base, "templateType": "Parallel", "children": names})
    for name, c in zip(names, e.chaos):
        templates.append({"name": name, "templateType": c.crd, "deadline": duration(h.hold_s),
                          EMBED[c.crd]: c.spec})
    return base


def standalone(e: Exported, o: Options, width: int = 2) -> list[tuple[str, dict[str, Any]]]:
    """``[(file stem, object)]``: each of the fault's objects on its own,
    with ``duration`` (not for a one-shot kill), to apply by hand at the
    time its annotation ``ordeal/at-s`` gives."""
    h = e.held
    out = []
    for i, c in enumerate(e.chaos):
        suffix = f"-{i}" if len(e.chaos) > 1 else ""
        spec = dict(c.spec) if c.one_shot else {**c.spec, "duration": duration(h.hold_s)}
        obj = {"apiVersion": API_VERSION, "kind": c.crd,
               "metadata": _metadata(f"ordeal-{o.run_id}-{h.label}{suffix}", o, h),
               "spec": spec}
        out.append((f"f{h.n:0{width}d}-{_dash(h.kind)}-{_slug(c.target)}", obj))
    return out


@dataclass
class Export:
    options: Options
    exported: list[Exported]
    left_out: list[LeftOut]
    workflow: dict[str, Any] | None  # None when nothing could be exported
    objects: list[tuple[str, dict[str, Any]]]  # (file stem under steps/, object)

    @property
    def form(self) -> str:
        return self.workflow["spec"]["templates"][0]["templateType"] if self.workflow else ""


def export(steps: Sequence[Step], o: Options) -> Export:
    """The whole schedule as Chaos Mesh objects. Pure."""
    check_options(o)
    exported: list[Exported] = []
    left: list[LeftOut] = []
    held = held_faults(steps)
    for h in held:
        r = map_fault(h, o)
        (exported if isinstance(r, Exported) else left).append(r)  # type: ignore[arg-type]
    width = max(2, len(str(len(held) - 1)))
    objects = [x for e in exported for x in standalone(e, o, width)]
    return Export(o, exported, left, workflow(exported, o) if exported else None, objects)
