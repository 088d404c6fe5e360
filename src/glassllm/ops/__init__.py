"""Fast array operations: arrays in, arrays out, each tested equal to the formula it replaces.

:mod:`glassllm.autograd` keeps the primitives textbook-plain; the operations
here compute the same numbers with fewer, bigger NumPy calls. They take
arrays (or tensors) and know nothing of the model's layers: the kernels of
:mod:`glassllm.kernels`, which run :mod:`glassllm.nn`'s layers with them, sit
above the model; these sit below it.

=============================  ===============================================  ==================
operation                      replaces                                         module
=============================  ===============================================  ==================
``attention``                  scores, mask, softmax and mix (GQA in the rows)  :mod:`.dense`
``flash_attention``            the same, tile by tile (online softmax)          :mod:`.flash`
``self_attention``             RoPE and tiled attention from packed wq|wk|wv    :mod:`.flash`
``rms_norm``                   mean of squares, sqrt, divide, gain              :mod:`.norm`
``swiglu``                     ``silu(gate) * up``                              :mod:`.mlp`
``linear_stacked``             several ``linear`` of one input, concatenated    :mod:`.linear`
``softmax_inplace``            :func:`glassllm.autograd.softmax_np`             :mod:`.softmax`
``row_sums``                   ``x.sum(axis, keepdims=True)``                   :mod:`.softmax`
``rope_table``                 :func:`glassllm.autograd.rope_table` per head    :mod:`.rotary`
``rotation_matrices``          RoPE's pair formula as a (D, D) matrix           :mod:`.rotary`
=============================  ===============================================  ==================

``tests/test_kernels.py`` holds one row per operation (and per kernel) that
compares it with the plain formula on the same inputs, values and gradients:
float64 to 1e-12, float32 to 1e-5.
"""

from __future__ import annotations

from . import dense, flash, linear, mlp, norm, rotary, softmax
from .dense import attention
from .flash import FLASH_MIN_QUERIES, flash_attention, self_attention
from .linear import linear_stacked
from .mlp import swiglu
from .norm import rms_norm
from .rotary import rope_table, rotation_matrices
from .softmax import row_sums, softmax_inplace

OPS = ("attention", "flash_attention", "self_attention", "rms_norm", "swiglu", "linear_stacked",
       "softmax_inplace", "row_sums", "rope_table", "rotation_matrices")

__all__ = list(OPS) + ["OPS", "FLASH_MIN_QUERIES", "dense", "flash", "linear", "mlp", "norm", "rotary", "softmax"]
