"""The lean decoder: a kernel for the decoding steps of :class:`~glassllm.nn.Transformer` --
the same math in plain NumPy, with no autograd, no snapshots and fewer, bigger operations.

Why it exists: at decode time a step is one token (n = 1), so every matrix is
tiny and the module path spends most of its time in Python -- building
``Tensor`` objects, checking shapes, asking a tracer that is not there. This
path keeps the arithmetic and drops the bookkeeping:

- the weights are packed once (copies, seen through their transposes as ``x @ W``
  reads them -- a GEMV walks each output's row of the (out, C) layout either way):
  ``wq|wk|wv`` as one (C, (H+2G)D) matrix and ``w1|w3`` as one (C, 2F) matrix, so a layer
  makes four GEMMs instead of seven. Each RMSNorm gain is folded into the rows
  of the matrix that reads the norm's output (``(x r * w) @ W = (x r) @ (w W)``),
  the score scale 1/sqrt(D) into wq's columns (RoPE is linear, so it commutes),
  and w1 is halved (exact in binary) so SwiGLU needs no extra ``* 0.5``;
- queries and keys are rotated together, as one array of H + G heads, by one
  matmul with a (D, D) rotation matrix per position (RoPE's pairs as 2 x 2 blocks);
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
positions and left padding. It sees the weights as they are when it is built;
build a new one after changing them. It is tested equal to the model's reference
forward (tests/test_kernels.py, tests/test_generate.py); a tracer never sees it --
:func:`glassllm.generate.generate` asks the dispatcher before each step
(:func:`glassllm.kernels.dispatch.lean_decoding`), which says no whenever a tracer
is attached or the kernel is switched off.

Shape legend: B batch, n new queries, m keys (m = start + n), H query heads,
G key/value heads, D head dim, C model width, V vocabulary, F MLP width.
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd import no_grad
from ..nn import causal_mask
from ..ops.flash import FLASH_MIN_QUERIES
from ..ops.softmax import softmax_inplace
from ..positions import positions

__all__ = ["FastDecoder"]


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

        def packed(norm, *linears):  # (out, C) stacked, the gain folded in; returned as its (C, out) view
            w = np.concatenate([lin.weight.data for lin in linears])        # (out, C)
            w *= norm.weight.data
            return w.T

        self.layers = []
        HD = c.n_heads * c.head_dim
        for block in model.layers:
            a, f = block.attention, block.feed_forward
            wqkv = packed(block.attention_norm, a.wq, a.wk, a.wv)          # (C, (H+2G)D)
            wqkv[:, :HD] *= self.scale                                      # q arrives pre-scaled by 1/sqrt(D)
            w13 = packed(block.ffn_norm, f.w1, f.w3)                         # (C, 2F)
            w13[:, : c.ffn_dim] *= 0.5                                      # gate/2, exactly
            self.layers.append((
                wqkv,                                                       # (C, (H+2G)D)
                a.wo.weight.data.copy().T,                                  # (H*D, C)
                w13,                                                        # (C, 2F)
                f.w2.weight.data.copy().T,                                  # (F, C)
            ))
        self.out = packed(model.norm, model.output)                         # (C, V)

        # RoPE as a matmul: row-vector x @ R[p] turns each pair (x[2i], x[2i+1]) by angle p*w_i.
        # Built for the positions reached so far (see _rotations), not the whole context.
        self.rotary = model.rotary
        self.rot = self.rotary.matrices(min(c.max_seq_len, 64))             # (positions built, D, D)

    def _rotations(self, m: int) -> np.ndarray:
        """RoPE matrices for at least positions 0 .. m-1, doubling what is built when it falls short."""
        if m > len(self.rot):
            self.rot = self.rotary.matrices(max(m, 2 * len(self.rot)))
        return self.rot

    def _rms(self, x: np.ndarray) -> np.ndarray:
        """x / rms(x) over the last axis (the gain lives in the next matrix): (N, C)."""
        if len(x) == 1:  # one row (a decode step): the scalar work in Python floats
            return x * (1.0 / math.sqrt(float(x[0] @ x[0]) / x.shape[-1] + self.eps))
        return x / np.sqrt(np.add.reduce(x * x, axis=-1, keepdims=True) / x.shape[-1] + self.eps)

    @staticmethod
    def _gated(gu: np.ndarray) -> np.ndarray:
        """SwiGLU's gating from (g/2 | u), (N, 2F) -> (N, F): silu(g) * u = g * (1 + tanh(g/2)) / 2 * u.

        The packed matrix already made g/2, so no extra ``* 0.5`` is needed.
        """
        F = gu.shape[-1] // 2
        half_gate = gu[:, :F]
        act = np.tanh(half_gate)
        act += 1.0
        act *= half_gate
        act *= gu[:, F:]
        return act

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

        x = self.embed[tokens.reshape(-1)]                                  # (N, C), a copy: updated in place
        for layer, (wqkv, wo, w13, w2) in enumerate(self.layers):
            # Attention: project, rotate q and k together, cache, read all m keys.
            qkv = self._rms(x) @ wqkv                                       # (N, (H+2G)D)
            qk = qkv[:, : (H + G) * D].reshape(N, H + G, D)                 # (N, H+G, D)
            qk = (qk[:, :, None] @ rot)[:, :, 0] if rot.ndim == 4 else qk @ rot  # (N, H+G, D)
            qk = qk.reshape(B, n, H + G, D)                                 # (B, n, H+G, D)
            cache.k[layer, :, :, start:m] = qk[:, :, H:].transpose(0, 2, 1, 3)                 # (B, G, n, D)
            cache.v[layer, :, :, start:m] = qkv[:, (H + G) * D:].reshape(B, n, G, D).transpose(0, 2, 1, 3)
            keys, values = cache.k[layer, :, :, :m], cache.v[layer, :, :, :m]  # (B, G, m, D)

            # Query head h = g*r + j reads K/V head g: fold the r heads of a group into rows.
            q = qk[:, :, :H]                                                # (B, n, H, D)
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
            x += heads @ wo                                                 # (N, C)

            x += self._gated(self._rms(x) @ w13) @ w2                       # (N, C)

        cache.start = m
        last = x.reshape(B, n, -1)[:, -1]                                   # (B, C)
        return self._rms(last) @ self.out                                   # (B, V)

    def _next(self, ids: np.ndarray, cache) -> np.ndarray:
        """One new token per row, no padding: the decode step, with as few NumPy calls as the math allows.

        The same arithmetic as the general path with n = 1 (which needs no mask):
        the new key and value are written straight into the cache slot at
        ``start``, and softmax's division is applied to the (r, D) mix instead of
        the (r, m) weights (sum_j p_j v_j / sum_j p_j: the same numbers, fewer divisions).
        """
        B = len(ids)
        H, G, D = self.H, self.G, self.D
        HD, KD = H * D, (H + G) * D
        start = cache.start
        m = start + 1
        rot = self._rotations(m)[start]                                     # (D, D)
        x = self.embed[ids]                                                 # (B, C), a copy: updated in place
        for layer, (wqkv, wo, w13, w2) in enumerate(self.layers):
            qkv = self._rms(x) @ wqkv                                       # (B, (H+2G)D)
            qk = qkv[:, :KD].reshape(B, H + G, D) @ rot                     # (B, H+G, D), rotated
            cache.k[layer, :, :, start] = qk[:, H:]                         # (B, G, D)
            cache.v[layer, :, :, start] = qkv[:, KD:].reshape(B, G, D)      # (B, G, D)
            s = qk[:, :H].reshape(B, G, H // G, D) @ cache.k[layer, :, :, :m].swapaxes(-1, -2)  # (B, G, r, m)
            s -= np.maximum.reduce(s, axis=-1, keepdims=True)
            np.exp(s, out=s)
            mix = s @ cache.v[layer, :, :, :m]                              # (B, G, r, D), not yet divided
            mix /= np.add.reduce(s, axis=-1, keepdims=True)
            x += mix.reshape(B, HD) @ wo                                    # (B, C)
            x += self._gated(self._rms(x) @ w13) @ w2                       # (B, C)
        cache.start = m
        return self._rms(x) @ self.out                                      # (B, V)
