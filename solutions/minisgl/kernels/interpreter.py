"""Triton's interpreter, set to run the kernels as compiled Triton runs them.

Under TRITON_INTERPRET=1 (the tests on a CPU, and any run without a GPU that asks for the
kernels) every launch runs its programs one after another in numpy. Two settings make that
run like a compiled kernel; `kernels/__init__.py` applies them once, before any kernel runs:

- A scalar loaded from memory works as a loop bound (`for start in range(0, length, BLOCK)`).
  The interpreter keeps a scalar as an array of shape (1,) and makes a bound with int(array),
  which numpy 2.3 and later refuse for an array that is not 0-d; int(array.item()) is the same
  number.
- No overflow check that nothing reads. For every 32-bit integer +, - and * of a kernel the
  interpreter also computes the result in 64 bits and compares it with the int32 range, to
  feed a device_assert that does nothing unless the kernel is compiled with debug=True (it is
  not, here or on a GPU). A compiler drops that dead code; the interpreter computed it, for
  about 40% of the time of a feature-matrix cell on chapter 22's kernels. Without it an int32
  result that overflows wraps silently, as it did before (the assert was off) and as it does
  on a GPU.
"""

from __future__ import annotations

import dataclasses


def run_like_compiled_triton() -> None:
    """Apply both settings to Triton's interpreter (import triton only under the interpreter)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)

    patch_tensor = interpreter._patch_lang_tensor

    def patch_with_index(tensor: type, scope: object) -> None:
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patch_with_index
