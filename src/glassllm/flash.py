"""Exact attention in tiles, with an online softmax (the FlashAttention algorithm), in NumPy.

Dense attention builds the whole (n, m) score matrix per head. Here queries
and keys are cut into blocks; for each query block we walk the key blocks it
may see, keeping for every query row a running maximum ``mx``, a running
normaliser ``l`` and a running weighted sum ``acc`` of values. When a new block
raises the maximum, the old ``l`` and ``acc`` are rescaled by
``exp(old_mx - new_mx)`` -- the same numbers a full softmax would give, up to
rounding, but the largest buffer is one (block x block) tile per head.
Blocks that lie entirely in the masked future are skipped: causal attention
does about half the work of the dense path.

The backward recomputes each tile's probabilities from the saved row
log-sum-exp instead of storing them (FlashAttention-2):
``p = exp(s - lse)``, ``dv += p^T do``, ``dp = do v^T``,
``ds = p (dp - delta) scale`` with ``delta = rowsum(do * out)``,
``dq += ds k``, ``dk += ds^T q``.

The mask is described, not stored: query i (absolute position start + i)
may read key j when ``j <= start + i`` and ``j >= pad[b]`` (left padding).
A row with no legal key gives zeros, as in :func:`glassllm.autograd.softmax_np`.

Shape legend: B batch, H query heads, G key/value heads (r = H/G query heads
per K/V head), n queries, m keys, D head dim, bq/bk block sizes.
"""

from __future__ import annotations

import numpy as np

from .autograd import Tensor, _as_tensor, _make, _need

__all__ = ["flash_attention"]


def _block_mask(q0: int, q1: int, k0: int, k1: int, start: int, pad):
    """Forbidden entries of one tile, or None when the whole tile is legal.

    Returns a bool array broadcastable to (B, 1, 1, bq, bk) (True = forbidden).
    """
    qpos = start + np.arange(q0, q1)                                   # (bq,)
    kpos = np.arange(k0, k1)                                           # (bk,)
    mask = None
    if k1 - 1 > start + q0:                                            # the tile crosses the diagonal
        mask = (kpos[None, :] > qpos[:, None])[None, None, None]       # (1, 1, 1, bq, bk)
    if pad is not None and k0 < pad.max():
        padded = (kpos[None, :] < pad[:, None])[:, None, None, None, :]  # (B, 1, 1, 1, bk)
        mask = padded if mask is None else (mask | padded)
    return mask


def _scores(qi, kj, scale, mask, shape5):
    """Scaled scores of one tile with forbidden entries at -inf: (B, G, r*bq, bk)."""
    s = qi @ kj.swapaxes(-1, -2)                                        # (B, G, r*bq, bk)
    s *= scale
    if mask is not None:
        np.copyto(s.reshape(shape5), -np.inf, where=mask)
    return s


