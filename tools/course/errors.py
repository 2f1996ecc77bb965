"""The one error type of the course tools: bad input (a chapter number, a manifest, a problem)."""

from __future__ import annotations


class CourseError(Exception):
    """Something the user or maintainer must fix; command lines print it as one line, the docs
    hooks turn it into a build error naming the page."""
