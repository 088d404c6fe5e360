"""Fused SwiGLU: the gating as one op.

The reference computes ``w1 x`` and ``w3 x`` as two GEMMs, then ``silu`` and a
product, each with its own backward. The feed-forward kernel makes ``w1|w3`` one
GEMM (:func:`glassllm.ops.linear.linear_stacked`) and :func:`swiglu` takes its
output whole, handing the gradient back as one array for one GEMM.
"""

from __future__ import annotations

import numpy as np

from .. import autograd as ag
from ..autograd import Tensor

__all__ = ["swiglu"]


def swiglu(a) -> Tensor:
    """SwiGLU's gating, ``silu(gate) * up``, for ``a = [gate | up]`` along the last axis: (..., 2F) -> (..., F).

    The reference spells this out as ``silu`` then ``mul`` on two tensors;
    fused, its input is one GEMM's output (``linear_stacked(x, (w1, w3))``) and its
    gradient goes back as one array for one GEMM. With s = sigmoid(gate) and
    act = gate s (so silu'(gate) = s + gate s (1 - s) = s (1 + gate - act))::

        d up = g act,    d gate = g up s (1 + gate - act)
    """
    a = ag.as_tensor(a)
    if a.ndim < 1 or a.shape[-1] % 2:
        raise ValueError(f"swiglu needs a last axis of even size [gate | up], got shape {a.shape}")
    F = a.shape[-1] // 2
    gate, up = a.data[..., :F], a.data[..., F:]                         # (..., F) views
    s = ag.sigmoid_np(gate)                                                  # (..., F)
    if not (ag.is_grad_enabled() and a.requires_grad):                 # nothing to keep for a backward:
        s *= gate                                                       # act, then act * up, on one array
        s *= up
        return ag.make_op(s, (a,), None)
    act = gate * s                                                      # (..., F)

    def backward(g):
        da = np.empty(a.shape, dtype=a.dtype)                           # (..., 2F)
        dgate, dup = da[..., :F], da[..., F:]
        np.multiply(g, act, out=dup)
        np.subtract(gate, act, out=dgate)
        dgate += 1.0
        dgate *= s
        dgate *= up
        dgate *= g
        return (da,)
    return ag.make_op(act * up, (a,), backward)
