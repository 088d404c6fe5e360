"""Fused attention: ``softmax(q k^T * scale, masked) v`` as one op, and the kernel that runs
:class:`glassllm.nn.Attention` with it.

The reference (``Attention.__call__``) spells steps 4 to 8 out: copy each K/V
head for the query heads it serves, the scores, ``masked_fill``, ``softmax``,
the mix. :func:`attention` does the same in one op with a hand-derived
backward: the r = H/G query heads that share a K/V head are folded into the
rows of one matmul (K and V are never copied per head), the mask is written
into the scores in place, and the softmax runs in place.

:func:`fused_attention` replaces the whole layer for any shape: the three
projections as one GEMM (``linear(x, (wq, wk, wv))``), RoPE, the cache, then
:func:`attention`. Long blocks take the tiled kernels of
:mod:`glassllm.kernels.flash` instead (registered first).

Shape legend: B batch, n new queries, m keys (m = start + n), H query heads,
G key/value heads, D head dim, C model width.
"""

from __future__ import annotations

import math

import numpy as np

from .. import autograd as ag
from ..autograd import Tensor
from ..positions import causal_mask

__all__ = ["attention", "forbidden", "project_rotate_cache", "fused_attention", "ATTENTION_INNER"]

# The layer's snapshots a kernel that computes attention in fused form never produces.
ATTENTION_INNER = ("q", "k", "v", "rope_q", "rope_k", "cache_k", "cache_v", "scores", "mask", "softmax", "mix",
                   "head_out")


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
    ag.softmax_inplace(p)                                               # (B, G, r*n, m)
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


def forbidden(n: int, m: int, start: int, pad: np.ndarray | None) -> np.ndarray:
    """The reference's mask with a leading batch axis, (1 or B, n, m) bool, True = forbidden:
    :func:`glassllm.positions.causal_mask` (which ``glassllm.nn.causal_mask`` is)."""
    mask = causal_mask(n, m, start, pad)
    return mask if pad is not None else mask[None]                      # (1|B, n, m)


def project_rotate_cache(attn, x: Tensor, rope, cache, start: int):
    """Steps 1-3 of the layer without snapshots: queries (B, H, n, D), and the m keys and values
    (B, G, m, D) they read -- one GEMM for wq|wk|wv, RoPE, the cache."""
    B, n, _ = x.shape
    H, G, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q, k, v = ag.split(ag.linear(x, (attn.wq.weight, attn.wk.weight, attn.wv.weight)),
                       [H * D, G * D, G * D], axis=-1)
    q = q.reshape(B, n, H, D).transpose(0, 2, 1, 3)                    # (B, H, n, D)
    k = k.reshape(B, n, G, D).transpose(0, 2, 1, 3)                    # (B, G, n, D)
    v = v.reshape(B, n, G, D).transpose(0, 2, 1, 3)                    # (B, G, n, D)
    cos, sin = rope
    q, k = ag.rope(q, cos, sin), ag.rope(k, cos, sin)                   # (B, H|G, n, D)
    if cache is not None:
        k, v = cache.append(attn.layer, start, k, v)                    # (B, G, m, D)
    return q, k, v


def fused_attention(attn, x: Tensor, rope, cache=None, start: int = 0, pad: np.ndarray | None = None) -> Tensor:
    """``Attention.__call__`` with steps 4-8 as the one op :func:`attention`. Returns (B, n, C)."""
    B, n, _ = x.shape
    H, D = attn.n_heads, attn.head_dim
    q, keys, values = project_rotate_cache(attn, x, rope, cache, start)
    mask = forbidden(n, start + n, start, pad)[:, None]                 # (1|B, 1, n, m)
    mix = attention(q, keys, values, mask, 1.0 / math.sqrt(D))          # (B, H, n, D)
    heads = mix.transpose(0, 2, 1, 3).reshape(B, n, H * D)              # (B, n, H*D)
    return attn.snap("out", attn.wo(heads))                             # (B, n, C)

