"""Reference solutions of the exercises: plain NumPy, one function each.

Each function is what a student writes in the stub of the same name
(``glassllm check --stub NAME``); the checker compares a student's function
with glassllm's own code, and the test suite checks that these solutions pass.
The docs show them folded away, word for word.
"""

from __future__ import annotations

import numpy as np


def softmax(x):
    """Softmax over the last axis of ``x``, stable for large scores.

    x: float array (..., m); returns an array of the same shape and dtype whose
    rows are non-negative and sum to 1. Entries equal to -inf get weight 0; a
    row that is all -inf (every key forbidden) gives all zeros, not NaN.
    """
    peak = np.max(x, axis=-1, keepdims=True)          # (..., 1)
    peak = np.where(np.isneginf(peak), 0.0, peak)     # an all -inf row: shift by 0
    e = np.exp(x - peak)                              # (..., m), every entry <= 1
    total = np.sum(e, axis=-1, keepdims=True)         # (..., 1)
    total = np.where(total == 0, 1.0, total)          # 0 / 1 instead of 0 / 0
    return (e / total).astype(x.dtype)


def causal_mask(n, m, start):
    """Forbidden positions for n new queries against m keys: bool (n, m), True = forbidden.

    Query i sits at absolute position start + i and may read keys
    0 .. start + i (itself included); key j is forbidden where j > start + i.
    """
    keys = np.arange(m)[None, :]                      # (1, m)
    queries = start + np.arange(n)[:, None]           # (n, 1) absolute positions
    return keys > queries                             # (n, m)


def attention_head(q, k, v):
    """One causal attention head: softmax(q k^T / sqrt(D), masked) v.

    q: (n, D) queries of the n newest positions; k, v: (m, D) keys and values of
    all m positions, with m >= n. Query i sits at position start + i, where
    start = m - n, and reads keys 0 .. start + i. Returns (n, D), dtype of q.
    """
    n, D = q.shape
    m = k.shape[0]
    start = m - n
    scores = q @ k.T / np.sqrt(D)                                      # (n, m)
    future = np.arange(m)[None, :] > start + np.arange(n)[:, None]     # (n, m)
    scores = np.where(future, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)               # each row has a legal key
    weights = np.exp(scores)
    weights = weights / weights.sum(axis=-1, keepdims=True)            # (n, m)
    return (weights @ v).astype(q.dtype)                               # (n, D)


def rope_vector(x, pos, theta=10000.0):
    """Rotary position embedding of one head vector x (D,) at position pos.

    Features are taken in interleaved pairs (x[2i], x[2i+1]); pair i turns by
    the angle pos * theta ** (-2i / D):
    (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos). Returns (D,), dtype of x.
    """
    D = x.shape[-1]
    i = np.arange(D // 2)
    angle = pos * theta ** (-2.0 * i / D)             # (D/2,)
    cos, sin = np.cos(angle), np.sin(angle)
    x0, x1 = x[0::2], x[1::2]                         # (D/2,) each
    out = np.empty_like(x)
    out[0::2] = x0 * cos - x1 * sin
    out[1::2] = x0 * sin + x1 * cos
    return out


def rms_norm(x, weight, eps=1e-5):
    """RMSNorm over the last axis: x / sqrt(mean(x**2) + eps) * weight.

    x: (..., C); weight: (C,). No mean is subtracted (that would be LayerNorm).
    Returns (..., C), dtype of x.
    """
    rms = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)   # (..., 1)
    return (x / rms * weight).astype(x.dtype)


def softmax_backward(p, g):
    """The gradient through a softmax over the last axis.

    p = softmax(s) (..., m), the forward's output; g = dL/dp (..., m).
    Returns dL/ds (..., m): ds = p * (g - sum(g * p)), the sum over each row
    (the Jacobian of softmax is diag(p) - p p^T). Each row of ds sums to 0.
    """
    inner = np.sum(g * p, axis=-1, keepdims=True)    # (..., 1)
    return p * (g - inner)
