"""Captured outputs hold on any student's machine (docs/maintainers.md, "Captured numbers").

`steps.py check` compares a fresh run of every main with docs/_outputs/: text and integers
exactly, decimals to one unit of their last printed digit or FLOAT_RTOL. These tests pin that
rule down, and run the mains of chapters 2 and 3, which compare our layers and model with
transformers', on another CPU's arithmetic path (ATen's, MKL's and oneDNN's kernels one vector
width narrower than this CPU's, one thread where `capture` used two): what they print must
still match what was captured. `steps.py check --another-cpu` does the same for every main.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from course.checks import drifted_outputs, run_mains  # noqa: E402
from course.manifest import Course  # noqa: E402
from course.outputs import another_cpu, output_drift  # noqa: E402
from course.snapshot import build_snapshot  # noqa: E402


@pytest.mark.parametrize(
    ("captured", "fresh"),
    [
        ("sum 9.23285 done", "sum 9.23284 done"),  # the last digit of a float32 sum
        ("p = 0.075", "p = 0.076"),  # a value on a rounding edge: one unit of the last digit
        ("logit = 17.371, 1.939e-01", "logit = 17.372, 1.940e-01"),
        ("took 2.45 s, 39.2 tokens/s", "took 3.1 s, 12 tokens/s"),  # volatile figures
        ("version 0.6.6", "version 0.6.6"),
    ],
)
def test_float_noise_and_timings_are_no_drift(captured: str, fresh: str) -> None:
    assert output_drift(captured, fresh) == ""


@pytest.mark.parametrize(
    ("captured", "fresh"),
    [
        ("4 requests admitted", "5 requests admitted"),  # integers are exact
        ("p = 0.075", "p = 0.077"),  # two units of the last digit
        ("logit = 17.371", "logit = 17.471"),
        ("same argmax: True", "same argmax: False"),
        ("a\nb", "a\nb\nc"),  # a line more
        ("1.5 of 3", "1.5 of 3 pages"),  # other text around the same numbers
    ],
)
def test_a_change_of_meaning_is_drift(captured: str, fresh: str) -> None:
    assert output_drift(captured, fresh) != ""


@pytest.mark.slow  # the mains of chapters 2 and 3: ~20 s on 2 cores
def test_parity_mains_print_what_was_captured_on_another_cpus_arithmetic(tmp_path: Path) -> None:
    course = Course.load(ROOT)
    for k in (2, 3):
        m = course.chapter(k)
        tree = build_snapshot(course, k, "reference", tmp_path / f"{k:02d}").root
        runs = run_mains(course, m, tree, tmp_path / f"{k:02d}-capture", 2, another_cpu())
        assert all(run.ok for run in runs), [run.output[-500:] for run in runs]
        assert drifted_outputs(course, runs, tmp_path / f"{k:02d}-capture") == []
