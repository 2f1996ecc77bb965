"""minisgl: a small, fast, readable LLM serving engine, rebuilt chapter by chapter."""

__version__ = "0.1.0"
