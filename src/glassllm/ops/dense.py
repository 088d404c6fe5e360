"""Fused attention: ``softmax(q k^T * scale, masked) v`` as one op.

The reference (``Attention.__call__``) spells steps 4 to 8 out: copy each K/V
head for the query heads it serves, the scores, ``masked_fill``, ``softmax``,
the mix. :func:`attention` does the same in one op with a hand-derived
backward: the r = H/G query heads that share a K/V head are folded into the
rows of one matmul (K and V are never copied per head), the mask is written
into the scores in place, and the softmax runs in place.

The attention kernels of :mod:`glassllm.kernels.layers` run the layer with it
(long blocks take the tiled op of :mod:`glassllm.ops.flash` instead).

Shape legend: B batch, n new queries, m keys (m = start + n), H query heads,
G key/value heads, D head dim, C model width.
"""

from __future__ import annotations

import numpy as np

from .. import autograd as ag
from ..autograd import Tensor
from .softmax import softmax_inplace

__all__ = ["attention"]


def attention(q, k, v, mask: np.ndarray | None, scale: float) -> Tensor:
    """Fused grouped-query attention: softmax(q k^T * scale, masked) v.

    q (B, H, n, D); k, v (B, G, m, D) with H a multiple of G: query head h reads
    K/V head h // (H/G). mask: bool, True = forbidden, broadcastable to
    (B, 1, n, m). A row with every key forbidden gives zeros. Returns (B, H, n, D).

    >>> q = k = v = Tensor(np.eye(2)[None, None])                   # (1, 1, 2, 2)
    >>> future = np.array([[False, True], [False, False]])
    >>> attention(q, k, v, future, scale=1.0).data[0, 0, 0]         # the first query reads only key 0
    array([1., 0.])
    """
    q, k, v = ag.as_tensor(q), ag.as_tensor(k, q), ag.as_tensor(v, q)
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3] \
            or k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"attention needs q (B, H, n, D) and k, v (B, G, m, D) with H a multiple of G; "
                         f"got q {q.shape}, k {k.shape}, v {v.shape}")
    if q.dtype.kind != "f":
        raise TypeError(f"attention needs floating-point q, k, v, got dtype {q.dtype}")
    B, H, n, D = q.shape
    G, m = k.shape[1], k.shape[2]
    r = H // G
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"attention needs a bool mask (True = forbidden), got dtype {mask.dtype}")
        try:
            fits = np.broadcast_shapes(mask.shape, (B, 1, n, m)) == (B, 1, n, m)
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"mask of shape {mask.shape} does not broadcast to (B, 1, n, m) = {(B, 1, n, m)}")
    qg = q.data.reshape(B, G, r * n, D)                                 # (B, G, r*n, D)
    p = qg @ k.data.swapaxes(-1, -2)                                    # (B, G, r*n, m)
    p *= scale
    if mask is not None:
        mask = np.broadcast_to(mask, (B, 1, n, m))[:, :, None]          # (B, 1, 1, n, m)
        np.copyto(p.reshape(B, G, r, n, m), -np.inf, where=mask)
    softmax_inplace(p)                                                  # (B, G, r*n, m)
    out = p @ v.data                                                    # (B, G, r*n, D)

    def backward(g):
        gg = g.reshape(B, G, r * n, D)                                  # (B, G, r*n, D)
        gv = p.swapaxes(-1, -2) @ gg if v.requires_grad else None       # (B, G, m, D)
        ds = gg @ v.data.swapaxes(-1, -2)                               # (B, G, r*n, m)
        # Softmax backward: ds = p * (dp - sum_j p dp). The row sum equals
        # <g, out> over D, which is m/D times cheaper than summing over keys.
        ds -= (gg * out).sum(axis=-1, keepdims=True)
        ds *= p
        ds *= scale
        gq = (ds @ k.data).reshape(B, H, n, D) if q.requires_grad else None  # (B, H, n, D)
        gk = ds.swapaxes(-1, -2) @ qg if k.requires_grad else None      # (B, G, m, D)
        return gq, gk, gv
    return ag.make_op(out.reshape(B, H, n, D), (q, k, v), backward)
