"""Where things are in the course repository, spelled once for every tool.

Commands take a course root (`steps.py --root`), so the folders a student or a build writes
are relative to it; ROOT is the repository this package belongs to, the default root.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # this file is <repository>/tools/course/paths.py
PYTHON = ".venv/bin/python"  # the project's interpreter, as the commands we print spell it
MODELS = ROOT / "models"  # checkpoints written by tools/provision.py
PRACTICE = ROOT / "practice"  # the practice judge, its problems and the student's workspace
WORK = Path("work")  # under a course root: the student's files and progress
STUDENT_TREE = WORK / "minisgl"  # the student's engine
BUILD = Path("build")  # under a course root: snapshots, mutants, grading trees (rebuilt at will)
