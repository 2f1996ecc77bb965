"""Benchmark results as JSON lines, each with the command, machine and date that produced it.

A number without its command cannot be reproduced, and one without its machine cannot be
compared: every record carries both, so a page can quote a result with what made it.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch


def cpu_name() -> str:
    """The CPU's model name (Linux reports it in /proc/cpuinfo)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine() -> str:
    """What ran the benchmark: the GPUs if there are any, else the CPU, and its core count."""
    cores = f"{os.cpu_count()} CPU cores"
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}, {cores}"
    return f"{cpu_name()}, {cores}"


def command() -> str:
    """This process's command line, as it was typed: the script's path, or `-m` and the package
    run as `python -m PACKAGE` (whose argv[0] is the path of its `__main__.py`), then the flags."""
    script, *flags = sys.argv
    path = Path(script)
    head = ["-m", path.parent.name] if path.name == "__main__.py" else [script]
    return shlex.join(["python", *head, *flags])


def append_result(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """Append `record` to the JSON-lines file `path` with the command, machine and UTC date."""
    full = {
        **record,
        "command": command(),
        "machine": machine(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    with path.open("a") as f:
        f.write(json.dumps(full) + "\n")
    return full


def read_results(path: Path) -> list[dict[str, Any]]:
    """Every record of a JSON-lines results file, in order."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_results_dir(folder: Path, on: str | None = None, **fields: Any) -> list[dict[str, Any]]:
    """The records of every results file in `folder` (in name order) whose `fields` match and,
    with `on`, whose machine's description holds it: read_results_dir(folder, on="H200",
    benchmark="tp") takes the H200 runs, not another GPU's figures in the same files."""
    return [
        record
        for path in sorted(folder.glob("*.jsonl"))
        for record in read_results(path)
        if all(record.get(key) == value for key, value in fields.items())
        and (on is None or on in record.get("machine", ""))
    ]
