"""Softmax in place, with the row sums as one matrix-vector product.

The reference softmax (:func:`glassllm.autograd.softmax_np`) is the formula:
shift by the row maximum, exponentiate, divide by the row sum. The fused
attention op and the lean decoder run the same formula without a new array
per step: :func:`softmax_inplace` overwrites the scores, and :func:`row_sums`
adds up each row of the last axis as a GEMV with a ones vector, several
times faster than NumPy's reduction over short rows. Both are tested equal
to the plain formula (``tests/test_kernels.py``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["softmax_inplace", "row_sums"]


def softmax_inplace(s: np.ndarray, axis: int = -1, copy: bool = False) -> np.ndarray:
    """Softmax of a float array, overwriting it (one temporary per row, not per entry).

    With ``copy`` the input is left alone: the shifted scores ``s - max`` are
    the new array (one pass, where a copy and then a subtraction would be two).
    The row maximum uses ``fmax`` (no NaN bookkeeping; a NaN row stays NaN
    through exp anyway); rows of the last axis are summed by :func:`row_sums`.
    A row that is all ``-inf`` gives zeros, as :func:`glassllm.autograd.softmax_np` does.
    """
    peak = np.fmax.reduce(s, axis=axis, keepdims=True)
    peak[np.isneginf(peak)] = 0.0      # an all -inf row: exp(-inf - 0) = 0 everywhere
    s = np.subtract(s, peak) if copy else np.subtract(s, peak, out=s)
    np.exp(s, out=s)
    total = row_sums(s, axis)
    total[total == 0] = 1.0            # ... and 0 / 1 = 0 instead of 0 / 0
    np.reciprocal(total, out=total)
    s *= total
    return s


def row_sums(s: np.ndarray, axis: int = -1) -> np.ndarray:
    """``s.sum(axis, keepdims=True)``; over the last axis of a C-contiguous array, as one GEMV."""
    if axis in (-1, s.ndim - 1) and s.flags.c_contiguous and s.ndim >= 1 and s.shape[-1] > 0:
        return (s @ np.ones(s.shape[-1], dtype=s.dtype))[..., None]
    return s.sum(axis=axis, keepdims=True)
