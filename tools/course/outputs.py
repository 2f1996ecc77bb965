"""Captured outputs: what the chapter mains print (and the figure data they dump) for the site.

`steps.py capture` writes them to docs/_outputs/; `steps.py check` reruns every main and fails if
what it prints changed. What a run prints must not depend on the machine (docs/maintainers.md,
"Captured numbers"), and the comparison allows exactly for what does:
- volatile figures, numbers directly followed by a time or rate unit (`2.45 s`, `240 ms`,
  `39.2 tokens/s`), are masked;
- a decimal number (`9.23285`, `1.939e-01`) may differ from the captured one by one unit of
  its last printed digit (a value on a rounding edge) or by a relative FLOAT_RTOL, whichever is
  larger: float reductions end in other last bits on another CPU, vector unit, BLAS code path
  or thread count. Mains print an error or a difference against its bound, never its digits,
  so no number left in an output is noise about zero;
- everything else (text, integers, token ids) must be equal.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

OUTPUTS = Path("docs") / "_outputs"
CAPTURE_ENV = "MINISGL_CAPTURE_DIR"  # a main writes figure data (JSON) here when it is set
VOLATILE = re.compile(r"\d+(?:\.\d+)?(?=\s?(?:s|ms|us|µs|tokens/s|tok/s|req/s|it/s)\b)")
# A decimal number: digits with a fraction or an exponent (an integer is compared exactly).
DECIMAL = re.compile(r"(?<![\w.])-?\d+(?:\.\d+(?:e[-+]?\d+)?|e[-+]?\d+)(?![\w.])")


def another_cpu() -> dict[str, str]:
    """Environment variables that take another CPU's arithmetic path on this one: ATen's, MKL's
    and oneDNN's kernels one vector width narrower than this CPU's (AVX2 where it has AVX-512,
    else SSE4; narrower still would make some mains several times slower than their limits).
    A main must print the same (by output_drift) under it as under the captured run:
    tests/test_outputs.py runs two mains so, `steps.py check --another-cpu` every main. (The
    thread count differs already: `capture` gives a main a thread per core, `check` one.)"""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux
        flags = ""
    wide = " avx512f" in flags
    return {
        "ATEN_CPU_CAPABILITY": "avx2" if wide else "default",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2" if wide else "SSE4_2",
        "DNNL_MAX_CPU_ISA": "AVX2" if wide else "SSE41",
    }


# Float32 sums taken in another order agree to ~1e-6 relative; 1e-4 leaves room, and is far
# below what a change of meaning moves.
FLOAT_RTOL = 1e-4


def mask_volatile(text: str) -> str:
    return VOLATILE.sub("<n>", text)


def same_line(captured: str, fresh: str) -> bool:
    """The lines agree: the same text and integers, decimals within FLOAT_RTOL."""
    if captured == fresh:
        return True
    old_parts, new_parts = DECIMAL.split(captured), DECIMAL.split(fresh)
    old_numbers, new_numbers = DECIMAL.findall(captured), DECIMAL.findall(fresh)
    return (
        old_parts == new_parts
        and len(old_numbers) == len(new_numbers)
        and all(close_decimals(a, b) for a, b in zip(old_numbers, new_numbers))
    )


def last_digit(number: str) -> float:
    """The value of one unit in the last printed digit: 1e-5 for `9.23285`, 1e-4 for
    `1.939e-01`, 1 for `3e-7`... times its exponent."""
    mantissa, _, exponent = number.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def close_decimals(captured: str, fresh: str) -> bool:
    a, b = float(captured), float(fresh)
    unit = max(last_digit(captured), last_digit(fresh))
    return abs(a - b) <= max(unit * (1 + 1e-9), FLOAT_RTOL * max(abs(a), abs(b)))


def output_drift(captured: str, fresh: str) -> str:
    """ "" when the outputs agree (volatile figures masked, decimals within FLOAT_RTOL); else
    the first differing lines."""
    old, new = mask_volatile(captured).splitlines(), mask_volatile(fresh).splitlines()
    if len(old) == len(new) and all(same_line(a, b) for a, b in zip(old, new)):
        return ""
    diff = [
        line
        for line in difflib.unified_diff(old, new, "captured", "now", lineterm="", n=0)
        if not line.startswith(("---", "+++", "@@"))
    ]
    return "\n".join(diff[:6])
