"""Which of the long tests (over two minutes each) run in this run of
``tests/`` (issue 46).

A long test is marked ``@pytest.mark.long(slot=K, covered_by="...")`` with
K in 0..SLOTS-1. In a plain ``pytest tests/`` (CI) it runs when the
commit's rotation slot is K; otherwise it is deselected, and the lines at
the start of the run name it and what covers its ground meanwhile (a
shorter test of the same code). The slot comes from the commit hash (``git
rev-parse HEAD``), so a failure replays with the same choice on the same
commit; each long test runs on about one commit in three. ``pytest tests/
-m long`` runs every long test, and so does ``ORDEAL_LONG=full``;
``ORDEAL_LONG=reduced`` runs none; ``ORDEAL_LONG=<slot>`` picks a slot.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

SLOTS = 3
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Rotation:
    slot: int | None  # None: every long test runs; -1: none
    why: str

    def full(self, test_slot: int) -> bool:
        return self.slot is None or test_slot == self.slot


def head_commit(repo: Path = REPO) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) >= 8 else None


def choose(markexpr: str, env: str | None, commit: str | None) -> Rotation:
    """The rotation of this run (pure: the caller reads the mark
    expression, ``ORDEAL_LONG`` and the commit)."""
    if "long" in (markexpr or "").replace("not long", ""):
        return Rotation(None, "-m long: every long test")
    if env:
        if env == "full":
            return Rotation(None, "ORDEAL_LONG=full: every long test")
        if env == "reduced":
            return Rotation(-1, "ORDEAL_LONG=reduced: none")
        if env.isdigit() and int(env) < SLOTS:
            return Rotation(int(env), f"ORDEAL_LONG={env}")
        raise ValueError(f"ORDEAL_LONG={env!r}: use full, reduced or a slot 0-{SLOTS - 1}")
    if commit is None:
        return Rotation(None, "no git commit to rotate by: every long test")
    slot = int(commit[:8], 16) % SLOTS
    return Rotation(slot, f"slot {slot} of {SLOTS}, from commit {commit[:10]}")


def rotation_of(markexpr: str) -> Rotation:
    return choose(markexpr, os.environ.get("ORDEAL_LONG"), head_commit())


#: CI's steps over two minutes that rotate like the long tests (``.ci/run``
#: asks ``python tests/long_rotation.py step NAME``): the smoke suite once more
#: on Triton and once in Docker containers. What covers their ground in every
#: CI: tests/test_triton_engine.py and tests/test_triton_user_repo.py (a Triton
#: cluster driven and judged), tests/test_docker_backend.py (a Docker cluster
#: with faults and heals). Each joins the slot with the least time.
STEPS = {"docker-smoke": 0, "triton-smoke": 1}


def step_runs(name: str, rotation: Rotation) -> bool:
    if name not in STEPS:
        raise ValueError(f"no rotating CI step {name!r}; steps: {sorted(STEPS)}")
    return rotation.full(STEPS[name])


def main(argv: list[str]) -> int:
    """``step NAME``: exit 0 when CI's step NAME runs in this rotation, 1
    when not; one line says which and why (for ``.ci/run``)."""
    if len(argv) != 2 or argv[0] != "step":
        print(f"usage: python tests/long_rotation.py step {{{','.join(sorted(STEPS))}}}")
        return 2
    try:
        rotation = rotation_of("")
        runs = step_runs(argv[1], rotation)
    except ValueError as e:
        print(f"long_rotation: {e}")
        return 2
    slot = STEPS[argv[1]]
    print(f"step {argv[1]} (slot {slot}): {'runs' if runs else 'not this time'} "
          f"({rotation.why})")
    return 0 if runs else 1


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
