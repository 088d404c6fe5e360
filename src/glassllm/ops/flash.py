"""Exact attention in tiles, with an online softmax (the FlashAttention algorithm), in NumPy.

Dense attention builds the whole (n, m) score matrix per head. Here queries
and keys are cut into blocks; for each query block we walk the key blocks it
may see, keeping for every query row a running maximum ``mx``, a running
normaliser ``l`` and a running weighted sum ``acc`` of values. When a new block
raises the maximum, the old ``l`` and ``acc`` are rescaled by
``exp(old_mx - new_mx)`` -- the same numbers a full softmax would give, up to
rounding, but the largest buffer is one (query block x key block) tile per
head. Key blocks that lie entirely in the masked future are never visited, and
the last block a query block visits ends at its diagonal: causal attention
does a little over half the work of the dense path.

The backward recomputes each tile's probabilities from the saved row
log-sum-exp instead of storing them (FlashAttention-2):
``p = exp(s - lse)``, ``dv += p^T do``, ``dp = do v^T``,
``ds = p (dp - delta)`` with ``delta = rowsum(do * out)``,
``dq += ds k scale``, ``dk += ds^T q scale``.

Three refinements make this fast in NumPy, where every pass over a tile is a
separate call (each is tested equal to the plain algorithm, ``tests/test_flash.py``):

- *a shift known in advance*: when a Cauchy-Schwarz bound of each row's
  largest score is provably close to it (:func:`_score_bound`), the bound
  replaces the running maximum -- no max pass, no rescaling -- and is folded
  into the score GEMM as an extra column, so a forward tile is one GEMM, the
  mask strip, one exp and one GEMM; otherwise the query block falls back to
  the running maximum above;
- *transposed tiles* (keys down, queries across), whose reductions run over
  the leading axis, and *ones columns* ([v | 1]) that make the value GEMM
  return each row's sum of probabilities too;
- *kept tiles*: for a training window (every query block within one key
  block, all tiles together under ``KEEP_BYTES``) the forward keeps its
  probability tiles and the backward skips the recomputation. Long sequences
  never qualify, and hold one tile at a time.

The mask is described, not stored: query i (absolute position start + i)
may read key j when ``j <= start + i`` and ``j >= pad[b]`` (left padding).
A row with no legal key gives zeros, as in :func:`glassllm.autograd.softmax_np`.

Block sizes. Each tile costs a dozen NumPy calls, so tiles should be large
enough that the arithmetic, not Python, dominates -- and small enough that a
tile of scores stays in the core's cache while it is exponentiated, summed and
multiplied. Queries go in blocks of ``BLOCK_Q`` rows per head; keys in blocks of
up to ``BLOCK_K`` (a 256-token training window is one key block, so its softmax
is a plain one; the last query block of a 4,096-token sequence folds in eight);
and batch rows are grouped so that one tile of scores is about ``TILE_BYTES``.
``python -m bench.bench_longctx --tune`` measured these choices; on the benchmark
machine they sit on a broad plateau (most choices within the noise), and
BLOCK_K = 512 was the best for 4,096 tokens.

Two ops share the tile loops:

- :func:`flash_attention` ``(q, k, v)`` with q (B, H, n, D) and k, v (B, G, m, D),
  for any ``start`` (queries after a KV cache) and left padding;
- :func:`self_attention` ``(qkv)``: the training-time block of a sequence
  attending to itself, straight from the packed projections ``wq | wk | wv``
  (B, n, (H + 2G) D), with the rotary embedding applied inside and the heads
  returned side by side, (B, n, H D), ready for ``wo``. Nothing is transposed
  into a new array on the way in or out, and the backward hands the packed
  gradient back in one piece for one GEMM.

Two kernels (:mod:`glassllm.kernels.layers`) run the attention layer with them
when a block has at least ``FLASH_MIN_QUERIES`` new queries (below that the
dense fused op of :mod:`glassllm.ops.dense` is faster).

Shape legend: B batch, H query heads, G key/value heads (r = H/G query heads
per K/V head), n queries, m keys, D head dim; nb batch rows, nq queries and
kk keys of one tile.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .. import autograd as ag
from ..autograd import Tensor, is_grad_enabled, rotate
from .rotary import rope_table

__all__ = ["flash_attention", "self_attention", "FLASH_MIN_QUERIES",
           "BLOCK_Q", "BLOCK_K", "TILE_BYTES", "MAX_GAP", "KEEP_BYTES"]

# From this many new queries on, the attention layer runs the tiled kernels; below it
# (decoding, short prompts) the dense fused op is faster.
FLASH_MIN_QUERIES = 128

BLOCK_Q = 64           # query rows per head in one tile
BLOCK_K = 512          # keys in one tile (at most)
TILE_BYTES = 1 << 20   # batch rows are grouped so one tile of scores is about this size

# A score bound may serve as the softmax shift when it lies within this much of
# the row's maximum: exp(-MAX_GAP) is far above the smallest normal number
# (float32: e^-70 = 4e-31 vs 1.2e-38), so no probability that matters loses bits.
MAX_GAP = {np.float32: 70.0, np.float64: 600.0}

KEEP_BYTES = 64 << 20  # the forward keeps its probability tiles for the backward up to this size


# ----------------------------------------------------------------------------
# Tile loops (plain NumPy; the entry points below wrap them as autograd ops)
# ----------------------------------------------------------------------------

def _batch_group(B: int, row_bytes: int) -> int:
    """How many batch rows one tile holds so that it stays near TILE_BYTES."""
    return max(1, min(B, TILE_BYTES // max(row_bytes, 1)))


def _tiles(q5: np.ndarray, m: int, bq: int, bk: int, pad):
    """(b0, b1, pad[b0:b1], q0, q1) of every tile, batch groups outer, query blocks inner.

    q5 (B, G, r, n, D) queries against m keys. The forward and the backward walk
    the same tiles in the same order (the kept probability tiles are keyed by (b0, q0)).
    """
    B, G, r, n, _ = q5.shape
    nb = _batch_group(B, G * r * min(bq, n) * min(bk, m) * q5.dtype.itemsize)
    for b0 in range(0, B, nb):
        b1 = min(b0 + nb, B)
        padb = None if pad is None else pad[b0:b1]
        for q0 in range(0, n, bq):
            yield b0, b1, padb, q0, min(q0 + bq, n)


def _with_ones(x):
    """[x | 1]: x (B, G, m, D) with a column of ones appended, (B, G, m, D+1)."""
    out = np.empty(x.shape[:-1] + (x.shape[-1] + 1,), dtype=x.dtype)
    out[..., :-1] = x
    out[..., -1] = 1.0
    return out


def _augmented(x5, b0, b1, q0, q1, factor, last):
    """One tile of per-query rows with a last column appended: [x * factor | last], (nb, G, r*nq, D+1).

    The copy is also the gather that makes the tile contiguous for BLAS.
    ``last`` (B, G, r, n) is the per-query number the next GEMM folds in.
    """
    nb, G, r, _, D = x5[b0:b1].shape
    out = np.empty((nb, G, r, q1 - q0, D + 1), dtype=x5.dtype)         # (nb, G, r, nq, D+1)
    if factor is None:
        out[..., :D] = x5[b0:b1, :, :, q0:q1]
    else:
        np.multiply(x5[b0:b1, :, :, q0:q1], factor, out=out[..., :D])
    out[..., D] = last[b0:b1, :, :, q0:q1]
    return out.reshape(nb, G, r * (q1 - q0), D + 1)                      # (nb, G, r*nq, D+1)


def _vecdot(a, b):
    """Dot products over the last axis, broadcasting the others (NumPy >= 2 has a ufunc for it)."""
    if hasattr(np, "vecdot"):
        return np.vecdot(a, b)
    return np.einsum("...d,...d->...", a, b)


@lru_cache(maxsize=512)
def _causal_bias(q0: int, q1: int, c0: int, k1: int, start: int, dtype) -> np.ndarray:
    """0 where key j (c0 <= j < k1) may be read by query i (q0 <= i < q1), else -inf: (k1-c0, 1, nq).

    Every batch group of every step asks for the same few tiles, so they are
    kept (read-only).
    """
    future = np.arange(c0, k1)[:, None, None] > (start + np.arange(q0, q1))[None, None, :]
    bias = np.where(future, -np.inf, 0.0).astype(dtype)
    bias.flags.writeable = False
    return bias


def _mask_tile(sT, r, q0, q1, k0, k1, start, pad):
    """Set the forbidden scores of a transposed tile (nb, G, kk, r*nq) to -inf, in place.

    Causal: only the keys past the block's first query can be forbidden, so
    only that strip is touched, by adding a (keys, queries) bias of 0 and -inf
    (an add is about twice as fast as a masked copy). Padding: keys before
    pad[b] in row b.
    """
    nb, G = sT.shape[:2]
    nq, kk = q1 - q0, k1 - k0
    c0 = max(k0, start + q0 + 1)               # first key some query of the block may not read
    if c0 < k1:
        strip = sT.reshape(nb, G, kk, r, nq)[:, :, c0 - k0:]                # (nb, G, k1-c0, r, nq)
        np.add(strip, _causal_bias(q0, q1, c0, k1, start, sT.dtype.type), out=strip)
    if pad is not None and k0 < pad.max():
        padded = np.arange(k0, k1)[None, :] < pad[:, None]                  # (nb, kk)
        np.copyto(sT, -np.inf, where=padded[:, None, :, None])


def _score_bound(q, k, scale, start):
    """An upper bound of each query's largest score, and how far it may be from it.

    Cauchy-Schwarz: q.k <= |q| |k|, so ``bound`` = scale |q_i| max_{j <= start+i} |k_j|
    is at least every score query i may see. Its own key (j = start + i) is one
    of them, so the true maximum lies in [own, bound]. Inputs in position-major
    order, q (B, n, G, r, D) and k (B, m, G, D) (views are fine); returns
    (bound, gap), both (B, G, r, n) views, gap = bound - own. Norms and
    same-position dot products do not change under RoPE, so callers may pass
    the projections before rotation, straight from the packed GEMM output.
    """
    n = q.shape[1]
    kn = np.sqrt(np.einsum("bmgd,bmgd->bmg", k, k))                     # (B, m, G) key norms
    np.maximum.accumulate(kn, axis=1, out=kn)                           # max over keys 0 .. j
    bound = np.sqrt(np.einsum("bngrd,bngrd->bngr", q, q))               # (B, n, G, r) query norms
    bound *= kn[:, start:start + n, :, None]
    bound *= scale
    gap = _vecdot(q, k[:, start:start + n, :, None])                   # (B, n, G, r) own score
    gap *= -scale
    gap += bound
    return bound.transpose(0, 2, 3, 1), gap.transpose(0, 2, 3, 1)       # (B, G, r, n)


def _forward(q5, k1, v1, scale, start, pad, out5, bq, bk, bound, gap, keep=None):
    """Write softmax(q k^T scale, masked) v into ``out5``; return the row log-sum-exp.

    q5 (B, G, r, n, D); k1, v1 (B, G, m, D+1): keys and values with a column
    of ones appended (:func:`_with_ones`); out5 (B, G, r, n, D), any strides;
    bound, gap (B, G, r, n) from :func:`_score_bound`. Returns lse (B, G, r, n);
    rows with no legal key get +inf there. With a dict ``keep``, tiles that
    took the bound shift in a single key block are stored there for the
    backward (see :func:`_keeps_tiles`).

    Tiles are computed transposed, keys down and queries across (kk, r*nq), so
    that reductions run over the leading axis (vectorised across a row of
    queries), and the ones column makes the value GEMM return each row's sum
    of probabilities in its last column.

    The reference each exponent is taken from. Softmax needs some shift c_i
    per row with exp(s - c_i) neither overflowing nor vanishing: the running
    maximum of online softmax is one. When the Cauchy-Schwarz bound of
    :func:`_score_bound` is within ``MAX_GAP`` of a score the row surely
    has, the bound itself is a safe shift known *before* any score is
    computed (the "unified max" of FlashDecoding++): it is folded into the
    score GEMM as one more column, [k | 1] @ [q scale | -bound]^T = s - bound,
    and a tile costs one GEMM, the mask strip, one exp and one GEMM -- no
    running maximum, no rescaling. Otherwise (or with left padding) the query
    block falls back to the running maximum.
    """
    B, G, r, n, D = q5.shape
    m = k1.shape[2]
    dtype = out5.dtype
    tight = gap < MAX_GAP[dtype.type]                                   # (B, G, r, n)
    lse = np.empty((B, G, r, n), dtype=dtype)                           # (B, G, r, n)
    for b0, b1, padb, q0, q1 in _tiles(q5, m, bq, bk, pad):
        rows = (b1 - b0, G, r, q1 - q0)
        fixed = padb is None and tight[b0:b1, :, :, q0:q1].all()
        qe = _augmented(q5, b0, b1, q0, q1, scale, -bound)          # (nb, G, r*nq, D+1)
        qi = qe if fixed else qe[..., :D]
        last = min(m, start + q1)                                   # keys past this are all future
        mx = acc = None
        for k0 in range(0, last, bk):
            k1_ = min(k0 + bk, last)
            kj = k1[b0:b1, :, k0:k1_]                               # (nb, G, kk, D+1)
            sT = (kj if fixed else kj[..., :D]) @ qi.swapaxes(-1, -2)  # (nb, G, kk, r*nq)
            _mask_tile(sT, r, q0, q1, k0, k1_, start, padb)
            if not fixed:                                           # online softmax: running max
                new = sT.max(axis=-2, keepdims=True)                # (nb, G, 1, r*nq)
                if mx is not None:
                    np.maximum(new, mx, out=new)
                # A query whose keys so far are all forbidden has max -inf; shift
                # it by 0 instead (its exponentials are 0 either way).
                shift = new if padb is None else np.where(np.isneginf(new), 0.0, new).astype(dtype)
                sT -= shift
            np.exp(sT, out=sT)                                      # p~ = exp(s - shift)
            part = sT.swapaxes(-1, -2) @ v1[b0:b1, :, k0:k1_]       # (nb, G, r*nq, D+1): [p~ v | sum p~]
            if keep is not None and fixed and k1_ == last and k0 == 0:
                keep[b0, q0] = (sT, 1.0 / part[..., D:])            # p~ and 1 / sum p~, per query
            if acc is None:
                acc = part
            else:
                if not fixed:
                    acc *= np.exp(mx - shift).swapaxes(-1, -2)      # rescale the old sums
                acc += part
            if not fixed:
                mx = new
        l = acc[..., D:]                                            # (nb, G, r*nq, 1)
        ref = bound[b0:b1, :, :, q0:q1].reshape(*rows[:2], -1, 1) if fixed else mx.swapaxes(-1, -2)
        if padb is None:
            row_lse = np.log(l) + ref
        else:
            legal = l > 0
            l = np.where(legal, l, 1.0).astype(dtype)
            row_lse = np.where(legal, np.log(l) + ref, np.inf).astype(dtype)
        np.divide(acc[..., :D].reshape(*rows, D), l.reshape(*rows, 1), out=out5[b0:b1, :, :, q0:q1])
        lse[b0:b1, :, :, q0:q1] = row_lse.reshape(rows)
    return lse


def _keeps_tiles(B, G, r, n, m, start, bq, bk, itemsize) -> bool:
    """Should the forward keep its probability tiles for the backward?

    Recomputing a tile costs the backward a GEMM, the mask and an exp. When
    every query block sees a single key block and all tiles together stay
    within ``KEEP_BYTES`` (a training window: 16 x 256 tokens keep ~10 MiB per
    layer), the forward keeps them -- p~ = exp(s - bound) and each query's
    1 / sum p~ -- instead. Long sequences never qualify, so they still hold
    no more than one tile at a time.
    """
    if start + n > bk:
        return False
    total = sum(min(m, start + min(q0 + bq, n)) * (min(q0 + bq, n) - q0) for q0 in range(0, n, bq))
    return B * G * r * total * itemsize <= KEEP_BYTES


def _backward(q5, k1, v1, scale, start, pad, g5, out5, lse, bq, bk, dq5, dk, dv, kept=None):
    """Gradients of :func:`_forward` for the output cotangent ``g5`` (B, G, r, n, D).

    Writes dq5 (B, G, r, n, D); *adds* into dk and dv (B, G, m, D), which the
    caller zeroes. All may be strided views of the caller's own layout.
    Per tile, with the two per-row numbers folded into the GEMMs as extra
    columns: p^T = exp([k | 1] @ [q scale | -lse]^T) and
    ds^T = p^T * ([v | 1] @ [do | -delta]^T). A tile the forward kept in
    ``kept`` skips the first: it holds p~ = p * sum p~, and 1 / sum p~ scales
    the rows of [do | -delta] instead (R x (D+1) numbers, not kk x R).
    """
    B, G, r, n, D = q5.shape
    m = k1.shape[2]
    dtype = q5.dtype
    neg_lse = -lse
    if pad is not None:  # rows with no legal key: exp(s - huge) = 0, and no inf enters a GEMM
        np.maximum(neg_lse, -np.finfo(dtype).max, out=neg_lse)
    neg_delta = np.einsum("bgrnd,bgrnd->bgrn", g5, out5)                # (B, G, r, n)
    np.negative(neg_delta, out=neg_delta)
    for b0, b1, padb, q0, q1 in _tiles(q5, m, bq, bk, pad):
        nq = q1 - q0
        qe = _augmented(q5, b0, b1, q0, q1, scale, neg_lse)         # (nb, G, r*nq, D+1)
        ge = _augmented(g5, b0, b1, q0, q1, None, neg_delta)        # (nb, G, r*nq, D+1)
        qi, gi = qe[..., :D], ge[..., :D]                           # (nb, G, r*nq, D)
        if kept is not None and (b0, q0) in kept:
            pT, inv_sum = kept.pop((b0, q0))                        # (nb, G, kk, r*nq), (nb, G, r*nq, 1)
            ge *= inv_sum                                           # p~ / sum p~ = p
            kj, vj = k1[b0:b1, :, :pT.shape[2]], v1[b0:b1, :, :pT.shape[2]]
            dv[b0:b1, :, :pT.shape[2]] += pT @ gi                   # (nb, G, kk, D)
            dsT = vj @ ge.swapaxes(-1, -2)                          # (nb, G, kk, r*nq): (dp - delta) / sum p~
            dsT *= pT
            dk[b0:b1, :, :pT.shape[2]] += dsT @ qi                  # (nb, G, kk, D)
            dqi = dsT.swapaxes(-1, -2) @ kj[..., :D]                # (nb, G, r*nq, D)
            np.multiply(dqi.reshape(b1 - b0, G, r, nq, D), scale, out=dq5[b0:b1, :, :, q0:q1])
            continue
        dqi = None
        for k0 in range(0, min(m, start + q1), bk):
            k1_ = min(k0 + bk, m, start + q1)
            kj, vj = k1[b0:b1, :, k0:k1_], v1[b0:b1, :, k0:k1_]     # (nb, G, kk, D+1)
            pT = kj @ qe.swapaxes(-1, -2)                           # (nb, G, kk, r*nq): s - lse
            _mask_tile(pT, r, q0, q1, k0, k1_, start, padb)
            np.exp(pT, out=pT)                                      # the forward's probabilities
            dv[b0:b1, :, k0:k1_] += pT @ gi                         # (nb, G, kk, D)
            dsT = vj @ ge.swapaxes(-1, -2)                          # (nb, G, kk, r*nq): dp - delta
            dsT *= pT                                               # d(scaled scores)
            dk[b0:b1, :, k0:k1_] += dsT @ qi                        # (nb, G, kk, D)
            if dqi is None:
                dqi = dsT.swapaxes(-1, -2) @ kj[..., :D]            # (nb, G, r*nq, D)
            else:
                dqi += dsT.swapaxes(-1, -2) @ kj[..., :D]
        np.multiply(dqi.reshape(b1 - b0, G, r, nq, D), scale, out=dq5[b0:b1, :, :, q0:q1])


# ----------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------

def flash_attention(q, k, v, scale: float, start: int = 0, pad: np.ndarray | None = None,
                    block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> Tensor:
    """Causal grouped-query attention computed tile by tile: same result as dense attention.

    q (B, H, n, D) at absolute positions start .. start+n-1; k, v (B, G, m, D)
    at positions 0 .. m-1 with m >= start + n (keys past start + n - 1 are
    never visible). ``pad`` (B,) left-padding counts. Returns (B, H, n, D).
    """
    q, k, v = ag.as_tensor(q), ag.as_tensor(k, q), ag.as_tensor(v, q)
    B, H, n, D = q.shape
    G = k.shape[1]
    r = H // G
    dtype = q.dtype
    scale = dtype.type(scale)
    q5 = q.data.reshape(B, G, r, n, D)                                 # (B, G, r, n, D)
    k1, v1 = _with_ones(k.data), _with_ones(v.data)                    # (B, G, m, D+1)
    out = np.empty((B, G, r, n, D), dtype=dtype)                       # (B, G, r, n, D)
    bound, gap = _score_bound(q5.transpose(0, 3, 1, 2, 4), k.data.transpose(0, 2, 1, 3), scale, start)
    grad = is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    keep = {} if grad and _keeps_tiles(B, G, r, n, k.shape[2], start, block_q, block_k, dtype.itemsize) else None
    lse = _forward(q5, k1, v1, scale, start, pad, out, block_q, block_k, bound, gap, keep)

    def backward(g):
        dq = np.empty_like(out)                                        # (B, G, r, n, D)
        dk, dv = np.zeros_like(k.data), np.zeros_like(v.data)          # (B, G, m, D)
        _backward(q5, k1, v1, scale, start, pad, g.reshape(B, G, r, n, D), out, lse,
                  block_q, block_k, dq, dk, dv, keep)
        return (dq.reshape(B, H, n, D) if q.requires_grad else None,
                dk if k.requires_grad else None, dv if v.requires_grad else None)

    return ag.make_op(out.reshape(B, H, n, D), (q, k, v), backward)


def self_attention(qkv, n_heads: int, n_kv_heads: int, cos: np.ndarray, sin: np.ndarray,
                   pad: np.ndarray | None = None, block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> Tensor:
    """Causal self-attention of a whole block from its packed projections, RoPE included.

    qkv (B, n, (H + 2G) D): per position, the H query heads, then the G key
    heads, then the G value heads (``linear_stacked(x, (wq, wk, wv))``), all at
    positions 0 .. n-1. cos, sin: the rotary tables, (n, D/2), or (B, 1, n, D/2)
    when rows have their own positions (left padding ``pad`` (B,)).
    Returns (B, n, H D), the heads side by side -- the same numbers as::

        q, k, v = split qkv; q, k = rope(q), rope(k)           # (B, H|G, n, D)
        flash_attention(q, k, v, 1/sqrt(D), 0, pad).transpose(0, 2, 1, 3).reshape(B, n, H*D)
    """
    qkv = ag.as_tensor(qkv)
    H, G = n_heads, n_kv_heads
    r = H // G
    B, n, width = qkv.shape
    D = width // (H + 2 * G)
    dtype = qkv.dtype
    scale = dtype.type(1.0 / np.sqrt(D))
    parts = qkv.data.reshape(B, n, H + 2 * G, D)                       # (B, n, H+2G, D)
    zq = rope_table(cos, sin, H, dtype)                                # (n|B, n, H, D/2) complex
    zk = rope_table(cos, sin, G, dtype)                                # (n|B, n, G, D/2) complex
    qr = rotate(parts[:, :, :H], zq)                                   # (B, n, H, D)
    k1 = np.empty((B, G, n, D + 1), dtype=dtype)                       # (B, G, n, D+1): [rope(k) | 1]
    rotate(parts[:, :, H:H + G], zk, out=k1[..., :D].transpose(0, 2, 1, 3))
    k1[..., D] = 1.0
    v1 = _with_ones(parts[:, :, H + G:].transpose(0, 2, 1, 3))         # (B, G, n, D+1): [v | 1]

    def heads5(a):  # (B, n, H, D) -> the (B, G, r, n, D) view the tile loops read
        return a.reshape(B, n, G, r, D).transpose(0, 2, 3, 1, 4)

    out = np.empty((B, n, H, D), dtype=dtype)                          # (B, n, H, D)
    # The bound's norms and same-position dot products, from the unrotated projections in place.
    bound, gap = _score_bound(parts[:, :, :H].reshape(B, n, G, r, D), parts[:, :, H:H + G], scale, 0)
    keep = ({} if is_grad_enabled() and qkv.requires_grad
            and _keeps_tiles(B, G, r, n, n, 0, block_q, block_k, dtype.itemsize) else None)
    lse = _forward(heads5(qr), k1, v1, scale, 0, pad, heads5(out), block_q, block_k, bound, gap, keep)

    def backward(g):
        dparts = np.empty((B, n, H + 2 * G, D), dtype=dtype)           # (B, n, H+2G, D)
        dq = np.empty((B, n, H, D), dtype=dtype)                       # (B, n, H, D)
        dk = np.zeros((B, n, G, D), dtype=dtype)                       # (B, n, G, D)
        dv = dparts[:, :, H + G:]                                      # (B, n, G, D), filled in place
        dv[...] = 0.0
        _backward(heads5(qr), k1, v1, scale, 0, pad, heads5(g.reshape(B, n, H, D)), heads5(out), lse,
                  block_q, block_k,
                  heads5(dq), dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3), keep)
        # RoPE is a rotation: its backward turns the gradients back by the opposite angles.
        rotate(dq, zq, out=dparts[:, :, :H], inverse=True)
        rotate(dk, zk, out=dparts[:, :, H:H + G], inverse=True)
        return (dparts.reshape(B, n, width),)

    return ag.make_op(out.reshape(B, n, H * D), (qkv,), backward)
