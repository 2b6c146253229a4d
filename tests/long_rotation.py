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
