"""RoPE laid out for speed: the rotations per head, and as one matrix per position.

The reference rotates with :func:`glassllm.autograd.rope`: each interleaved
pair of features, read as a complex number, times ``cos + i sin``
(:func:`glassllm.autograd.rope_table`, :func:`glassllm.autograd.rotate`).
Two layouts of the same rotations serve the kernels:

- :func:`rope_table` with ``heads``: the table written out per head for x
  (B, n, heads, D), so NumPy multiplies along one long contiguous run instead
  of one run of D/2 per head (the packed attention op, :func:`glassllm.ops.flash.self_attention`);
- :func:`rotation_matrices`: one (D, D) matrix per position, so that the lean
  decoder rotates queries and keys together with one matmul.

Both are tested equal to the pair formula (``tests/test_kernels.py``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["rope_table", "rotation_matrices"]


def rope_table(cos, sin, heads: int, dtype=np.float32) -> np.ndarray:
    """The rotations of RoPE as unit complex numbers ``cos + i sin``, written out per head.

    cos, sin: (n, D/2), or (B, 1, n, D/2) when each row has its own positions.
    Returns the table for x (B, n, heads, D) seen as (B, n, heads, D/2) complex
    numbers: (n, heads, D/2), or (B, n, heads, D/2).
    """
    cos, sin = np.asarray(cos), np.asarray(sin)
    cdt = np.result_type(dtype, np.complex64)
    if cos.ndim == 2:
        cos, sin = cos[:, None, :], sin[:, None, :]                     # (n, 1, D/2)
    else:
        cos, sin = cos[:, 0, :, None, :], sin[:, 0, :, None, :]         # (B, n, 1, D/2)
    shape = cos.shape[:-2] + (heads, cos.shape[-1])
    z = np.empty(shape, dtype=cdt)
    z.real, z.imag = cos, sin
    return z


def rotation_matrices(cos: np.ndarray, sin: np.ndarray, upto: int | None = None) -> np.ndarray:
    """The rotations as matrices, (upto, D, D) for positions 0 .. upto-1 of the tables cos, sin
    (L, D/2) (default: all L): row vector ``x @ R[p]`` turns x to position p. Read-only.

    Pair i's 2 x 2 block is [[cos, sin], [-sin, cos]], so (x[2i], x[2i+1])
    becomes (x[2i] cos - x[2i+1] sin, x[2i] sin + x[2i+1] cos). Build only the
    positions needed: D x D numbers each, so a long context's whole table
    could be gigabytes.
    """
    L, half = cos.shape
    upto = L if upto is None else min(int(upto), L)
    R = np.zeros((upto, half, 2, half, 2), dtype=cos.dtype)             # (upto, D/2, 2, D/2, 2)
    i = np.arange(half)
    cos, sin = cos[:upto], sin[:upto]
    R[:, i, 0, i, 0], R[:, i, 0, i, 1] = cos, sin                       # x[2i]   -> ( c, s)
    R[:, i, 1, i, 0], R[:, i, 1, i, 1] = -sin, cos                      # x[2i+1] -> (-s, c)
    R.flags.writeable = False
    return R.reshape(upto, 2 * half, 2 * half)                          # (upto, D, D)
