"""Every environment switch of minisgl, in one place.

MINISGL_DISABLE_OVERLAP_SCHEDULING=1  the scheduler's plain loop instead of overlap scheduling
MINISGL_KERNELS=torch                 keep the torch code on CUDA, not chapter 19's Triton kernels
MINISGL_KERNELS=triton                use the kernels on any device (a CPU: TRITON_INTERPRET=1)
MINISGL_CPU_LAYOUT=row                keep a CPU's weights row-major, not chapter 21's layout
MINISGL_TRITON_DECODE_ROWS=N          attention_backend="hybrid": decodes of up to N rows on
                                      Triton (chapter 22; its default otherwise)

And one of Triton's own, which minisgl reads:
TRITON_INTERPRET=1                    Triton kernels run in its interpreter: the only way they
                                      run on a CPU (set before triton is imported)
"""

from __future__ import annotations

import os


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class _Env:
    @property
    def DISABLE_OVERLAP_SCHEDULING(self) -> bool:  # noqa: N802 - read like a constant
        return _flag("MINISGL_DISABLE_OVERLAP_SCHEDULING")

    @property
    def KERNELS(self) -> str:  # noqa: N802
        """ "torch", "triton", or "" (the default: the kernels on CUDA only)."""
        return os.environ.get("MINISGL_KERNELS", "").strip().lower()

    @property
    def TRITON_INTERPRET(self) -> bool:  # noqa: N802
        return _flag("TRITON_INTERPRET")

    @property
    def CPU_LAYOUT(self) -> str:  # noqa: N802
        """ "row", or "" (the default: chapter 21's column-major weights on a CPU)."""
        return os.environ.get("MINISGL_CPU_LAYOUT", "").strip().lower()

    @property
    def TRITON_DECODE_ROWS(self) -> int | None:  # noqa: N802
        """The hybrid backend's largest Triton decode, or None (unset: its default)."""
        value = os.environ.get("MINISGL_TRITON_DECODE_ROWS", "").strip()
        if not value:
            return None
        if not value.isdigit():
            raise ValueError(f"MINISGL_TRITON_DECODE_ROWS must be a number of rows, not {value!r}")
        return int(value)


ENV = _Env()  # read at use time, so tests can flip switches with monkeypatch.setenv
