"""Fused RMSNorm: one op with a hand-derived backward.

The reference spells the norm out in four primitives (``mean`` of the squares,
``sqrt``, a division, the gain), each a pass over the activations with its own
backward; :func:`rms_norm` makes one pass forward and one backward, with the
row sums as ``einsum`` contractions.
"""

from __future__ import annotations

import numpy as np

from .. import autograd as ag
from ..autograd import Tensor

__all__ = ["rms_norm"]


def rms_norm(x, weight, eps: float) -> Tensor:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last axis.

    Backward, with r = 1/sqrt(mean(x^2)+eps), xhat = x r and u = g * weight:
    dx = r (u - xhat * mean(u * xhat)),  dweight = sum over rows of g * xhat.
    Row sums of products are ``einsum`` contractions: one pass, no temporary.
    """
    x = ag.as_tensor(x)
    weight = ag.as_tensor(weight, x)
    C = x.shape[-1] if x.ndim else 0
    if x.dtype.kind != "f" or weight.shape != (C,):
        raise ValueError(f"rms_norm needs floating-point x (..., C) and weight (C,); "
                         f"got x {x.shape} {x.dtype}, weight {weight.shape}")
    ms = np.einsum("...i,...i->...", x.data, x.data)[..., None]         # (..., 1) sum of squares
    ms /= C
    ms += eps
    r = np.sqrt(ms, out=ms)
    np.reciprocal(r, out=r)                                             # (..., 1)
    xhat = x.data * r                                                   # (..., C)
    out = xhat * weight.data                                            # (..., C)

    def backward(g):
        gx = gw = None
        if x.requires_grad:
            u = g * weight.data                                         # (..., C)
            dot = np.einsum("...i,...i->...", u, xhat)[..., None]       # (..., 1)
            dot /= C
            gx = xhat * dot
            np.subtract(u, gx, out=gx)
            gx *= r                                                     # (..., C)
        if weight.requires_grad:
            gw = np.einsum("ij,ij->j", g.reshape(-1, C), xhat.reshape(-1, C))  # (C,)
        return gx, gw
    return ag.make_op(out, (x, weight), backward)
