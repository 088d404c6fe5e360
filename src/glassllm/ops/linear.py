"""Several projections of one input as one GEMM.

``linear_stacked(x, (wq, wk, wv))`` is the three projections of the same ``x``
side by side -- the same numbers as
``concatenate([linear(x, wq), linear(x, wk), linear(x, wv)], -1)`` -- computed
as one GEMM against the stacked matrix, each weight getting its own block of
the gradient. The kernels use it for ``wq|wk|wv`` and ``w1|w3``.

Stacking the weights copies them, ``sum(out_i) * in`` numbers, on every call. When the input
has fewer rows than ``in`` (a prompt of 256 tokens through a 135M Llama's 576-wide layers:
9 MB of weights a layer), each product is written instead straight into its columns of the
output (one GEMM per weight, the output's row stride as BLAS's leading dimension), and the
stacked matrix is made only if a backward pass needs it.
"""

from __future__ import annotations

import numpy as np

from .. import autograd as ag
from ..autograd import Tensor

__all__ = ["linear_stacked"]


def linear_stacked(x, weights) -> Tensor:
    """``x @ W.T`` for the weights (out_i, in) stacked along out: (..., in) -> (..., sum out_i)."""
    x = ag.as_tensor(x)
    weights = tuple(ag.as_tensor(w, x) for w in weights)
    if not weights or any(w.ndim != 2 or w.shape[1] != x.shape[-1] for w in weights):
        shapes = [w.shape for w in weights]
        raise ValueError(f"linear: weights {shapes} must be matrices (out, {x.shape[-1]}) for input shape {x.shape}")
    sizes = [w.shape[0] for w in weights]
    bounds = np.cumsum(sizes)[:-1]
    total = int(sum(sizes))
    x2 = x.data.reshape(-1, x.shape[-1])                                # (N, in)
    stacked = []                                                        # the (sum out, in) matrix, once made

    def stack():
        if not stacked:
            stacked.append(np.concatenate([t.data for t in weights]))   # (sum out, in)
        return stacked[0]

    if x2.shape[0] < x2.shape[1]:                                       # fewer rows than inputs: no stacked copy
        dtype = np.result_type(x2, *(t.data for t in weights))
        out2 = np.empty((x2.shape[0], total), dtype=dtype)              # (N, sum out)
        for t, lo, hi in zip(weights, (0, *bounds), (*bounds, total)):
            np.matmul(x2, t.data.T, out=out2[:, lo:hi])                 # (N, out_i), in place
    else:
        out2 = x2 @ stack().T                                           # (N, sum out)
    out = out2.reshape(*x.shape[:-1], total)                            # (..., sum out)

    def backward(g):
        w = stack()
        g2 = g.reshape(-1, w.shape[0])                                  # (N, sum out)
        gx = (g2 @ w).reshape(x.shape) if x.requires_grad else None     # (..., in)
        gw = np.split(g2.T @ x2, bounds) if any(t.requires_grad for t in weights) else [None] * len(weights)
        return (gx, *(gi if t.requires_grad else None for gi, t in zip(gw, weights)))  # (out_i, in) each
    return ag.make_op(out, (x, *weights), backward)
