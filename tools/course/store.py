"""What the tools remember for a student: progress files, and backups of files they replace."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any


class ProgressStore:
    """A JSON file of {key: {field: value}} entries (chapters for steps.py, problems for
    judge.py). A missing or unreadable file is an empty store: progress is a convenience, and
    graders never read it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.data: dict[str, dict[str, Any]] = json.loads(path.read_text("utf-8"))
        except (OSError, json.JSONDecodeError):
            self.data = {}

    def get(self, key: object) -> dict[str, Any]:
        return self.data.get(str(key), {})

    def update(self, key: object, **fields: Any) -> dict[str, Any]:
        """Merge fields into an entry (stamped with the time) and save the file."""
        entry = self.data.setdefault(str(key), {})
        entry.update(fields, when=datetime.now().isoformat(timespec="seconds"))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n", "utf-8")
        return entry


def backup(path: Path) -> Path:
    """Copy a student's file to `<name>.bak-<time>` beside it before it is replaced."""
    target = path.with_name(f"{path.name}.bak-{datetime.now():%Y%m%d-%H%M%S}")
    shutil.copy2(path, target)
    return target
