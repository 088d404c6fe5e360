"""A hand-written NumPy training step of the default model, to measure what glassllm's engine costs.

How fast can a hand-written NumPy forward, backward and AdamW of the same
model train, and how much of glassllm's step is its engine? This module is
such a program, written to be fast rather than to be read: no
autograd, no Tensor objects, no tracing hooks, no checks; every gradient
derived by hand; every parameter and gradient one view of a single flat
buffer, so that clipping and AdamW are a handful of whole-buffer operations.
Attention is either plain dense causal attention per (batch, K/V head), the
query heads that share a K/V head stacked into one matrix product, and the
masked half of each score matrix computed too (``attention="dense"``: about
13% more arithmetic than glassllm's step), or glassllm's own tiled kernel
with its backward called by hand (``"tiled"``: the same arithmetic).

It computes exactly what :func:`glassllm.train.train_step` computes (forward,
mean cross-entropy, backward, clipping to global norm ``grad_clip``, AdamW
with decay on matrices only): ``tests/test_bench_numpy_step.py`` checks its
loss, gradients and updated weights against glassllm's, in float64, to 1e-10.
``bench/bench_train.py`` times it beside glassllm and PyTorch, so the gap
between glassllm and the tiled variant -- what the autograd engine and the
modules cost -- is measured in the same run as the ratios to PyTorch.
"""

from __future__ import annotations

import math

import numpy as np

from glassllm.autograd import Tensor
from glassllm.kernels import self_attention


