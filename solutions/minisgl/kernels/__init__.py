"""Triton kernels for work that torch does in many tiny launches (chapter 19).

On CUDA the engine uses them in place of the torch code of chapters 2-4 and 17: the KV store,
the step's input gather and the sampled tokens' write-back (`KernelKVCache`,
`KernelTableManager`), FlashInfer's page gather (`gather_page_indices`), and for 16-bit models
the decoder's norms, RoPE and SiLU-and-mul (`fuse_layers`), with the output projections' weights
stored column-major (`store_column_major`, no kernel: a layout). The choice is
made once, per engine, by `extension.py` (a row of features.py); on the CPU the engine keeps the
torch code, which is also what the tests compare the kernels against.

MINISGL_KERNELS=torch   keep the torch code on CUDA too (an ablation: how much do they save?)
MINISGL_KERNELS=triton  use the kernels on a CPU too (under TRITON_INTERPRET=1: the tests)

Under TRITON_INTERPRET=1 (set before triton is imported) the kernels also run on CPU tensors,
one program at a time in numpy: slow, but exact, which is how the course tests them without
a GPU; this package then sets the interpreter up first (`interpreter.py`). Otherwise nothing
here imports triton until a kernel is used, so importing the engine never does.
"""

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    from minisgl.kernels.interpreter import run_like_compiled_triton

    run_like_compiled_triton()
