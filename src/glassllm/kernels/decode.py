"""The lean decoder: a kernel for the decoding steps of :class:`~glassllm.nn.Transformer` --
the same math in plain NumPy, with no autograd, no snapshots and fewer, smaller operations.

Why it exists: at decode time a step is one token (n = 1), so every matrix is
tiny and the module path spends most of its time in Python -- building
``Tensor`` objects, checking shapes, asking a tracer that is not there. This
path keeps the arithmetic and drops the bookkeeping:

- it reads the model's own weight arrays, through their transposes as ``x @ W``
  reads them (views: no copy of any weight, so decoding a 1 B model costs no
  second 4 GB; a GEMV walks each output's row of the (out, C) layout either way).
  The RMSNorm gains multiply the normalised row (C numbers), the score scale
  1/sqrt(D) rides in the step's query rotation matrix (RoPE is linear, so it
  commutes), and SwiGLU works from g/2: silu(g) * u = g/2 * (1 + tanh(g/2)) * u;
- a small model (its blocks' matrices at most ``PACK_BYTES``, 64 MiB) is packed
  instead, where a copy costs little and Python's per-call cost is most of a step:
  ``wq|wk|wv`` as one (C, (H+2G)D) matrix and ``w1|w3`` as one (C, 2F) matrix, so a
  layer makes four GEMVs instead of seven, each gain folded into the rows of the
  matrix that reads its norm (``(x r * w) @ W = (x r) @ (w W)``), 1/sqrt(D) into
  wq and 1/2 into w1 (exact in binary);
- queries and keys are rotated by a matmul with a (D, D) rotation matrix per
  position (RoPE's pairs as 2 x 2 blocks);
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
positions and left padding. It sees the weights as they are when it is built
(reading in place, it holds the model's arrays: a change made in place is seen,
a parameter given a new array is not); build a new one after changing them. It
is tested equal to the model's reference forward, packed and in place
(tests/test_kernels.py, tests/test_generate.py); a tracer never sees it --
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

__all__ = ["FastDecoder", "head_weight", "PACK_BYTES"]


def head_weight(model) -> np.ndarray:
    """The output head's (V, C) weight, as the model's forward uses it: the decoder reads it here only."""
    return model.output.weight.data


PACK_BYTES = 64 * 2**20    # a model whose matrices take at most this many bytes is decoded from a packed copy


class LayerWeights(NamedTuple):
    """One block's arrays as the decoder reads them, the matrices as (in, out) transposed views.

    Read in place (the model's own arrays): ``attention_in`` is (wq, wk, wv) and ``ffn_in`` (w1, w3); the
    gains multiply the normalised row, the score scale rides in the query's rotation matrix and SwiGLU halves
    its gate. Packed (a copy, for a small model, where Python's per-call cost outweighs memory):
    ``attention_in`` is the one (C, (H+2G)D) matrix wq|wk|wv and ``ffn_in`` the one (C, 2F) matrix w1|w3,
    each with its norm's gain folded into its rows (``(x r * g) @ W = (x r) @ (g W)``), 1/sqrt(D) folded
    into wq and 1/2 into w1 (exact in binary); the gains are None.
    """

    attention_gain: np.ndarray | None  # (C,)
    attention_in: tuple                # (C, H*D), (C, G*D), (C, G*D); or one (C, (H+2G)D)
    wo: np.ndarray                     # (H*D, C)
    ffn_gain: np.ndarray | None        # (C,)
    ffn_in: tuple                      # (C, F), (C, F); or one (C, 2F)
    w2: np.ndarray                     # (F, C)

    @classmethod
    def read(cls, block) -> "LayerWeights":
        """The block's own arrays: views, no copy."""
        a, f = block.attention, block.feed_forward
        return cls(block.attention_norm.weight.data, (a.wq.weight.data.T, a.wk.weight.data.T, a.wv.weight.data.T),
                   a.wo.weight.data.T, block.ffn_norm.weight.data, (f.w1.weight.data.T, f.w3.weight.data.T),
                   f.w2.weight.data.T)

    @classmethod
    def pack(cls, block, scale: float) -> "LayerWeights":
        """A packed copy, the gains, the score scale ``scale`` and SwiGLU's 1/2 folded in."""
        a, f = block.attention, block.feed_forward
        wqkv = np.concatenate([a.wq.weight.data, a.wk.weight.data, a.wv.weight.data])  # ((H+2G)D, C)
        wqkv *= block.attention_norm.weight.data
        wqkv[: a.wq.weight.data.shape[0]] *= scale                          # q arrives pre-scaled by 1/sqrt(D)
        w13 = np.concatenate([f.w1.weight.data, f.w3.weight.data])          # (2F, C)
        w13 *= block.ffn_norm.weight.data
        w13[: f.w1.weight.data.shape[0]] *= 0.5                             # gate/2, exactly
        return cls(None, (wqkv.T,), a.wo.weight.data.T, None, (w13.T,), f.w2.weight.data.T)


class FastDecoder:
    """``FastDecoder(model)(tokens, cache)``: logits of the last position, (B, V).

    tokens (B, n) int ids at positions cache.start .. cache.start+n-1; the cache
    advances by n, exactly as ``model(tokens, cache)`` would leave it.
    """

    def __init__(self, model, pack_bytes: int = PACK_BYTES):
        c = model.config
        self.model = model
        self.config = c
        self.H, self.G, self.D = c.n_heads, c.n_kv_heads, c.head_dim
        self.eps = c.norm_eps
        self.scale = 1.0 / math.sqrt(c.head_dim)
        self.embed = model.tok_embeddings.weight.data                       # (V, C)
        # A small model's per-call overhead outweighs its memory: it is packed (fewer, larger GEMVs).
        matrix_bytes = sum(p.data.nbytes for block in model.layers for p in block.parameters() if p.data.ndim == 2)
        self.packed = matrix_bytes <= pack_bytes
        if self.packed:
            self.layers = [LayerWeights.pack(block, self.scale) for block in model.layers]
            self.final_gain, self.head = None, (head_weight(model) * model.norm.weight.data).T  # (C, V), a copy
        else:
            self.layers = [LayerWeights.read(block) for block in model.layers]
            self.final_gain, self.head = model.norm.weight.data, head_weight(model).T          # (C,), (C, V) views
        self.F = c.ffn_dim                                                  # where a packed output splits
        self.qk_cuts = (self.H * self.D, (self.H + self.G) * self.D)

        # RoPE as a matmul: row-vector x @ R[p] turns each pair (x[2i], x[2i+1]) by angle p*w_i.
        # Built for the positions reached so far (see _rotations), not the whole context.
        self.rotary = model.rotary
        self.rot = self.rotary.matrices(min(c.max_seq_len, 64))             # (positions built, D, D)

    def _rotations(self, m: int) -> np.ndarray:
        """RoPE matrices for at least positions 0 .. m-1, doubling what is built when it falls short."""
        if m > len(self.rot):
            self.rot = self.rotary.matrices(max(m, 2 * len(self.rot)))
        return self.rot

    def _rms(self, x: np.ndarray, gain: np.ndarray | None) -> np.ndarray:
        """RMSNorm of each row with its gain: x / rms(x) * gain, (N, C) (gain None: folded into the next matrix)."""
        if len(x) == 1:  # one row (a decode step): the scalar work in Python floats
            h = x * (1.0 / math.sqrt(float(x[0] @ x[0]) / x.shape[-1] + self.eps))
        else:
            h = x / np.sqrt(np.add.reduce(x * x, axis=-1, keepdims=True) / x.shape[-1] + self.eps)
        if gain is not None:
            h *= gain
        return h

    def _project(self, h: np.ndarray, mats: tuple, part: str) -> tuple:
        """``h`` (N, C) times each matrix of ``mats``; one packed matrix's output split where the parts meet."""
        if len(mats) > 1:
            return tuple(h @ w for w in mats)                              # (N, out) each
        y = h @ mats[0]                                                     # (N, total out)
        if part == "ffn":
            return y[:, :self.F], y[:, self.F:]                             # (N, F) each
        a, b = self.qk_cuts
        return y[:, :a], y[:, a:b], y[:, b:]                                # (N, H*D), (N, G*D), (N, G*D)

    def _feed_forward(self, h: np.ndarray, w: LayerWeights) -> np.ndarray:
        """SwiGLU from the normalised rows (N, C) -> (N, C): silu(g) * u = g/2 * (1 + tanh(g/2)) * u."""
        half_gate, up = self._project(h, w.ffn_in, "ffn")                   # (N, F) each
        if not self.packed:                                                 # (packed: w1 is halved)
            half_gate *= 0.5
        act = np.tanh(half_gate)
        act += 1.0
        act *= half_gate
        act *= up
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
        rot_q = rot if self.packed else rot * self.scale                    # queries arrive scaled by 1/sqrt(D)

        def rotate(t, heads, R):                                            # (N, heads*D) turned by R
            t = t.reshape(N, heads, D)                                      # (N, heads, D)
            t = (t[:, :, None] @ R)[:, :, 0] if R.ndim == 4 else t @ R      # (N, heads, D)
            return t.reshape(B, n, heads, D)                                # (B, n, heads, D)

        x = self.embed[tokens.reshape(-1)]                                  # (N, C), a copy: updated in place
        for layer, w in enumerate(self.layers):
            # Attention: project, rotate q and k, cache, read all m keys.
            q, k, v = self._project(self._rms(x, w.attention_gain), w.attention_in, "attention")
            q = rotate(q, H, rot_q)                                         # (B, n, H, D), scaled
            cache.k[layer, :, :, start:m] = rotate(k, G, rot).transpose(0, 2, 1, 3)          # (B, G, n, D)
            cache.v[layer, :, :, start:m] = v.reshape(B, n, G, D).transpose(0, 2, 1, 3)     # (B, G, n, D)
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
        rot_q = rot if self.packed else rot * self.scale                    # (D, D): queries scaled by 1/sqrt(D)
        packed, F, KD = self.packed, self.F, self.qk_cuts[1]
        x = self.embed[ids]                                                 # (B, C), a copy: updated in place
        for layer, (attention_gain, attention_in, wo, ffn_gain, ffn_in, w2) in enumerate(self.layers):
            h = self._rms(x, attention_gain)                                # (B, C)
            if packed:                                                      # one GEMV; q and k rotated together
                qkv = h @ attention_in[0]                                   # (B, (H+2G)D), q pre-scaled
                qk = qkv[:, :KD].reshape(B, H + G, D) @ rot                 # (B, H+G, D), rotated
                q, v = qk[:, :H], qkv[:, KD:]                               # (B, H, D), (B, G*D)
                cache.k[layer, :, :, start] = qk[:, H:]                     # (B, G, D)
            else:
                wq, wk, wv = attention_in
                q = (h @ wq).reshape(B, H, D) @ rot_q                       # (B, H, D), rotated and scaled
                np.matmul((h @ wk).reshape(B, G, D), rot, out=cache.k[layer, :, :, start])  # (B, G, D), rotated
                v = h @ wv                                                  # (B, G*D)
            cache.v[layer, :, :, start] = v.reshape(B, G, D)                # (B, G, D)
            s = q.reshape(B, G, H // G, D) @ cache.k[layer, :, :, :m].swapaxes(-1, -2)  # (B, G, r, m)
            s -= np.maximum.reduce(s, axis=-1, keepdims=True)
            np.exp(s, out=s)
            mix = s @ cache.v[layer, :, :, :m]                              # (B, G, r, D), not yet divided
            mix /= np.add.reduce(s, axis=-1, keepdims=True)
            x += mix.reshape(B, H * D) @ wo                                 # (B, C)

            h = self._rms(x, ffn_gain)                                      # (B, C)
            if packed:                                                      # one GEMV; w1 already halved
                gu = h @ ffn_in[0]                                          # (B, 2F)
                half_gate, up = gu[:, :F], gu[:, F:]                        # (B, F) each
            else:
                half_gate = h @ ffn_in[0]                                   # (B, F)
                half_gate *= 0.5
                up = h @ ffn_in[1]                                          # (B, F)
            act = np.tanh(half_gate)
            act += 1.0
            act *= half_gate
            act *= up
            x += act @ w2                                                   # (B, C)
        cache.start = m
        return self._rms(x, self.final_gain) @ self.head                    # (B, V)
