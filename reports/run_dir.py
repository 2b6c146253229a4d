"""The run directory: ``reports/runs/<run-id>/`` with history.jsonl,
summary.json and the nodes' logs, plus ``reports/runs/latest`` pointing at
the newest run. Files are replaced atomically so a reader never sees half a
summary."""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def new_run_id(suite: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", suite).strip("-")[:60] or "run"
    return f"{stamp}-{safe}-{secrets.token_hex(2)}"


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True)
class RunDir:
    root: Path
    run_id: str

    @property
    def path(self) -> Path:
        return self.root / self.run_id

    @property
    def history_path(self) -> Path:
        return self.path / "history.jsonl"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @classmethod
    def create(cls, root: Path | str, suite: str) -> "RunDir":
        rd = cls(Path(root), new_run_id(suite))
        rd.logs.mkdir(parents=True, exist_ok=False)
        rd.point_latest()
        return rd

    def point_latest(self) -> None:
        link = self.root / "latest"
        tmp = self.root / f".latest-{self.run_id}"
        tmp.unlink(missing_ok=True)
        os.symlink(self.run_id, tmp)
        os.replace(tmp, link)

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json_atomic(self.summary_path, summary)
