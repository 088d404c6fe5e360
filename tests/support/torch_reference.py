"""An independent LLaMA in PyTorch: the yardstick the glassllm tests measure against.

It is written from the LLaMA recipe, not from :mod:`glassllm.nn` (which it never
imports), and it deliberately computes things a *different* way where it can:

- RoPE multiplies each interleaved pair (x[2i], x[2i+1]) -- read as the complex
  number x[2i] + i x[2i+1] -- by ``exp(i * pos * theta**(-2i/D))``, as Meta's
  reference code does with ``torch.view_as_complex``;
- grouped-query attention copies each key/value head ``n_rep`` times with
  ``torch.repeat_interleave`` (K/V head g serves query heads g*n_rep ...);
- RMSNorm is ``torch.nn.functional.rms_norm``; SwiGLU is ``w2(silu(w1 x) * w3 x)``;
- the causal mask comes from ``torch.triu`` (True = forbidden).

Everything runs in float64 by default. Parameter names are LLaMA's, the same
keys glassllm uses, so weights cross over key for key::

    ref = TorchLlama(model.config.to_dict())
    ref.load_glassllm_state(model.state_dict())
    logits = ref(tokens)                           # (B, n, V) torch tensor
    loss = ref.loss(tokens, targets); loss.backward()
    grads = ref.grads()                            # {name: ndarray}

``forward(tokens, capture={})`` also fills the dict with the intermediate tensors
under glassllm's snapshot names (``layers.0.attn.softmax`` ...), *keeping* the
batch axis, each with ``retain_grad()`` so their gradients can be compared too.

Shape legend: B batch, n new queries, m keys, H query heads, G key/value heads,
D head dim, C model width, V vocabulary, F MLP width.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "TorchLlama", "rope_frequencies", "apply_rope", "causal_mask", "safe_softmax",
    "gqa_attention", "rms_norm", "swiglu", "DEFAULTS",
]

# The glassllm defaults, written out again here so the reference stands alone.
DEFAULTS = dict(vocab_size=1024, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=352,
                max_seq_len=512, norm_eps=1e-5, rope_theta=10000.0)


# ----------------------------------------------------------------------------
# Pure functions
# ----------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rope_frequencies(head_dim: int, positions, theta: float, dtype=torch.float64) -> torch.Tensor:
    """Unit complex numbers exp(i * pos * theta**(-2i/D)): (..., D/2) for integer ``positions`` (...)."""
    positions = torch.as_tensor(np.asarray(positions), dtype=torch.float64)
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)
    angles = positions[..., None] * inv_freq                                                 # (..., D/2)
    freqs = torch.polar(torch.ones_like(angles), angles)
    return freqs.to(torch.complex128 if dtype == torch.float64 else torch.complex64)


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x (..., n, D) by ``freqs`` broadcastable to (..., n, D/2)."""
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())  # (..., n, D/2)
    return torch.view_as_real(pairs * freqs).reshape(x.shape)                    # (..., n, D)


def causal_mask(n: int, m: int, start: int = 0) -> torch.Tensor:
    """(n, m) bool, True where key j is in query i's future: j > start + i."""
    return torch.ones(n, m, dtype=torch.bool).triu(start + 1)