class NumpyStep:
    """One model's weights, AdamW moments and a step function, all in flat buffers.

    ``state``: a glassllm ``state_dict()`` (names as :class:`glassllm.nn.Transformer`
    uses them); ``config``: its :class:`glassllm.config.ModelConfig`.
    """

    def __init__(self, state: dict, config, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                 grad_clip=1.0, dtype=np.float32, attention: str = "dense"):
        if attention not in ("dense", "tiled"):
            raise ValueError(f"attention must be 'dense' or 'tiled', got {attention!r}")
        self.attention = attention
        c = config
        self.c, self.dtype = c, np.dtype(dtype)
        self.H, self.G, self.D, self.F = c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim
        self.lr, self.b1, self.b2, self.eps = lr, betas[0], betas[1], eps
        self.wd, self.grad_clip, self.t = weight_decay, grad_clip, 0

        # Parameter layout: matrices first (decayed), vectors (norm gains) last, so
        # weight decay touches one leading slice of the flat buffer.
        shapes = [("tok", "tok_embeddings.weight", None)]
        for i in range(c.n_layers):
            a, f = f"layers.{i}.attention.", f"layers.{i}.feed_forward."
            shapes += [(f"wqkv{i}", [a + "wq.weight", a + "wk.weight", a + "wv.weight"], None),
                       (f"wo{i}", a + "wo.weight", None),
                       (f"w13_{i}", [f + "w1.weight", f + "w3.weight"], None),
                       (f"w2_{i}", f + "w2.weight", None)]
        shapes.append(("out", "output.weight", None))
        n_matrix = len(shapes)
        for i in range(c.n_layers):
            shapes += [(f"an{i}", f"layers.{i}.attention_norm.weight", None),
                       (f"mn{i}", f"layers.{i}.ffn_norm.weight", None)]
        shapes.append(("norm", "norm.weight", None))

        arrays = {}
        for key, names, _ in shapes:
            arrays[key] = (np.concatenate([state[n] for n in names], axis=0) if isinstance(names, list)
                           else np.asarray(state[names]))
        self.sources = {key: names for key, names, _ in shapes}
        total = sum(a.size for a in arrays.values())
        self.flat = np.empty(total, self.dtype)
        self.grad_flat = np.zeros(total, self.dtype)
        self.m = np.zeros(total, self.dtype)
        self.v = np.zeros(total, self.dtype)
        self.tmp = np.empty(total, self.dtype)
        self.p, self.g = {}, {}
        offset = 0
        for i, (key, _, _) in enumerate(shapes):
            a = arrays[key]
            view = self.flat[offset: offset + a.size].reshape(a.shape)
            view[...] = a
            self.p[key] = view
            self.g[key] = self.grad_flat[offset: offset + a.size].reshape(a.shape)
            offset += a.size
            if i == n_matrix - 1:
                self.n_decay = offset

        # RoPE as unit complex numbers for interleaved pairs: (T, 1, D/2), per position.
        D = self.D
        freqs = 1.0 / (c.rope_theta ** (np.arange(0, D, 2, dtype=np.float64) / D))
        angles = np.outer(np.arange(c.max_seq_len), freqs)
        self.z = (np.cos(angles) + 1j * np.sin(angles)).astype(np.result_type(self.dtype, np.complex64))
        self.cos, self.sin = np.cos(angles).astype(self.dtype), np.sin(angles).astype(self.dtype)

    def state_dict(self, arrays: dict | None = None) -> dict:
        """The current weights under glassllm's names (the fused matrices split again).

        ``arrays``: another set keyed like the weights -- ``self.g``, the gradients."""
        arrays = self.p if arrays is None else arrays
        out = {}
        for key, names in self.sources.items():
            w = arrays[key]
            if isinstance(names, list):
                sizes = [self.c.n_heads * self.D, self.G * self.D, self.G * self.D] if len(names) == 3 else [self.F] * 2
                for name, part in zip(names, np.split(w, np.cumsum(sizes)[:-1], axis=0)):
                    out[name] = part.copy()
            else:
                out[names] = w.copy()
        return out

    # -- pieces --------------------------------------------------------------------

    def _norm(self, x, gain):
        """RMSNorm: returns (out, xhat, r) with xhat = x * r, r = 1/sqrt(mean(x^2) + eps)."""
        r = np.einsum("nc,nc->n", x, x)[:, None]
        r *= self.dtype.type(1.0 / x.shape[1])
        r += self.dtype.type(self.c.norm_eps)
        np.sqrt(r, out=r)
        np.reciprocal(r, out=r)
        xhat = x * r
        return xhat * gain, xhat, r

    def _norm_back(self, dy, xhat, r, gain, dgain):
        """Adds dL/dgain into ``dgain``; returns dL/dx."""
        dgain += np.einsum("nc,nc->c", dy, xhat)
        dxhat = dy * gain
        dot = np.einsum("nc,nc->n", dxhat, xhat)[:, None]
        dot *= self.dtype.type(1.0 / xhat.shape[1])
        xhat *= dot
        dxhat -= xhat
        dxhat *= r
        return dxhat

    # -- the step ----------------------------------------------------------------------

    def loss_and_grads(self, tokens: np.ndarray, targets: np.ndarray) -> float:
        """Forward and backward; fills the gradient buffer and returns the mean loss."""
        c, p, g, dt = self.c, self.p, self.g, self.dtype
        B, T = tokens.shape
        N, C, H, G, D, F = B * T, c.dim, self.H, self.G, self.D, self.F
        r = H // G
        scale = dt.type(1.0 / math.sqrt(D))
        cdt = self.z.dtype
        z = self.z[:T, None, :]                                             # (T, 1, D/2)
        future = np.triu(np.ones((T, T), dtype=bool), 1)
        neg = np.where(future, -np.inf, 0.0).astype(dt)                     # (T, T) additive mask
        self.grad_flat[...] = 0

        ids = tokens.reshape(-1)
        x = p["tok"][ids]                                                   # (N, C)
        saved = []
        for i in range(c.n_layers):
            # attention
            xn, xhat, rr = self._norm(x, p[f"an{i}"])
            qkv = xn @ p[f"wqkv{i}"].T                                      # (N, (H+2G)D)
            if self.attention == "tiled":
                # glassllm's tiled kernel (RoPE included), its backward called by hand below
                leaf = Tensor(qkv.reshape(B, T, -1), requires_grad=True)
                out = self_attention(leaf, H, G, self.cos[:T], self.sin[:T])
                heads = out.data.reshape(N, H * D)
                Q = K = V = S = None
                attn = (leaf, out)
            else:
                q = qkv[:, : H * D].reshape(B, T, H, D)
                k = qkv[:, H * D: (H + G) * D].reshape(B, T, G, D)
                v = qkv[:, (H + G) * D:].reshape(B, T, G, D)
                qr = np.empty((B, T, H, D), dt)
                kr = np.empty((B, T, G, D), dt)
                np.multiply(np.ascontiguousarray(q).view(cdt), z, out=qr.view(cdt))
                np.multiply(np.ascontiguousarray(k).view(cdt), z, out=kr.view(cdt))
                # (B, G, r*T, D): the r query heads of K/V head g stacked along the rows
                Q = qr.reshape(B, T, G, r, D).transpose(0, 2, 3, 1, 4).reshape(B, G, r * T, D)
                K = kr.transpose(0, 2, 1, 3)                                    # (B, G, T, D)
                V = np.ascontiguousarray(v.transpose(0, 2, 1, 3))              # (B, G, T, D)
                S = Q @ K.transpose(0, 1, 3, 2)                                 # (B, G, rT, T)
                S4 = S.reshape(B, G, r, T, T)
                S4 *= scale
                S4 += neg
                S -= S.max(axis=-1, keepdims=True)
                np.exp(S, out=S)
                S /= S.sum(axis=-1, keepdims=True)                              # P
                O = S @ V                                                       # (B, G, rT, D)
                heads = O.reshape(B, G, r, T, D).transpose(0, 3, 1, 2, 4).reshape(N, H * D)
                attn = None
            x = x + heads @ p[f"wo{i}"].T
            # SwiGLU MLP
            xn2, xhat2, rr2 = self._norm(x, p[f"mn{i}"])
            gu = xn2 @ p[f"w13_{i}"].T                                      # (N, 2F)
            gate, up = gu[:, :F], gu[:, F:]
            sig = np.negative(gate)
            np.exp(sig, out=sig)
            sig += dt.type(1)
            np.reciprocal(sig, out=sig)
            act = gate * sig
            h = act * up
            x = x + h @ p[f"w2_{i}"].T
            saved.append((xn, xhat, rr, Q, K, V, S, attn, heads, xn2, xhat2, rr2, gate, up, sig, act, h))

        xn, xhat, rr = self._norm(x, p["norm"])
        logits = xn @ p["out"].T                                            # (N, V)
        logits -= logits.max(axis=1, keepdims=True)
        rows = np.arange(N)
        tgt = targets.reshape(-1)
        np.exp(logits, out=logits)
        sums = logits.sum(axis=1)
        picked = logits[rows, tgt]
        loss = float(np.mean(np.log(sums.astype(np.float64)) - np.log(picked.astype(np.float64))))

        # backward: dlogits = (softmax - onehot) / N
        logits /= sums[:, None]
        logits[rows, tgt] -= dt.type(1)
        logits *= dt.type(1.0 / N)
        g["out"] += logits.T @ xn
        dx = self._norm_back(logits @ p["out"], xhat, rr, p["norm"], g["norm"])

        for i in reversed(range(c.n_layers)):
            xn, xhat, rr, Q, K, V, P, attn, heads, xn2, xhat2, rr2, gate, up, sig, act, h = saved[i]
            # MLP
            g[f"w2_{i}"] += dx.T @ h
            dh = dx @ p[f"w2_{i}"]                                          # (N, F)
            dgu = np.empty((N, 2 * F), dt)
            np.multiply(dh, act, out=dgu[:, F:])                            # d up
            dact = dh * up
            # d silu(g)/dg = sig * (1 + g (1 - sig))
            one_minus = dt.type(1) - sig
            one_minus *= gate
            one_minus += dt.type(1)
            one_minus *= sig
            np.multiply(dact, one_minus, out=dgu[:, :F])
            g[f"w13_{i}"] += dgu.T @ xn2
            dx = dx + self._norm_back(dgu @ p[f"w13_{i}"], xhat2, rr2, p[f"mn{i}"], g[f"mn{i}"])
            # attention
            g[f"wo{i}"] += dx.T @ heads
            dheads = dx @ p[f"wo{i}"]                                       # (N, H*D)
            if attn is not None:
                leaf, out = attn
                out.backward(dheads.reshape(B, T, H * D))
                dqkv = leaf.grad.reshape(N, -1)
            else:
                dO = dheads.reshape(B, T, G, r, D).transpose(0, 2, 3, 1, 4).reshape(B, G, r * T, D)
                dV = P.transpose(0, 1, 3, 2) @ dO.reshape(B, G, r * T, D)       # (B, G, T, D)
                dP = dO @ V.transpose(0, 1, 3, 2)                               # (B, G, rT, T)
                dP -= np.einsum("bgqk,bgqk->bgq", dP, P)[..., None]
                dP *= P                                                         # dS (before the scale)
                dP *= scale
                dQ = dP @ K                                                     # (B, G, rT, D)
                dK = dP.transpose(0, 1, 3, 2) @ Q                               # (B, G, T, D)
                dqkv = np.empty((B, T, (H + 2 * G) * D), dt)
                dq = dqkv[..., : H * D].reshape(B, T, G, r, D)
                dq[...] = dQ.reshape(B, G, r, T, D).transpose(0, 3, 1, 2, 4)
                dk = dqkv[..., H * D: (H + G) * D].reshape(B, T, G, D)
                dk[...] = dK.transpose(0, 2, 1, 3)
                dqkv[..., (H + G) * D:].reshape(B, T, G, D)[...] = dV.transpose(0, 2, 1, 3)
                rot = dqkv[..., : (H + G) * D].reshape(B, T, H + G, D)          # un-rotate dq and dk in place
                tmp = np.ascontiguousarray(rot)
                np.multiply(tmp.view(cdt), np.conjugate(z), out=tmp.view(cdt))
                rot[...] = tmp
                dqkv = dqkv.reshape(N, -1)
            g[f"wqkv{i}"] += dqkv.T @ xn
            dx = dx + self._norm_back(dqkv @ p[f"wqkv{i}"], xhat, rr, p[f"an{i}"], g[f"an{i}"])

        # repeated ids accumulate; over flat (row * C + column) indices np.add.at takes its fast 1-D path
        np.add.at(g["tok"].reshape(-1), (ids[:, None] * C + np.arange(C)).reshape(-1), dx.reshape(-1))
        return loss

    def step(self, tokens, targets, lr: float | None = None) -> tuple[float, float]:
        """Forward, backward, clip, AdamW. Returns (loss, gradient norm before clipping)."""
        loss = self.loss_and_grads(tokens, targets)
        gr, dt = self.grad_flat, self.dtype
        norm = math.sqrt(float(np.dot(gr, gr)))
        if self.grad_clip > 0:
            coef = min(1.0, self.grad_clip / (norm + 1e-6))
            if coef < 1.0:
                gr *= dt.type(coef)
        self.t += 1
        lr = self.lr if lr is None else lr
        b1, b2 = self.b1, self.b2
        bc1, bc2_sqrt = 1.0 - b1 ** self.t, math.sqrt(1.0 - b2 ** self.t)
        p, m, v, t = self.flat, self.m, self.v, self.tmp
        if self.wd:
            p[: self.n_decay] *= dt.type(1.0 - lr * self.wd)
        np.subtract(gr, m, out=t)
        t *= dt.type(1.0 - b1)
        m += t
        v *= dt.type(b2)
        np.multiply(gr, gr, out=t)
        t *= dt.type(1.0 - b2)
        v += t
        np.sqrt(v, out=t)
        t /= dt.type(bc2_sqrt)
        t += dt.type(self.eps)
        np.divide(m, t, out=t)
        t *= dt.type(lr / bc1)
        p -= t
        return loss, norm
