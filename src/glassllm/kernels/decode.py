"""The lean decoder: a kernel for the decoding steps of :class:`~glassllm.nn.Transformer` --
the same math in plain NumPy, with no autograd, no snapshots and fewer, smaller operations.

Why it exists: at decode time a step is one token (n = 1), so every matrix is
tiny and the module path spends most of its time in Python -- building
``Tensor`` objects, checking shapes, asking a tracer that is not there. This
path keeps the arithmetic and drops the bookkeeping:

- it reads the model's own weight arrays, through their transposes as ``x @ W``
  reads them (views: no copy of any weight, so decoding a 1 B model costs no
  second 4 GB; a GEMV walks each output's row of the (out, C) layout either way);
- the RMSNorm gains multiply the normalised row (C numbers), the score scale
  1/sqrt(D) rides in the step's query rotation matrix (RoPE is linear, so it
  commutes), and SwiGLU works from g/2: silu(g) * u = g/2 * (1 + tanh(g/2)) * u;
- queries and keys are rotated by one matmul each with a (D, D) rotation matrix
  per position (RoPE's pairs as 2 x 2 blocks);
- attention folds the r = H/G query heads that share a key/value head into
  one matmul against that head's cached keys (nothing is copied per head).

A long prefill (n >= ``FLASH_MIN_QUERIES`` new tokens) goes through the model's
forward instead: there the tiled attention kernel never holds the (n, m) score
matrices, which for a batch of long prompts would cost far more memory and
time than Python's bookkeeping saves.

The reorderings change float rounding only (the test allows 1e-5 relative in
float32 and 1e-12 in float64, and asks for the same tokens).

It reads and writes the same :class:`~glassllm.nn.KVCache` as the module path
(so the two can take turns in one generation) and follows its rules for
positions and left padding. It holds the weight arrays the model has when it is
built: a change made in place is seen, a parameter given a new array is not
(build a new decoder then). It is tested equal to the model's reference
forward (tests/test_kernels.py, tests/test_generate.py); a tracer never sees it --
:func:`glassllm.generate.generate` asks the dispatcher before each step
(:func:`glassllm.kernels.dispatch.lean_decoding`), which says no whenever a tracer
is attached or the kernel is switched off.

Shape legend: B batch, n new queries, m keys (m = start + n), H query heads,
G key/value heads, D head dim, C model width, V vocabulary, F MLP width.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..autograd import no_grad
from ..nn import causal_mask
from ..ops.flash import FLASH_MIN_QUERIES
from ..ops.softmax import softmax_inplace
from ..positions import positions

__all__ = ["FastDecoder", "head_weight"]


def head_weight(model) -> np.ndarray:
    """The output head's (V, C) weight, as the model's forward uses it: the decoder reads it here only."""
    return model.output.weight.data


class LayerWeights(NamedTuple):
    """One block's arrays as the decoder reads them: the model's own, the matrices as (in, out) views."""

    attention_gain: np.ndarray  # (C,)
    wq: np.ndarray              # (C, H*D)
    wk: np.ndarray              # (C, G*D)
    wv: np.ndarray              # (C, G*D)
    wo: np.ndarray              # (H*D, C)
    ffn_gain: np.ndarray        # (C,)
    w1: np.ndarray              # (C, F)
    w3: np.ndarray              # (C, F)
    w2: np.ndarray              # (F, C)

    @classmethod
    def of(cls, block) -> "LayerWeights":
        a, f = block.attention, block.feed_forward
        return cls(block.attention_norm.weight.data, a.wq.weight.data.T, a.wk.weight.data.T,
                   a.wv.weight.data.T, a.wo.weight.data.T, block.ffn_norm.weight.data,
                   f.w1.weight.data.T, f.w3.weight.data.T, f.w2.weight.data.T)


class FastDecoder:
    """``FastDecoder(model)(tokens, cache)``: logits of the last position, (B, V).

    tokens (B, n) int ids at positions cache.start .. cache.start+n-1; the cache
    advances by n, exactly as ``model(tokens, cache)`` would leave it.
    """

    def __init__(self, model):
        c = model.config
        self.model = model
        self.config = c
        self.H, self.G, self.D = c.n_heads, c.n_kv_heads, c.head_dim
        self.eps = c.norm_eps
        self.scale = 1.0 / math.sqrt(c.head_dim)
        self.embed = model.tok_embeddings.weight.data                       # (V, C)
        self.layers = [LayerWeights.of(block) for block in model.layers]
        self.final_gain = model.norm.weight.data                            # (C,)
        self.head = head_weight(model).T                                    # (C, V), a view

        # RoPE as a matmul: row-vector x @ R[p] turns each pair (x[2i], x[2i+1]) by angle p*w_i.
        # Built for the positions reached so far (see _rotations), not the whole context.
        self.rotary = model.rotary
        self.rot = self.rotary.matrices(min(c.max_seq_len, 64))             # (positions built, D, D)

    def _rotations(self, m: int) -> np.ndarray:
        """RoPE matrices for at least positions 0 .. m-1, doubling what is built when it falls short."""
        if m > len(self.rot):
            self.rot = self.rotary.matrices(max(m, 2 * len(self.rot)))
        return self.rot

    def _rms(self, x: np.ndarray, gain: np.ndarray) -> np.ndarray:
        """RMSNorm of each row with its gain: x / rms(x) * gain, (N, C)."""
        if len(x) == 1:  # one row (a decode step): the scalar work in Python floats
            h = x * (1.0 / math.sqrt(float(x[0] @ x[0]) / x.shape[-1] + self.eps))
        else:
            h = x / np.sqrt(np.add.reduce(x * x, axis=-1, keepdims=True) / x.shape[-1] + self.eps)
        h *= gain
        return h

    def _feed_forward(self, h: np.ndarray, w: LayerWeights) -> np.ndarray:
        """SwiGLU from the normalised rows (N, C) -> (N, C): silu(g) * u = g/2 * (1 + tanh(g/2)) * u."""
        half_gate = h @ w.w1                                                # (N, F)
        half_gate *= 0.5
        act = np.tanh(half_gate)
        act += 1.0
        act *= half_gate
        act *= h @ w.w3                                                     # (N, F)
        return act @ w.w2                                                   # (N, C)

    def __call__(self, tokens: np.ndarray, cache) -> np.ndarray:
        tokens = np.asarray(tokens)
        B, n = tokens.shape
        N = B * n                                                           # rows: (b, i) pairs
        H, G, D = self.H, self.G, self.D
        r = H // G
        start = cache.start
        m = start + n
        if m > cache.capacity:
            raise ValueError(f"sequence of {m} positions (start {start} + {n} new) exceeds the cache capacity "
                             f"{cache.capacity}")
        pad = cache.pad
        if n == 1 and pad is None:
            return self._next(tokens[:, 0], cache)
        if n >= FLASH_MIN_QUERIES:  # a long prefill: the tiled kernel, no (n, m) matrices (module docstring)
            with no_grad():
                return self.model(tokens, cache).data[:, -1]

        # Positions and the mask, by the reference's rules.
        if pad is None:
            rot = self._rotations(m)[start:m]                               # (n, D, D)
            rot = rot[0] if n == 1 else np.tile(rot, (B, 1, 1))[:, None]    # (D, D) or (N, 1, D, D)
            mask = causal_mask(n, m, start) if n > 1 else None             # (n, m); one query sees all
        else:
            rot = self._rotations(m)[positions(start, m, pad).reshape(-1)][:, None]  # (N, 1, D, D)
            mask = causal_mask(n, m, start, pad)                            # (B, n, m)
        if mask is not None:
            mask = mask.reshape(-1, 1, 1, n, m)                             # (B|1, 1, 1, n, m)
        rot_q = rot * self.scale                                            # queries arrive scaled by 1/sqrt(D)

        def rotate(t, heads, R):                                            # (N, heads*D) turned by R
            t = t.reshape(N, heads, D)                                      # (N, heads, D)
            t = (t[:, :, None] @ R)[:, :, 0] if R.ndim == 4 else t @ R      # (N, heads, D)
            return t.reshape(B, n, heads, D)                                # (B, n, heads, D)

        x = self.embed[tokens.reshape(-1)]                                  # (N, C), a copy: updated in place
        for layer, w in enumerate(self.layers):
            # Attention: project, rotate q and k, cache, read all m keys.
            h = self._rms(x, w.attention_gain)                              # (N, C)
            q = rotate(h @ w.wq, H, rot_q)                                  # (B, n, H, D), scaled
            cache.k[layer, :, :, start:m] = rotate(h @ w.wk, G, rot).transpose(0, 2, 1, 3)   # (B, G, n, D)
            cache.v[layer, :, :, start:m] = (h @ w.wv).reshape(B, n, G, D).transpose(0, 2, 1, 3)  # (B, G, n, D)
            keys, values = cache.k[layer, :, :, :m], cache.v[layer, :, :, :m]  # (B, G, m, D)

            # Query head h = g*r + j reads K/V head g: fold the r heads of a group into rows.
            if n == 1:
                qg = q.reshape(B, G, r, D)                                  # (B, G, r*n, D)
            else:
                qg = q.reshape(B, n, G, r, D).transpose(0, 2, 3, 1, 4).reshape(B, G, r * n, D)  # (B, G, r*n, D)
            s = qg @ keys.swapaxes(-1, -2)                                  # (B, G, r*n, m), already scaled
            if mask is not None:
                s = s.reshape(B, G, r, n, m)                                # (B, G, r, n, m)
                s[np.broadcast_to(mask, s.shape)] = -np.inf
                s = s.reshape(B, G, r * n, m)                               # (B, G, r*n, m)
            softmax_inplace(s)                                              # (B, G, r*n, m); padding rows: 0
            mix = s @ values                                                # (B, G, r*n, D)
            if n == 1:
                heads = mix.reshape(B, H * D)                               # (N, H*D)
            else:
                heads = mix.reshape(B, G, r, n, D).transpose(0, 3, 1, 2, 4).reshape(N, H * D)  # (N, H*D)
            x += heads @ w.wo                                               # (N, C)

            x += self._feed_forward(self._rms(x, w.ffn_gain), w)            # (N, C)

        cache.start = m
        last = x.reshape(B, n, -1)[:, -1]                                   # (B, C)
        return self._rms(last, self.final_gain) @ self.head                 # (B, V)

    def _next(self, ids: np.ndarray, cache) -> np.ndarray:
        """One new token per row, no padding: the decode step, with as few NumPy calls as the math allows.

        The same arithmetic as the general path with n = 1 (which needs no mask):
        the new key and value are written straight into the cache slot at
        ``start``, and softmax's division is applied to the (r, D) mix instead of
        the (r, m) weights (sum_j p_j v_j / sum_j p_j: the same numbers, fewer divisions).
        """
        B = len(ids)
        H, G, D = self.H, self.G, self.D
        start = cache.start
        m = start + 1
        rot = self._rotations(m)[start]                                     # (D, D)
        rot_q = rot * self.scale                                            # (D, D): queries scaled by 1/sqrt(D)
        x = self.embed[ids]                                                 # (B, C), a copy: updated in place
        for layer, (attention_gain, wq, wk, wv, wo, ffn_gain, w1, w3, w2) in enumerate(self.layers):
            h = self._rms(x, attention_gain)                                # (B, C)
            q = ((h @ wq).reshape(B, H, D) @ rot_q).reshape(B, G, H // G, D)  # (B, G, r, D), rotated and scaled
            np.matmul((h @ wk).reshape(B, G, D), rot, out=cache.k[layer, :, :, start])  # (B, G, D), rotated
            cache.v[layer, :, :, start] = (h @ wv).reshape(B, G, D)         # (B, G, D)
            s = q @ cache.k[layer, :, :, :m].swapaxes(-1, -2)               # (B, G, r, m)
            s -= np.maximum.reduce(s, axis=-1, keepdims=True)
            np.exp(s, out=s)
            mix = s @ cache.v[layer, :, :, :m]                              # (B, G, r, D), not yet divided
            mix /= np.add.reduce(s, axis=-1, keepdims=True)
            x += mix.reshape(B, H * D) @ wo                                 # (B, C)

            h = self._rms(x, ffn_gain)                                      # (B, C)
            half_gate = h @ w1                                              # (B, F), then halved
            half_gate *= 0.5
            act = np.tanh(half_gate)
            act += 1.0
            act *= half_gate
            act *= h @ w3                                                   # (B, F)
            x += act @ w2                                                   # (B, C)
        cache.start = m
        return self._rms(x, self.final_gain) @ self.head                    # (B, V)
