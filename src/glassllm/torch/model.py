"""The glassllm decoder in PyTorch: same architecture, same parameter names, same model file.

:class:`Transformer` here computes what :class:`glassllm.nn.Transformer` computes
-- pre-norm blocks of RMSNorm, grouped-query attention with *interleaved-pair*
RoPE, SwiGLU, no biases -- with PyTorch kernels (``scaled_dot_product_attention``),
so it runs on GPUs and trains across processes with DistributedDataParallel
(:mod:`glassllm.torch.train_ddp`). Its ``state_dict()`` has exactly glassllm's keys
(``tok_embeddings.weight``, ``layers.{i}.attention.wq.weight``, ...), so weights
move between the two key for key; :func:`save_model` writes the glass box's own
model file (:mod:`glassllm.checkpoint`), which the tracer and the inspector open.
A tied head (``config.tie_embeddings``) is PyTorch's tied module: ``output.weight`` is
``tok_embeddings.weight``, one ``Parameter``; PyTorch's ``state_dict()`` lists it under both
names, glassllm's under ``tok_embeddings.weight`` alone, and :func:`from_glassllm` and
:func:`to_glassllm` cross between the two.

>>> import numpy as np, torch
>>> from glassllm.config import ModelConfig
>>> twin = Transformer(ModelConfig(n_layers=1))
>>> twin(torch.tensor([[1, 2, 3]])).shape
torch.Size([1, 3, 1024])

Shape legend: B batch, n positions, H query heads, G key/value heads, D head dim,
C model width, V vocabulary, F MLP width.
"""

from __future__ import annotations

import numpy as np

from ..optional import require

require("torch", "glassllm.torch")               # the real PyTorch, or one line naming the extra

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from ..config import ModelConfig

__all__ = ["Transformer", "rope", "from_glassllm", "to_glassllm", "load_model", "save_model"]


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn interleaved pairs (x[2i], x[2i+1]) of x (B, H, n, D) by angles with cos, sin (n, D/2)."""
    pairs = x.unflatten(-1, (-1, 2))                                     # (B, H, n, D/2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)  # (B, H, n, D)


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x**2) + eps) * weight`` over the features."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal grouped-query attention with RoPE; query head h reads K/V head h // (H/G)."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.wq = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, n, _ = x.shape
        H, G, D = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.wq(x).view(B, n, H, D).transpose(1, 2)                  # (B, H, n, D)
        k = self.wk(x).view(B, n, G, D).transpose(1, 2)                  # (B, G, n, D)
        v = self.wv(x).view(B, n, G, D).transpose(1, 2)                  # (B, G, n, D)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        mix = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=H != G)  # (B, H, n, D)
        return self.wo(mix.transpose(1, 2).reshape(B, n, H * D))         # (B, n, C)


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.ffn_dim, bias=False)
        self.w2 = nn.Linear(c.ffn_dim, c.dim, bias=False)
        self.w3 = nn.Linear(c.dim, c.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))                  # (B, n, C)


class Block(nn.Module):
    """``h = x + attention(norm(x))``; ``out = h + feed_forward(norm(h))``."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(c.dim, c.norm_eps)
        self.attention = Attention(c)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)
        self.feed_forward = FeedForward(c)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The decoder: token ids (B, n) -> logits (B, n, V), with glassllm's parameter names.

    Weights start as zeros-and-ones placeholders; use :func:`from_glassllm` (or
    :meth:`init_like_glassllm`) for glassllm's seeded initialisation.
    """

    def __init__(self, config: ModelConfig | None = None):
        super().__init__()
        config = ModelConfig() if config is None else config
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:                                         # one Parameter, two uses
            self.output.weight = self.tok_embeddings.weight
        # RoPE tables in float64 (as glassllm.nn.Rotary), cast with the module.
        D = config.head_dim
        inv_freq = config.rope_theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)            # (D/2,)
        angles = np.arange(config.max_seq_len, dtype=np.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
        self.register_buffer("rope_cos", torch.from_numpy(np.cos(angles)).float(), persistent=False)
        self.register_buffer("rope_sin", torch.from_numpy(np.sin(angles)).float(), persistent=False)
        self._angles = angles

    def _apply(self, fn, *args, **kwargs):
        # Recompute the tables from float64 after a dtype change (double() keeps full precision).
        out = super()._apply(fn, *args, **kwargs)
        dtype, device = self.tok_embeddings.weight.dtype, self.tok_embeddings.weight.device
        self.rope_cos = torch.from_numpy(np.cos(self._angles)).to(device=device, dtype=dtype)
        self.rope_sin = torch.from_numpy(np.sin(self._angles)).to(device=device, dtype=dtype)
        return out

    @classmethod
    def init_like_glassllm(cls, config: ModelConfig, seed: int = 0) -> "Transformer":
        """A twin with exactly the weights ``glassllm.nn.Transformer(config, seed)`` starts from."""
        from ..nn import Transformer as GlassTransformer

        return from_glassllm(GlassTransformer(config, seed=seed))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        B, n = tokens.shape
        if n > self.config.max_seq_len:
            raise ValueError(f"sequence of {n} positions exceeds the context length {self.config.max_seq_len}")
        cos, sin = self.rope_cos[:n], self.rope_sin[:n]                   # (n, D/2)
        x = self.tok_embeddings(tokens)                                   # (B, n, C)
        for block in self.layers:
            x = block(x, cos, sin)                                        # (B, n, C)
        return self.output(self.norm(x))                                  # (B, n, V)

    def loss(self, tokens: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
        """Mean cross-entropy of next-token ``targets`` (B, n) (as ``glassllm.nn.Transformer.loss``)."""
        logits = self(tokens)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore_index)


# ----------------------------------------------------------------------------
# Crossing over: glassllm <-> twin, and the model file
# ----------------------------------------------------------------------------

def from_glassllm(model, dtype: torch.dtype | None = None) -> Transformer:
    """A twin holding a copy of ``model``'s weights (a :class:`glassllm.nn.Transformer`)."""
    twin = Transformer(model.config)
    state = {k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:                                       # PyTorch names the tied head twice
        state["output.weight"] = state["tok_embeddings.weight"]
    twin.to(dtype or state["tok_embeddings.weight"].dtype)
    twin.load_state_dict(state, strict=True)
    return twin


def to_glassllm(twin: Transformer, dtype=np.float32):
    """A :class:`glassllm.nn.Transformer` holding a copy of the twin's weights (unwrap DDP first)."""
    from ..nn import Transformer as GlassTransformer

    twin = getattr(twin, "module", twin)  # a DistributedDataParallel wrapper
    model = GlassTransformer(twin.config, seed=0, dtype=dtype)
    state = twin.state_dict()
    if twin.config.tie_embeddings:                                        # glassllm names the tied head once
        del state["output.weight"]
    model.load_state_dict({k: v.detach().cpu().numpy() for k, v in state.items()})
    return model


def load_model(path, dtype: torch.dtype = torch.float32):
    """Read a glassllm model file into a twin: ``(twin, tokenizer, metadata)``."""
    from .. import checkpoint

    model, tokenizer, meta = checkpoint.load_model(path)
    return from_glassllm(model, dtype), tokenizer, meta


def save_model(path, twin: Transformer, tokenizer, metadata: dict[str, str] | None = None) -> None:
    """Write the twin as a glassllm model file (float32, atomically), the file the glass box opens."""
    from .. import checkpoint

    checkpoint.save_model(path, to_glassllm(twin), tokenizer, metadata)
