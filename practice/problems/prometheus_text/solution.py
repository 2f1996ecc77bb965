import math
import re

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
KINDS = ("gauge", "counter")


def format_value(value: int | float | bool | None) -> str:
    """A sample value as Prometheus writes it."""
    if value is None:
        return "-1"  # not measured yet
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def metrics_text(
    metrics: list[tuple[str, str, str, int | float | bool | None]], prefix: str = "minisgl_"
) -> str:
    """The metrics in Prometheus' text format: HELP, TYPE and sample lines for each.

    Each metric is (name, kind, help, value); `prefix` goes in front of every name.
    Raises ValueError for an invalid kind, name, duplicate or counter.
    """
    lines: list[str] = []
    seen: set[str] = set()
    for name, kind, help_text, value in metrics:
        full = prefix + name
        if kind not in KINDS:
            raise ValueError(f"{full}: kind must be one of {KINDS}, got {kind!r}")
        if not METRIC_NAME.fullmatch(full):
            raise ValueError(f"{full!r} is not a valid metric name")
        if full in seen:
            raise ValueError(f"{full} appears twice")
        if kind == "counter" and not full.endswith("_total"):
            raise ValueError(f"counter {full} must end in _total")
        if kind == "counter" and value is not None and value < 0:
            raise ValueError(f"counter {full} cannot be negative, got {value}")
        seen.add(full)
        escaped = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        lines += [
            f"# HELP {full} {escaped}\n",
            f"# TYPE {full} {kind}\n",
            f"{full} {format_value(value)}\n",
        ]
    return "".join(lines)
