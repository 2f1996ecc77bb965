"""The scheduler: who runs next, where their tokens live, and when their pages are freed."""

from .table import TableManager
