"""The kernels that run a layer of :mod:`glassllm.nn`: the layer in, its output out.

Each takes the layer object and the layer's own ``__call__`` arguments, reads
only the layer's public attributes (its weights, sizes, ``eps``, ``snap``) and
computes what the layer's ``__call__`` computes with the fused operations of
:mod:`glassllm.ops` (looked up on their modules when called, so that a profiler
can wrap them there). They are registered, with the class each replaces, in
:mod:`glassllm.kernels`; the mask and the positions are the model's own
(:func:`glassllm.nn.causal_mask`), so the rule is written once.

- attention: :func:`fused_attention` for any shape (steps 4-8 as the one op
  :func:`glassllm.ops.attention`); for long blocks :func:`tiled_self_attention`
  (no cache: one GEMM, then RoPE and tiled attention as one op) and
  :func:`tiled_attention` (after a KV cache);
- :func:`fused_rms_norm`, :func:`fused_feed_forward`.

Shape legend: B batch, n new queries, m keys (m = start + n), H query heads,
G key/value heads, D head dim, C model width, F MLP width.
"""

from __future__ import annotations

import math

import numpy as np

from .. import autograd as ag
from ..autograd import Tensor
from ..nn import causal_mask
from ..ops import dense, flash, linear, mlp, norm

__all__ = ["ATTENTION_INNER", "project_rotate_cache", "fused_attention", "tiled_self_attention", "tiled_attention",
           "fused_rms_norm", "fused_feed_forward"]

# The layer's snapshots a kernel that computes attention in fused form never produces.
ATTENTION_INNER = ("q", "k", "v", "rope_q", "rope_k", "cache_k", "cache_v", "scores", "mask", "softmax", "mix",
                   "head_out")


def project_rotate_cache(attn, x: Tensor, rope, cache, start: int):
    """Steps 1-3 of the layer without snapshots: queries (B, H, n, D), and the m keys and values
    (B, G, m, D) they read -- one GEMM for wq|wk|wv, RoPE, the cache."""
    B, n, _ = x.shape
    H, G, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q, k, v = ag.split(linear.linear_stacked(x, (attn.wq.weight, attn.wk.weight, attn.wv.weight)),
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
    """``Attention.__call__`` with steps 4-8 as the one op :func:`glassllm.ops.attention`. Returns (B, n, C)."""
    B, n, _ = x.shape
    H, D = attn.n_heads, attn.head_dim
    q, keys, values = project_rotate_cache(attn, x, rope, cache, start)
    mask = causal_mask(n, start + n, start, pad)                        # (n, m), or (B, n, m) with padding
    if pad is not None:
        mask = mask[:, None]                                            # (B, 1, n, m)
    mix = dense.attention(q, keys, values, mask, 1.0 / math.sqrt(D))    # (B, H, n, D)
    heads = mix.transpose(0, 2, 1, 3).reshape(B, n, H * D)              # (B, n, H*D)
    return attn.snap("out", attn.wo(heads))                             # (B, n, C)


def tiled_self_attention(attn, x: Tensor, rope, cache=None, start: int = 0, pad: np.ndarray | None = None) -> Tensor:
    """``Attention.__call__`` for a block with no cache: steps 1-9 as three ops -- one GEMM for
    wq|wk|wv, then RoPE and tiled attention together (:func:`glassllm.ops.self_attention`), the heads
    coming out side by side, then wo. Returns (B, n, C)."""
    qkv = linear.linear_stacked(x, (attn.wq.weight, attn.wk.weight, attn.wv.weight))  # (B, n, (H+2G)*D)
    heads = flash.self_attention(qkv, attn.n_heads, attn.n_kv_heads, rope[0], rope[1], pad)  # (B, n, H*D)
    return attn.snap("out", attn.wo(heads))                                # (B, n, C)


def tiled_attention(attn, x: Tensor, rope, cache=None, start: int = 0, pad: np.ndarray | None = None) -> Tensor:
    """``Attention.__call__`` with steps 4-8 computed tile by tile (:func:`glassllm.ops.flash_attention`):
    for a long block after a KV cache, which never holds an (n, m) matrix. Returns (B, n, C)."""
    B, n, _ = x.shape
    H, D = attn.n_heads, attn.head_dim
    q, keys, values = project_rotate_cache(attn, x, rope, cache, start)
    mix = flash.flash_attention(q, keys, values, 1.0 / math.sqrt(D), start, pad)  # (B, H, n, D)
    heads = mix.transpose(0, 2, 1, 3).reshape(B, n, H * D)                # (B, n, H*D)
    return attn.snap("out", attn.wo(heads))                                # (B, n, C)


def fused_rms_norm(layer, x: Tensor) -> Tensor:
    """``RMSNorm.__call__`` as the one op :func:`glassllm.ops.rms_norm` (no ``rms`` snapshot). Returns (B, n, C)."""
    x = layer.snap("in", x)
    return layer.snap("out", norm.rms_norm(x, layer.weight, layer.eps))


def fused_feed_forward(ffn, x: Tensor) -> Tensor:
    """``FeedForward.__call__`` as two GEMMs and :func:`glassllm.ops.swiglu` (no gate/up/act/prod
    snapshots): (B, n, C)."""
    gate_up = linear.linear_stacked(x, (ffn.w1.weight, ffn.w3.weight))         # (B, n, 2F)
    return ffn.snap("out", ffn.w2(mlp.swiglu(gate_up)))                 # (B, n, C)
