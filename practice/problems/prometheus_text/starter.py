import math
import re


def metrics_text(
    metrics: list[tuple[str, str, str, int | float | bool | None]], prefix: str = "minisgl_"
) -> str:
    """The metrics in Prometheus' text format: HELP, TYPE and sample lines for each.

    Each metric is (name, kind, help, value); `prefix` goes in front of every name.
    Raises ValueError for an invalid kind, name, duplicate or counter.
    """
    raise NotImplementedError("write the HELP, TYPE and sample lines of every metric")