def flash_attention(q, k, v, scale: float, start: int = 0, pad: np.ndarray | None = None,
                    block_q: int = 64, block_k: int = 64) -> Tensor:
    """Causal grouped-query attention computed tile by tile: same result as dense attention.

    q (B, H, n, D) at absolute positions start .. start+n-1; k, v (B, G, m, D)
    at positions 0 .. m-1 with m >= start + n (keys past start + n - 1 are
    never visible). ``pad`` (B,) left-padding counts. Returns (B, H, n, D).
    """
    q, k, v = _as_tensor(q), _as_tensor(k, q), _as_tensor(v, q)
    B, H, n, D = q.shape
    G, m = k.shape[1], k.shape[2]
    r = H // G
    dtype = q.dtype
    q5 = q.data.reshape(B, G, r, n, D)                                 # (B, G, r, n, D)
    kd, vd = k.data, v.data
    out = np.empty((B, G, r, n, D), dtype=dtype)                       # (B, G, r, n, D)
    lse = np.empty((B, G, r, n), dtype=dtype)                          # (B, G, r, n)
    tiles = []                                                         # (q0, q1, k0, k1) visited

    for q0 in range(0, n, block_q):
        q1 = min(q0 + block_q, n)
        bq = q1 - q0
        qi = q5[:, :, :, q0:q1].reshape(B, G, r * bq, D)               # (B, G, r*bq, D)
        mx = np.full((B, G, r * bq, 1), -np.inf, dtype=dtype)          # running max
        l = np.zeros((B, G, r * bq, 1), dtype=dtype)                   # running normaliser
        acc = np.zeros((B, G, r * bq, D), dtype=dtype)                 # running sum of p v
        last = min(m, start + q1)                                      # keys beyond are all future
        for k0 in range(0, last, block_k):
            k1 = min(k0 + block_k, last)
            mask = _block_mask(q0, q1, k0, k1, start, pad)
            s = _scores(qi, kd[:, :, k0:k1], scale, mask, (B, G, r, bq, k1 - k0))
            new_mx = np.maximum(mx, s.max(axis=-1, keepdims=True))     # (B, G, r*bq, 1)
            safe = np.where(np.isneginf(new_mx), 0.0, new_mx).astype(dtype, copy=False)
            s -= safe
            np.exp(s, out=s)                                           # p~ = exp(s - max)
            corr = np.exp(mx - safe)                                   # rescale old sums
            l *= corr
            l += s.sum(axis=-1, keepdims=True)
            acc *= corr
            acc += s @ vd[:, :, k0:k1]                                 # (B, G, r*bq, D)
            mx = new_mx
            tiles.append((q0, q1, k0, k1))
        legal = l > 0
        out[:, :, :, q0:q1] = (acc / np.where(legal, l, 1.0)).reshape(B, G, r, bq, D)
        # log-sum-exp per row; +inf for a row with no legal key so that exp(s - lse) = 0 later
        row_lse = np.where(legal, mx + np.log(np.where(legal, l, 1.0)), np.inf)
        lse[:, :, :, q0:q1] = row_lse.reshape(B, G, r, bq)

    def backward(g):
        g5 = g.reshape(B, G, r, n, D)                                  # (B, G, r, n, D)
        delta = (g5 * out).sum(axis=-1)                                # (B, G, r, n)
        gq = np.zeros_like(q5) if _need(q) else None                  # (B, G, r, n, D)
        gk = np.zeros_like(kd)                                         # (B, G, m, D)
        gv = np.zeros_like(vd)                                         # (B, G, m, D)
        for q0, q1, k0, k1 in tiles:
            bq, bk = q1 - q0, k1 - k0
            qi = q5[:, :, :, q0:q1].reshape(B, G, r * bq, D)           # (B, G, r*bq, D)
            gi = g5[:, :, :, q0:q1].reshape(B, G, r * bq, D)           # (B, G, r*bq, D)
            kj, vj = kd[:, :, k0:k1], vd[:, :, k0:k1]                  # (B, G, bk, D)
            mask = _block_mask(q0, q1, k0, k1, start, pad)
            p = _scores(qi, kj, scale, mask, (B, G, r, bq, bk))
            p -= lse[:, :, :, q0:q1].reshape(B, G, r * bq, 1)
            np.exp(p, out=p)                                           # (B, G, r*bq, bk)
            gv[:, :, k0:k1] += p.swapaxes(-1, -2) @ gi                 # (B, G, bk, D)
            ds = gi @ vj.swapaxes(-1, -2)                              # (B, G, r*bq, bk)
            ds -= delta[:, :, :, q0:q1].reshape(B, G, r * bq, 1)
            ds *= p
            ds *= scale
            if gq is not None:
                gq[:, :, :, q0:q1] += (ds @ kj).reshape(B, G, r, bq, D)
            gk[:, :, k0:k1] += ds.swapaxes(-1, -2) @ qi                # (B, G, bk, D)
        return (gq.reshape(B, H, n, D) if gq is not None else None,
                gk if _need(k) else None, gv if _need(v) else None)

    return _make(out.reshape(B, H, n, D), (q, k, v), backward)