def safe_softmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax whose rows of all -inf (every key forbidden) give zeros instead of NaN."""
    dead = torch.isneginf(scores).all(dim=dim, keepdim=True)
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=dim)
    return weights.masked_fill(dead, 0.0)


def gqa_attention(q, k, v, mask, capture: dict | None = None, prefix: str = "") -> torch.Tensor:
    """softmax(q k^T / sqrt(D) with ``mask`` -> -inf) v, expanding K/V heads by repeat_interleave.

    q (B, H, n, D); k, v (B, G, m, D); mask bool broadcastable to (B, H, n, m) or None.
    """
    H, G, D = q.shape[1], k.shape[1], q.shape[-1]
    k = torch.repeat_interleave(k, H // G, dim=1)                        # (B, H, m, D)
    v = torch.repeat_interleave(v, H // G, dim=1)                        # (B, H, m, D)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)                      # (B, H, n, m)
    _keep(capture, prefix + "scores", scores)
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    weights = safe_softmax(scores, dim=-1)                               # (B, H, n, m)
    _keep(capture, prefix + "softmax", weights)
    return weights @ v                                                   # (B, H, n, D)


def swiglu(x, w1, w2, w3, capture: dict | None = None, prefix: str = "") -> torch.Tensor:
    """w2(silu(w1 x) * w3 x), weights in (out, in) layout."""
    gate = _keep(capture, prefix + "gate", F.linear(x, w1))             # (B, n, F)
    up = _keep(capture, prefix + "up", F.linear(x, w3))                 # (B, n, F)
    act = _keep(capture, prefix + "act", F.silu(gate))                  # (B, n, F)
    prod = _keep(capture, prefix + "prod", act * up)                    # (B, n, F)
    return _keep(capture, prefix + "out", F.linear(prod, w2))           # (B, n, C)


def _keep(capture: dict | None, name: str, t: torch.Tensor) -> torch.Tensor:
    if capture is not None:
        if t.requires_grad:
            t.retain_grad()
        capture[name] = t
    return t


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------

class _Attention(torch.nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        H, G, D = c["n_heads"], c["n_kv_heads"], c["dim"] // c["n_heads"]
        self.wq = torch.nn.Linear(c["dim"], H * D, bias=False)
        self.wk = torch.nn.Linear(c["dim"], G * D, bias=False)
        self.wv = torch.nn.Linear(c["dim"], G * D, bias=False)
        self.wo = torch.nn.Linear(H * D, c["dim"], bias=False)
        self.H, self.G, self.D = H, G, D


class _FeedForward(torch.nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.w1 = torch.nn.Linear(c["dim"], c["ffn_dim"], bias=False)
        self.w2 = torch.nn.Linear(c["ffn_dim"], c["dim"], bias=False)
        self.w3 = torch.nn.Linear(c["dim"], c["ffn_dim"], bias=False)


class _RMSNorm(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))


class _Block(torch.nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.attention_norm = _RMSNorm(c["dim"])
        self.attention = _Attention(c)
        self.ffn_norm = _RMSNorm(c["dim"])
        self.feed_forward = _FeedForward(c)


class TorchLlama(torch.nn.Module):
    """A LLaMA decoder (pre-norm, RMSNorm, interleaved RoPE, GQA, SwiGLU, no biases).

    ``config``: a dict with glassllm's ModelConfig fields (missing ones take the
    defaults) or any object with ``to_dict()``. Parameters start at zero; load
    real ones with :meth:`load_glassllm_state`. ``attention="sdpa"`` swaps the
    spelled-out attention for PyTorch's fused ``scaled_dot_product_attention``
    (for benchmarks; no intermediates can be captured then).
    """

    def __init__(self, config=None, dtype=torch.float64, attention: str = "explicit"):
        super().__init__()
        if attention not in ("explicit", "sdpa"):
            raise ValueError(f"attention must be 'explicit' or 'sdpa', got {attention!r}")
        self.attention_impl = attention
        if config is not None and not isinstance(config, dict):
            config = config.to_dict()
        c = {**DEFAULTS, **(config or {})}
        self.config = c
        self.tok_embeddings = torch.nn.Embedding(c["vocab_size"], c["dim"])
        self.layers = torch.nn.ModuleList(_Block(c) for _ in range(c["n_layers"]))
        self.norm = _RMSNorm(c["dim"])
        self.output = torch.nn.Linear(c["dim"], c["vocab_size"], bias=False)
        self.to(dtype)
        with torch.no_grad():
            for p in self.parameters():
                p.zero_()

    @property
    def dtype(self) -> torch.dtype:
        return self.output.weight.dtype

    def load_glassllm_state(self, state: dict) -> None:
        """Copy glassllm arrays {name: ndarray} into the parameters, key for key, checking shapes."""
        params = dict(self.named_parameters())
        if set(params) != set(state):
            raise ValueError(f"keys differ: missing {sorted(set(params) - set(state))}, "
                             f"unexpected {sorted(set(state) - set(params))}")
        with torch.no_grad():
            for name, p in params.items():
                value = torch.as_tensor(np.asarray(state[name]), dtype=p.dtype)
                if tuple(value.shape) != tuple(p.shape):
                    raise ValueError(f"{name}: shape {tuple(value.shape)}, expected {tuple(p.shape)}")
                p.copy_(value)

    def grads(self) -> dict[str, np.ndarray]:
        """{name: gradient as ndarray} after a backward pass (zeros where none arrived)."""
        return {name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().numpy().copy()
                for name, p in self.named_parameters()}

    def forward(self, tokens, start_pos: int = 0, capture: dict | None = None) -> torch.Tensor:
        """Logits (B, n, V) for token ids (B, n) at positions start_pos .. start_pos+n-1.

        With ``start_pos`` > 0 there is no cache: the n tokens only see each other,
        but sit at later RoPE positions (useful to check that scores depend on
        relative position only).
        """
        c = self.config
        tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        if tokens.ndim == 1:
            tokens = tokens[None]
        B, n = tokens.shape
        freqs = rope_frequencies(c["dim"] // c["n_heads"], np.arange(start_pos, start_pos + n),
                                 c["rope_theta"], self.dtype)              # (n, D/2)
        mask = causal_mask(n, n)                                           # (n, n)
        x = _keep(capture, "embed", self.tok_embeddings(tokens))           # (B, n, C)
        for i, layer in enumerate(self.layers):
            p = f"layers.{i}."
            x = _keep(capture, p + "resid_pre", x)
            x = x + self._attention(layer, x, freqs, mask, capture, p)    # (B, n, C)
            x = _keep(capture, p + "resid_mid", x)
            h = self._norm(layer.ffn_norm, x, capture, p + "mlp_norm.")
            f = layer.feed_forward
            x = x + swiglu(h, f.w1.weight, f.w2.weight, f.w3.weight, capture, p + "mlp.")
            x = _keep(capture, p + "resid_post", x)
        x = self._norm(self.norm, x, capture, "norm.")
        logits = _keep(capture, "logits", F.linear(x, self.output.weight))  # (B, n, V)
        if capture is not None:
            capture["probs"] = torch.softmax(logits, dim=-1)
        return logits

    def _norm(self, norm: _RMSNorm, x, capture, prefix):
        _keep(capture, prefix + "in", x)
        if capture is not None:
            eps = self.config["norm_eps"]
            capture[prefix + "rms"] = torch.sqrt((x * x).mean(-1) + eps)  # (B, n)
        return _keep(capture, prefix + "out", rms_norm(x, norm.weight, self.config["norm_eps"]))

    def _attention(self, layer: _Block, x, freqs, mask, capture, p):
        a = layer.attention
        B, n, _ = x.shape
        h = self._norm(layer.attention_norm, x, capture, p + "attn_norm.")
        q = F.linear(h, a.wq.weight).view(B, n, a.H, a.D).transpose(1, 2)  # (B, H, n, D)
        k = F.linear(h, a.wk.weight).view(B, n, a.G, a.D).transpose(1, 2)  # (B, G, n, D)
        v = F.linear(h, a.wv.weight).view(B, n, a.G, a.D).transpose(1, 2)  # (B, G, n, D)
        pa = p + "attn."
        _keep(capture, pa + "q", q), _keep(capture, pa + "k", k), _keep(capture, pa + "v", v)
        q = _keep(capture, pa + "rope_q", apply_rope(q, freqs))            # (B, H, n, D)
        k = _keep(capture, pa + "rope_k", apply_rope(k, freqs))            # (B, G, n, D)
        if capture is not None:
            capture[pa + "mask"] = mask
        if self.attention_impl == "sdpa" and capture is None:
            r = a.H // a.G
            mix = F.scaled_dot_product_attention(q, k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1),
                                                 is_causal=True)          # (B, H, n, D)
        else:
            mix = gqa_attention(q, k, v, mask, capture, pa)                # (B, H, n, D)
        _keep(capture, pa + "mix", mix)
        if capture is not None:
            # Each head's share of the output: its slice of mix through its slice of W_O.
            wo = a.wo.weight.view(-1, a.H, a.D).permute(1, 2, 0)            # (H, D, C)
            head_out = _keep(capture, pa + "head_out", mix @ wo)           # (B, H, n, C)
            return _keep(capture, pa + "out", head_out.sum(1))             # (B, n, C)
        heads = mix.transpose(1, 2).reshape(B, n, a.H * a.D)                # (B, n, H*D)
        return _keep(capture, pa + "out", F.linear(heads, a.wo.weight))    # (B, n, C)

    def loss(self, tokens, targets, ignore_index: int = -100) -> torch.Tensor:
        """Mean cross-entropy of next-token ``targets`` (B, n); ``ignore_index`` positions skipped."""
        logits = self(tokens)
        targets = torch.as_tensor(np.asarray(targets), dtype=torch.long)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                               ignore_index=ignore_index)
