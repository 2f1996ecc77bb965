"""The course library: what `tools/steps.py`, `practice/judge.py`, `tools/grading.py` and the
docs hooks share. Its modules are listed, each with what it owns, once: in the course-library
table of docs/maintainers.md (tests/test_steps.py fails when a module is missing there).

The package is installed with the project (`pip install -e .`): `solutions/course` links here,
so the one import root of the editable install holds `minisgl` and `course`. It needs only the
standard library and rich (and tomli on Python 3.10).
"""

from course.errors import CourseError

__all__ = ["CourseError"]
