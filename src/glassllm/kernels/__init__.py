"""Kernels: the fast paths, each registered once beside the reference it replaces.

:mod:`glassllm.nn` is the spec: every layer's ``__call__`` computes the model
step by step, in the order the lessons explain it, naming each intermediate.
A *kernel* computes what one layer computes with fewer, bigger operations
(fused ops with hand-derived backwards, one GEMM for several projections,
attention in tiles that never holds the (n, m) scores). The registry below is
the whole list; for each kernel it says what it replaces, which snapshots it
does not produce, and what ``tests/test_kernels.py`` compares it with (values
and gradients, float64 to 1e-12 and float32 to rounding).

===========================  ========================  =============================  ===================
kernel                       replaces                  serves                         module
===========================  ========================  =============================  ===================
``tiled_self_attention``     ``nn.Attention``          >= 128 new queries, no cache   :mod:`.layers`
``tiled_attention``          ``nn.Attention``          >= 128 new queries, a cache    :mod:`.layers`
``fused_attention``          ``nn.Attention``          every other block              :mod:`.layers`
``fused_rms_norm``           ``nn.RMSNorm``            every block                    :mod:`.layers`
``fused_feed_forward``       ``nn.FeedForward``        every block                    :mod:`.layers`
``fast_decode``              ``nn.Transformer``        decoding steps with a cache    :mod:`.decode`
===========================  ========================  =============================  ===================

The kernels take a layer and sit above :mod:`glassllm.nn`; the array
operations they are built from (fused attention, tiled attention, RMSNorm,
SwiGLU, the stacked linear, the in-place softmax, RoPE's fast layouts) are
:mod:`glassllm.ops`, below it, and are also reachable from here
(``kernels.attention``, ``kernels.flash``, ...).

How a path is chosen: at the start of every forward the model asks the
dispatcher (:mod:`.dispatch`, reached through :mod:`glassllm.dispatcher`) once
which layers may run a kernel, given the
shapes and the snapshots an attached tracer wants, and the dispatcher sets each
layer's public ``kernel`` attribute; the model calls its layers through
:meth:`glassllm.nn.Module.run`, which runs that kernel or else the layer's
reference ``__call__``. A traced name always runs the reference. ``generate``
asks before each step whether the lean decoder may run it.
``kernels.plan(model, n=16)`` prints the choice for any shapes, with the
reasons (:mod:`.paths`); a trace records the paths taken (``trace.paths``).

Switching kernels off gives the reference path everywhere, with the same
results to float rounding::

    with glassllm.kernels.disabled():                 # every kernel
        logits = model(tokens)
    with glassllm.kernels.disabled("fast_decode"):    # only the named ones
        ...

Adding a kernel: write it in a module of this package (one concept per
module; its array operations in :mod:`glassllm.ops`), add one
:func:`register` call below, with the class it replaces, and one row to
``tests/test_kernels.py`` (a test fails while a registered kernel has no row).
"""

from __future__ import annotations

from .. import nn
from ..ops import (FLASH_MIN_QUERIES, attention, dense, flash, flash_attention, linear_stacked, mlp, norm,
                   rms_norm, row_sums, self_attention, softmax_inplace, swiglu)
from . import decode, layers
from .decode import FastDecoder
from .dispatch import choose, chosen, disabled, is_enabled, lean_decoding, slots
from .layers import ATTENTION_INNER
from .paths import Plan, plan, summary
from .registry import KERNELS, Kernel, kernels_for, register

__all__ = [
    "Kernel", "KERNELS", "register", "kernels_for", "disabled", "is_enabled", "choose", "chosen", "slots",
    "lean_decoding", "plan", "Plan", "summary", "FastDecoder", "ATTENTION_INNER",
    "attention", "flash_attention", "self_attention", "rms_norm", "swiglu", "linear_stacked", "softmax_inplace",
    "row_sums", "FLASH_MIN_QUERIES",
]


def _long(n, m, cache):
    return n >= FLASH_MIN_QUERIES


def _long_uncached(n, m, cache):
    return cache is None and n >= FLASH_MIN_QUERIES


# The registry, in order of preference: for a layer, the first kernel that applies runs.
register(Kernel(
    name="tiled_self_attention", replaces=nn.Attention, skips=ATTENTION_INNER,
    reference="glassllm.nn.Attention.__call__", run=layers.tiled_self_attention, applies=_long_uncached,
    serves=f"n >= {FLASH_MIN_QUERIES} new queries, no cache", doc="wq|wk|wv as one GEMM; RoPE and exact tiled attention (online softmax) in one op; no (n, m) matrix"))
register(Kernel(
    name="tiled_attention", replaces=nn.Attention, skips=ATTENTION_INNER,
    reference="glassllm.nn.Attention.__call__", run=layers.tiled_attention, applies=_long,
    serves=f"n >= {FLASH_MIN_QUERIES} new queries", doc="steps 1-3 fused, then exact tiled attention after a KV cache; no (n, m) matrix"))
register(Kernel(
    name="fused_attention", replaces=nn.Attention, skips=ATTENTION_INNER,
    reference="glassllm.nn.Attention.__call__", run=layers.fused_attention,
    doc="wq|wk|wv as one GEMM; scores, mask, softmax and mix as one op, GQA folded into the rows"))
register(Kernel(
    name="fused_rms_norm", replaces=nn.RMSNorm, skips=("rms",),
    reference="glassllm.nn.RMSNorm.__call__", run=layers.fused_rms_norm,
    doc="one pass forward, one backward"))
register(Kernel(
    name="fused_feed_forward", replaces=nn.FeedForward, skips=("gate", "up", "act", "prod"),
    reference="glassllm.nn.FeedForward.__call__", run=layers.fused_feed_forward,
    doc="w1|w3 as one GEMM; the SwiGLU gating as one op"))
register(Kernel(
    name="fast_decode", replaces=nn.Transformer, skips=("*",),
    reference="glassllm.nn.Transformer.__call__ (the last position's logits)", run=decode.FastDecoder,
    applies=lambda n, m, cache: cache is not None, serves="decoding steps with a cache",
    doc="plain NumPy decoding steps on the model's own weight arrays (views, no copy; a model under "
        "PACK_BYTES packed, gains folded in), RoPE as a matmul; no autograd, no snapshots. generate() builds "
        "it and asks lean_decoding() before each step"))
