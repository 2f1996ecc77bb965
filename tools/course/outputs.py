"""Captured outputs: what the chapter mains print (and the figure data they dump) for the site.

`steps.py capture` writes them to docs/_outputs/; `steps.py check` reruns every main and fails if
the deterministic part of its output changed. Volatile figures are numbers directly followed by
a time or rate unit (`2.45 s`, `240 ms`, `39.2 tokens/s`): they are masked before comparing.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

OUTPUTS = Path("docs") / "_outputs"
CAPTURE_ENV = "MINISGL_CAPTURE_DIR"  # a main writes figure data (JSON) here when it is set
VOLATILE = re.compile(r"\d+(?:\.\d+)?(?=\s?(?:s|ms|us|µs|tokens/s|tok/s|req/s|it/s)\b)")


def mask_volatile(text: str) -> str:
    return VOLATILE.sub("<n>", text)


def output_drift(captured: str, fresh: str) -> str:
    """ "" when the outputs agree but for volatile figures; else the first differing lines."""
    old, new = mask_volatile(captured).splitlines(), mask_volatile(fresh).splitlines()
    if old == new:
        return ""
    diff = [
        line
        for line in difflib.unified_diff(old, new, "captured", "now", lineterm="", n=0)
        if not line.startswith(("---", "+++", "@@"))
    ]
    return "\n".join(diff[:6])
