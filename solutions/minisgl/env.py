"""Every environment switch of minisgl, in one place.

MINISGL_DISABLE_OVERLAP=1   run the scheduler's plain loop instead of overlap scheduling
MINISGL_KERNELS=torch       keep chapter 4's torch code on CUDA instead of chapter 19's kernels
"""

from __future__ import annotations

import os


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class _Env:
    @property
    def DISABLE_OVERLAP(self) -> bool:  # noqa: N802 - read like a constant
        return _flag("MINISGL_DISABLE_OVERLAP")

    @property
    def TORCH_KERNELS(self) -> bool:  # noqa: N802
        return os.environ.get("MINISGL_KERNELS", "").strip().lower() == "torch"


ENV = _Env()  # read at use time, so tests can flip switches with monkeypatch.setenv
