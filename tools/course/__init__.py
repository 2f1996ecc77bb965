"""The course library: what `tools/steps.py`, `practice/judge.py`, the grading commands and the
docs hooks share (docs/maintainers.md describes the architecture).

    manifest   chapters/*/chapter.toml, and who owns which file and symbol (`Course`)
    source     finding, stubbing and replacing functions in Python source (ast)
    snapshot   assembling snapshot K (reference, skeleton, or a student's tree) and its file tree
    problems   practice/problems/<slug>/ folders (`Problem`)
    runner     sandboxed subprocess runs: timeouts, process-group kill, tests recorded as they end
    store      progress files and backups of student files
    report     the rich console, failure reports and hints

The package is imported with tools/ on sys.path (`import course`); it needs only the standard
library and rich (and tomli on Python 3.10).
"""

from course.errors import CourseError

__all__ = ["CourseError"]
