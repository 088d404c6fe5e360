"""The glassllm decoder: a small LLaMA-style transformer built on :mod:`glassllm.autograd`.

Architecture (pre-norm, no biases anywhere)::

    tokens -> tok_embeddings -> [Block] x n_layers -> norm -> output -> logits
    Block:  h = x + Attention(RMSNorm(x));  out = h + SwiGLU(RMSNorm(h))

Parameter names mirror Meta's LLaMA checkpoints, so loading and exporting is a
key-for-key map (shapes for the default config in brackets; weights are
stored (out, in) and applied as ``x @ W.T``):

=====================================  =========================
``tok_embeddings.weight``              (V, C)      = (1024, 128)
``layers.{i}.attention_norm.weight``   (C,)        = (128,)
``layers.{i}.attention.wq.weight``     (H*D, C)    = (128, 128)
``layers.{i}.attention.wk.weight``     (G*D, C)    = (64, 128)
``layers.{i}.attention.wv.weight``     (G*D, C)    = (64, 128)
``layers.{i}.attention.wo.weight``     (C, H*D)    = (128, 128)
``layers.{i}.ffn_norm.weight``         (C,)        = (128,)
``layers.{i}.feed_forward.w1.weight``  (F, C)      = (352, 128)   gate
``layers.{i}.feed_forward.w2.weight``  (C, F)      = (128, 352)   down
``layers.{i}.feed_forward.w3.weight``  (F, C)      = (352, 128)   up
``norm.weight``                        (C,)        = (128,)
``output.weight``                      (V, C)      = (1024, 128)
=====================================  =========================

A tied head (``ModelConfig(tie_embeddings=True)``, Hugging Face's ``tie_word_embeddings``)
has no ``output.weight`` of its own: ``output.weight`` *is* ``tok_embeddings.weight``, one
parameter used twice, listed once (under ``tok_embeddings.weight``) by
:meth:`Module.named_parameters`, the state dict and the optimiser, and its gradient is the
sum of both uses (as in PyTorch's tied modules).

RoPE layout: *interleaved pairs*, as in the RoPE paper and Meta's reference
code: features (2i, 2i+1) of each head form one pair rotated by angle
``pos * theta**(-2i/D)``. Hugging Face's Llama uses *split halves* (feature i
pairs with i + D/2); exporting permutes the rows of wq and wk within each
head (see :mod:`glassllm.interop.hf`).

Snapshots. Every module names the intermediate tensors it computes; a tracer
(:mod:`glassllm.trace`) attached with :meth:`Module.set_tracer` receives each
one through :meth:`Module.snap` and may record or replace it. With no tracer
attached ``snap`` returns its argument untouched. The names, in forward
order, come from :meth:`Transformer.snapshot_axes`; axes use the shape legend
below, with the batch axis removed.

Kernels. Each layer's ``__call__`` here is the reference: the spec, step by
step. Faster ways to compute the same numbers (fused ops, tiled attention)
live in :mod:`glassllm.kernels`, on a layer above this module; at the start of
every forward the model asks the kernel dispatcher once, through
:mod:`glassllm.dispatcher`, which layers may run one (it sets each layer's
public ``kernel``), and calls its layers through :meth:`Module.run`, the one
line that runs the chosen kernel or the reference. A layer whose snapshots a
tracer wants always runs the code below. ``glassllm.kernels.plan(model, n=16)``
prints which path each layer takes and why; ``with glassllm.kernels.disabled():``
runs this code everywhere.

Shape legend: B batch, n new queries, m keys (m = start + n), H query heads,
G key/value heads, D head dim, C model width, V vocabulary, F MLP width.
"""

from __future__ import annotations

import math

import numpy as np

from .checks import is_int
from . import autograd as ag
from . import dispatcher
from .autograd import Tensor
from .config import ModelConfig
from .ops.rotary import rotation_matrices
from .positions import causal_mask, check_fits, positions

__all__ = [
    "Module", "Linear", "Embedding", "RMSNorm", "Rotary", "Attention", "FeedForward",
    "Block", "Transformer", "KVCache", "causal_mask", "model_dtype",
]


# ----------------------------------------------------------------------------
# Module plumbing: parameters, state dicts, snapshots
# ----------------------------------------------------------------------------

def model_dtype(dtype) -> np.dtype:
    """``dtype`` as a NumPy dtype if a model can compute in it (float32 or float64); a one-line
    ValueError otherwise. (NumPy has no fast float16 matrix product, and no bfloat16.)"""
    try:
        dt = None if dtype is None else np.dtype(dtype)                 # (NumPy would read None as float64)
    except TypeError:
        dt = None
    if dt is None or dt.name not in ("float32", "float64") or isinstance(dtype, bool):
        shown = dt.name if dt is not None else repr(dtype)
        raise ValueError(f"dtype must be float32 or float64, got {shown}")
    return dt


class Module:
    """Holds parameters (``Tensor`` attributes with ``requires_grad``) and child modules.

    Subclasses list their snapshot names and axes in ``SNAPSHOTS``;
    :meth:`Transformer.__init__` assigns every module its snapshot prefix
    (``layers.0.attn.`` for the first block's ``attention``).

    A subclass's ``__call__`` is its reference computation. The model calls
    its layers through :meth:`run`, which runs ``self.kernel`` instead when the
    dispatcher (:mod:`glassllm.kernels.dispatch`) chose one for this forward: a
    registered function computing the same thing faster. Outside a model's
    forward ``kernel`` is None and the reference runs;
    :func:`glassllm.kernels.plan` tells which path each layer takes, and why.
    """

    SNAPSHOTS: dict[str, tuple[str, ...]] = {}
    kernel = None           # the kernel chosen for this forward (a glassllm.kernels.Kernel), or None

    def __init__(self):
        self._tracer = None
        self._prefix = ""

    def run(self, *args, **kwargs):
        """This layer inside a model's forward: the chosen kernel, or else the reference ``__call__``."""
        return self(*args, **kwargs) if self.kernel is None else self.kernel.run(self, *args, **kwargs)

    @property
    def prefix(self) -> str:
        """This module's snapshot prefix: ``"layers.0.attn."`` for the first block's attention; "" for the model."""
        return self._prefix

    @property
    def tracer(self):
        """The tracer attached with :meth:`set_tracer`, or None."""
        return self._tracer

    # -- walking --------------------------------------------------------------
    def _child_attributes(self) -> list:
        """(attribute name, value) of every public attribute that is a module or a non-empty list of modules."""
        return [(key, value) for key, value in self.__dict__.items() if key[0] != "_" and (
                isinstance(value, Module) or (isinstance(value, (list, tuple)) and value
                                                 and all(isinstance(v, Module) for v in value)))]

    def children(self):
        """(attribute name, module) pairs in definition order; lists are expanded as name.i."""
        for key, value in self._child_attributes():
            if isinstance(value, Module):
                yield key, value
            else:
                yield from ((f"{key}.{i}", v) for i, v in enumerate(value))

    def modules(self) -> list["Module"]:
        """This module and every module below it, depth first in definition order (no names built)."""
        out, stack = [], [self]
        while stack:
            module = stack.pop()
            out.append(module)
            below = []
            for _, value in module._child_attributes():
                below.extend((value,) if isinstance(value, Module) else value)
            stack.extend(reversed(below))
        return out

    def named_parameters(self, prefix: str = ""):
        """(name, parameter) of every parameter below this module, in definition order; a parameter
        two modules share (a tied head) is listed once, under its first name (as PyTorch lists it)."""
        seen = set()
        for name, p in self._named_parameters_with_repeats(prefix):
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def _named_parameters_with_repeats(self, prefix: str):
        for key, value in vars(self).items():
            if isinstance(value, Tensor) and value.requires_grad:
                yield prefix + key, value
        for key, child in self.children():
            yield from child._named_parameters_with_repeats(f"{prefix}{key}.")

    def parameters(self) -> list[Tensor]:
        return [p for _, p in self.named_parameters()]

    def state_dict(self) -> dict[str, np.ndarray]:
        return {name: p.data for name, p in self.named_parameters()}

    def load_state_dict(self, state: dict[str, np.ndarray], copy: bool = True) -> None:
        """Copy arrays into the parameters, key for key, checking every shape.

        ``copy=False`` takes an array of the parameter's dtype as it is (a memory-mapped tensor
        of a model file stays mapped, see :func:`glassllm.files.read_safetensors`); two keys that
        share memory still get an array each, so updating one never moves the other (a head meant to
        be the embedding is tied in the config, not by sharing memory).
        Raises ValueError naming the first missing, unexpected or misshapen key.
        """
        params = dict(self.named_parameters())
        missing = [k for k in params if k not in state]
        unexpected = [k for k in state if k not in params]
        if missing:
            raise ValueError(f"state dict is missing parameter {missing[0]!r} (and {len(missing) - 1} more)")
        if unexpected:
            raise ValueError(f"state dict has unexpected key {unexpected[0]!r}")
        kept = []
        for name, p in params.items():
            value = np.asarray(state[name])
            if value.shape != p.shape:
                raise ValueError(f"parameter {name!r} has shape {value.shape}, expected {p.shape}")
            if not _all_finite(value):
                raise ValueError(f"parameter {name!r} contains NaN or infinite values")
            shared = not copy and any(np.may_share_memory(value, taken) for taken in kept)
            p.data = value.astype(p.dtype, copy=copy or shared or not value.flags.writeable)
            kept.append(p.data)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def astype(self, dtype) -> "Module":
        """Cast every parameter (and cached tables) to ``dtype`` (float32 or float64) in place; returns self."""
        dtype = model_dtype(dtype)
        for p in self.parameters():
            p.data = p.data.astype(dtype)
        for m in self.modules():
            m._cast_buffers(dtype)
        return self

    def _cast_buffers(self, dtype) -> None:
        pass

    # -- snapshots --------------------------------------------------------------
    def set_tracer(self, tracer) -> None:
        """Attach (or with None detach) a tracer to this module and all below it."""
        for m in self.modules():
            m._tracer = tracer

    def snap(self, local: str, t: Tensor) -> Tensor:
        """Hand snapshot ``local`` to the tracer, which may record or replace it."""
        tracer = self._tracer
        if tracer is None:
            return t
        return tracer.record(self._prefix + local, t)

    def snap_derived(self, local: str, fn, *args, **kwargs) -> None:
        """Snapshot ``local`` = ``fn(*args, **kwargs)``, computed only when a tracer records or edits it
        (nothing downstream reads it, so an untraced forward skips the work)."""
        if self.tracing(local):
            self.snap(local, fn(*args, **kwargs))

    def begin_forward(self, **step) -> None:
        """Tell an attached tracer that a forward begins (n, m, start, tokens, pad, paths)."""
        if self._tracer is not None:
            self._tracer.begin_forward(**step)

    def tracing(self, *locals_: str) -> bool:
        """Does the attached tracer record or edit any of these snapshots (values, grads or edits)? Asked
        through its ``observes(name)``; a tracer with only ``wants(names)`` is asked that."""
        tracer = self._tracer
        if tracer is None:
            return False
        names = [self._prefix + s for s in locals_]
        observes = getattr(tracer, "observes", None)
        return any(map(observes, names)) if observes is not None else tracer.wants(names)

    def snapshot_axes(self) -> dict[str, tuple[str, ...]]:
        """Full snapshot name -> axis names, in the order the forward pass produces them."""
        return {self._prefix + k: v for k, v in self.SNAPSHOTS.items()}


def _all_finite(a: np.ndarray, chunk: int = 1 << 22) -> bool:
    """Is every value finite? Checked a slice at a time: the check allocates a few MB, whatever the size."""
    flat = a.reshape(-1)
    return all(np.isfinite(flat[i:i + chunk]).all() for i in range(0, flat.size, chunk))


# ----------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------

def _normal(rng: np.random.Generator | None, shape, std: float, dtype) -> Tensor:
    """A parameter drawn from N(0, std**2); with ``rng`` None, left unset (``np.empty``: no pages
    are touched until a file's weights take its place)."""
    if rng is None:
        return Tensor(np.empty(shape, dtype=dtype), requires_grad=True)
    return Tensor(rng.normal(0.0, std, size=shape).astype(dtype), requires_grad=True)


class Linear(Module):
    """``y = x @ weight.T`` with ``weight`` (out, in); no bias."""

    def __init__(self, d_in: int, d_out: int, rng: np.random.Generator, std: float = 0.02, dtype=np.float32):
        super().__init__()
        self.weight = _normal(rng, (d_out, d_in), std, dtype)

    def __call__(self, x: Tensor) -> Tensor:
        return ag.linear(x, self.weight)


class Embedding(Module):
    """Token id -> row of ``weight`` (V, C)."""

    def __init__(self, vocab: int, dim: int, rng: np.random.Generator, std: float = 0.02, dtype=np.float32):
        super().__init__()
        self.weight = _normal(rng, (vocab, dim), std, dtype)

    def __call__(self, ids: np.ndarray) -> Tensor:
        return ag.embedding(self.weight, ids)


class RMSNorm(Module):
    """``x / rms(x) * weight`` with ``rms(x) = sqrt(mean(x**2) + eps)`` over the features.

    Snapshots: ``in`` (n, C), ``rms`` (n,), ``out`` (n, C).
    """

    SNAPSHOTS = {"in": ("n", "C"), "rms": ("n",), "out": ("n", "C")}

    def __init__(self, dim: int, eps: float, dtype=np.float32):
        super().__init__()
        self.eps = float(eps)
        self.weight = Tensor(np.ones(dim, dtype=dtype), requires_grad=True)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.snap("in", x)                                           # (B, n, C)
        rms = self.snap("rms", ag.sqrt(ag.mean(x * x, axis=-1) + self.eps))  # (B, n)
        out = x / ag.reshape(rms, rms.shape + (1,)) * self.weight        # (B, n, C)
        return self.snap("out", out)


class Rotary:
    """Cos/sin tables of rotary position embedding for positions 0 .. max_len-1.

    Pair i of a head (features 2i, 2i+1) at position p turns by angle
    ``p * theta ** (-2i / D)``: fast-spinning pairs encode fine position,
    slow ones coarse position. A query at p and a key at p' then meet at angle
    proportional to p - p', so scores depend on relative position only.
    """

    def __init__(self, head_dim: int, max_len: int, theta: float, dtype=np.float32):
        inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # (D/2,)
        angles = np.arange(max_len, dtype=np.float64)[:, None] * inv_freq[None, :]    # (max_len, D/2)
        self._cos64, self._sin64 = np.cos(angles), np.sin(angles)
        self.cast(dtype)

    def cast(self, dtype) -> None:
        self.cos = self._cos64.astype(dtype)
        self.sin = self._sin64.astype(dtype)
        self._matrices = None

    def tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin for integer ``positions`` of any shape: (..., D/2)."""
        return self.cos[positions], self.sin[positions]

    def matrices(self, upto: int | None = None) -> np.ndarray:
        """The same rotations as matrices, (upto, D, D) for positions 0 .. upto-1 (default: all
        max_len): :func:`glassllm.ops.rotation_matrices` of these tables, for the lean decoder.

        Built on demand and kept (until :meth:`cast`): the decoder reads one per step. Only the
        positions asked for are built -- D x D numbers each, so a long context's whole table could
        be gigabytes.
        """
        upto = len(self.cos) if upto is None else min(int(upto), len(self.cos))
        if self._matrices is None or len(self._matrices) < upto:
            self._matrices = rotation_matrices(self.cos, self.sin, upto)    # (upto, D, D)
        return self._matrices[:upto]


class Attention(Module):
    """Causal grouped-query self-attention with rotary positions and an optional KV cache.

    Snapshots (batch axis removed): ``q`` (H, n, D); ``k``, ``v`` (G, n, D);
    ``rope_q`` (H, n, D); ``rope_k`` (G, n, D); ``cache_k``, ``cache_v``
    (G, m, D), the keys and values the queries read (cached + new);
    ``scores`` (H, n, m); ``mask`` (n, m), True = forbidden; ``softmax``
    (H, n, m); ``mix`` (H, n, D); ``head_out`` (H, n, C), each head's share of
    ``out``; ``out`` (n, C).
    """

    SNAPSHOTS = {
        "q": ("H", "n", "D"), "k": ("G", "n", "D"), "v": ("G", "n", "D"),
        "rope_q": ("H", "n", "D"), "rope_k": ("G", "n", "D"),
        "cache_k": ("G", "m", "D"), "cache_v": ("G", "m", "D"),
        "scores": ("H", "n", "m"), "mask": ("n", "m"), "softmax": ("H", "n", "m"),
        "mix": ("H", "n", "D"), "head_out": ("H", "n", "C"), "out": ("n", "C"),
    }

    def __init__(self, config: ModelConfig, rng: np.random.Generator, layer: int, dtype=np.float32):
        super().__init__()
        c = config
        self.layer = layer
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        out_std = 0.02 / math.sqrt(2 * c.n_layers)  # residual projections start small (GPT-2)
        self.wq = Linear(c.dim, c.n_heads * c.head_dim, rng, dtype=dtype)
        self.wk = Linear(c.dim, c.n_kv_heads * c.head_dim, rng, dtype=dtype)
        self.wv = Linear(c.dim, c.n_kv_heads * c.head_dim, rng, dtype=dtype)
        self.wo = Linear(c.n_heads * c.head_dim, c.dim, rng, std=out_std, dtype=dtype)

    def __call__(self, x: Tensor, rope: tuple[np.ndarray, np.ndarray], cache: "KVCache | None" = None,
                 start: int = 0, pad: np.ndarray | None = None) -> Tensor:
        """x (B, n, C), already normalised, at positions start .. start+n-1; rope = (cos, sin) for
        those positions; ``pad`` (B,): left-padding keys of each row, masked too. Returns (B, n, C)."""
        B, n, _ = x.shape
        H, G, D = self.n_heads, self.n_kv_heads, self.head_dim
        m = start + n

        # 1. Project x to queries, keys and values (no biases).
        q = self.wq(x).reshape(B, n, H, D).transpose(0, 2, 1, 3)         # (B, H, n, D)
        k = self.wk(x).reshape(B, n, G, D).transpose(0, 2, 1, 3)         # (B, G, n, D)
        v = self.wv(x).reshape(B, n, G, D).transpose(0, 2, 1, 3)         # (B, G, n, D)
        q, k, v = self.snap("q", q), self.snap("k", k), self.snap("v", v)

        # 2. RoPE: rotate queries and keys by their absolute positions.
        cos, sin = rope
        q = self.snap("rope_q", ag.rope(q, cos, sin))                    # (B, H, n, D)
        k = self.snap("rope_k", ag.rope(k, cos, sin))                    # (B, G, n, D)

        # 3. The cache: store the new rotated keys and values, read all m back.
        if cache is not None:
            k, v = cache.append(self.layer, start, k, v)                 # (B, G, m, D)
        k, v = self.snap("cache_k", k), self.snap("cache_v", v)

        # 4. Grouped-query expansion: K/V head g serves query heads g*r .. g*r+r-1.
        k = ag.repeat_interleave(k, H // G, axis=1)                      # (B, H, m, D)
        v = ag.repeat_interleave(v, H // G, axis=1)                      # (B, H, m, D)

        # 5. Scaled dot products of every query with every key: q k^T / sqrt(D).
        scores = ag.matmul(q, k.transpose(0, 1, 3, 2)) / math.sqrt(D)    # (B, H, n, m)
        scores = self.snap("scores", scores)

        # 6. The causal mask (and left padding): forbidden scores become -inf.
        mask = causal_mask(n, m, start, pad)                             # (n, m), or (B, n, m) with padding
        mask = self.snap("mask", Tensor(np.broadcast_to(mask, (B, n, m))))  # (B, n, m)
        scores = ag.masked_fill(scores, mask.data[:, None], -math.inf)   # (B, H, n, m)

        # 7. Softmax over the keys: each query's weights sum to 1.
        weights = self.snap("softmax", ag.softmax(scores, axis=-1))      # (B, H, n, m)

        # 8. Mix the values by those weights.
        mix = self.snap("mix", ag.matmul(weights, v))                    # (B, H, n, D)

        # 9. Project back to the model width with W_O. W_O applied to the heads side by side is
        #    the sum over heads of each head's mix through its own D columns of W_O: that term
        #    is the head's share of the output (head_out), and the output is their sum.
        wo = self.wo.weight.reshape(-1, H, D).transpose(1, 2, 0)         # (H, D, C)
        head_out = self.snap("head_out", ag.matmul(mix, wo))             # (B, H, n, C)
        return self.snap("out", ag.sum(head_out, axis=1))                # (B, n, C)


class FeedForward(Module):
    """SwiGLU MLP: ``w2(silu(w1 x) * w3 x)``.

    Snapshots: ``gate`` = w1 x, ``up`` = w3 x, ``act`` = silu(gate),
    ``prod`` = act * up, all (n, F); ``out`` (n, C).
    """

    SNAPSHOTS = {"gate": ("n", "F"), "up": ("n", "F"), "act": ("n", "F"), "prod": ("n", "F"), "out": ("n", "C")}

    def __init__(self, config: ModelConfig, rng: np.random.Generator, dtype=np.float32):
        super().__init__()
        c = config
        self.w1 = Linear(c.dim, c.ffn_dim, rng, dtype=dtype)
        self.w2 = Linear(c.ffn_dim, c.dim, rng, std=0.02 / math.sqrt(2 * c.n_layers), dtype=dtype)
        self.w3 = Linear(c.dim, c.ffn_dim, rng, dtype=dtype)

    def __call__(self, x: Tensor) -> Tensor:
        gate = self.snap("gate", self.w1(x))                             # (B, n, F)
        up = self.snap("up", self.w3(x))                                 # (B, n, F)
        act = self.snap("act", ag.silu(gate))                            # (B, n, F)
        prod = self.snap("prod", act * up)                               # (B, n, F)
        return self.snap("out", self.w2(prod))                           # (B, n, C)


class Block(Module):
    """Pre-norm residual block: ``h = x + attn(norm(x))``, ``out = h + mlp(norm(h))``.

    Each layer is called through :meth:`Module.run`: its kernel for this forward, or its reference.

    Snapshots of the residual stream: ``resid_pre`` (the block's input),
    ``resid_mid`` (after attention), ``resid_post`` (after the MLP); all (n, C).
    """

    SNAPSHOTS = {"resid_pre": ("n", "C"), "resid_mid": ("n", "C"), "resid_post": ("n", "C")}

    def __init__(self, config: ModelConfig, rng: np.random.Generator, layer: int, dtype=np.float32):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps, dtype)
        self.attention = Attention(config, rng, layer, dtype)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps, dtype)
        self.feed_forward = FeedForward(config, rng, dtype)

    def __call__(self, x, rope, cache=None, start=0, pad=None) -> Tensor:
        x = self.snap("resid_pre", x)
        h = self.snap("resid_mid", x + self.attention.run(self.attention_norm.run(x), rope, cache, start, pad))
        return self.snap("resid_post", h + self.feed_forward.run(self.ffn_norm.run(h)))

    def snapshot_axes(self):
        own = super().snapshot_axes()
        p = self._prefix
        order = [p + "resid_pre", self.attention_norm, self.attention, p + "resid_mid",
                 self.ffn_norm, self.feed_forward, p + "resid_post"]
        out = {}
        for item in order:
            out.update(item.snapshot_axes() if isinstance(item, Module) else {item: own[item]})
        return out


# ----------------------------------------------------------------------------
# KV cache
# ----------------------------------------------------------------------------

class KVCache:
    """Rotated keys and values of every layer for the positions seen so far.

    Arrays ``k``, ``v``: (L, B, G, capacity, D). ``start`` counts the filled
    positions; a forward pass of n new tokens writes positions start .. start+n-1
    and then advances ``start``. ``pad`` (B,) optionally gives the number of
    left-padding positions of each row (batched prompts of different lengths):
    keys at positions < pad[b] are masked, and row b's positions count from pad[b].
    """

    def __init__(self, config: ModelConfig, batch: int, dtype=np.float32, capacity: int | None = None,
                 pad: np.ndarray | None = None):
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        for name, value in (("batch", batch), ("capacity", capacity)):
            if value is not None and not is_int(value):
                raise TypeError(f"cache {name} must be an int, got {value!r}")
        if batch < 1:
            raise ValueError(f"cache batch must be >= 1, got {batch}")
        capacity = config.max_seq_len if capacity is None else int(capacity)
        if not 1 <= capacity <= config.max_seq_len:
            raise ValueError(f"cache capacity must be in [1, {config.max_seq_len}], got {capacity}")
        dtype = model_dtype(dtype)
        shape = (config.n_layers, batch, config.n_kv_heads, capacity, config.head_dim)
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.start = 0
        self.capacity = capacity
        self.batch = batch
        self.pad = None if pad is None else _check_pad(pad, batch)

    def append(self, layer: int, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new rotated keys/values (B, G, n, D) at ``start``; return all m = start + n."""
        n = k.shape[2]
        m = start + n
        self.k[layer, :, :, start:m] = k.data
        self.v[layer, :, :, start:m] = v.data
        if not (k.requires_grad or v.requires_grad) or start == 0:
            if start == 0:
                return k, v  # nothing cached before: keep the graph of the new keys
            return Tensor(self.k[layer, :, :, :m]), Tensor(self.v[layer, :, :, :m])
        # Under autograd, cached positions are constants and the new ones keep their graph.
        past_k, past_v = Tensor(self.k[layer, :, :, :start]), Tensor(self.v[layer, :, :, :start])
        return ag.concatenate([past_k, k], axis=2), ag.concatenate([past_v, v], axis=2)


def _check_pad(pad, batch: int) -> np.ndarray:
    pad = np.asarray(pad)
    if pad.shape != (batch,) or pad.dtype.kind not in "iu" or np.any(pad < 0):
        raise ValueError(f"pad must be {batch} non-negative ints (one per row), got {pad!r}")
    return pad.astype(np.int64)


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------

class Transformer(Module):
    """The decoder. ``model(tokens)`` maps token ids (B, n) to logits (B, n, V).

    Snapshots outside the blocks: ``embed`` (n, C); the final norm's
    ``norm.in``/``norm.rms``/``norm.out``; ``logits`` (n, V); ``probs`` (n, V),
    the softmax of the logits (computed only when traced).

    ``init=False`` draws no initial weights (the parameters are left unset): for a model whose
    weights come next from :meth:`load_state_dict`, as every model file's do.

    >>> model = Transformer(ModelConfig(), seed=0)
    >>> model(np.array([[1, 2, 3]])).shape
    (1, 3, 1024)
    """

    SNAPSHOTS = {"embed": ("n", "C"), "logits": ("n", "V"), "probs": ("n", "V")}

    def __init__(self, config: ModelConfig | None = None, seed: int | np.random.Generator = 0, dtype=np.float32,
                 init: bool = True):
        super().__init__()
        config = ModelConfig() if config is None else config
        if not isinstance(config, ModelConfig):
            raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
        dtype = model_dtype(dtype)
        # init=False: the weights are about to come from a file (load_state_dict), so none are drawn
        if not init:
            rng = None
        else:
            rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
        self.config = config
        self.tok_embeddings = Embedding(config.vocab_size, config.dim, rng, dtype=dtype)
        self.layers = [Block(config, rng, i, dtype) for i in range(config.n_layers)]
        self.norm = RMSNorm(config.dim, config.norm_eps, dtype)
        self.output = Linear(config.dim, config.vocab_size, None if config.tie_embeddings else rng, dtype=dtype)
        if config.tie_embeddings:                       # the head reads the embedding matrix: one parameter
            self.output.weight = self.tok_embeddings.weight
        self.rotary = Rotary(config.head_dim, config.max_seq_len, config.rope_theta, dtype)
        self._assign_prefixes()

    def _assign_prefixes(self) -> None:
        """Give every module its snapshot prefix; keep the module list and the snapshot table.

        The structure is fixed here, once: a tracer is attached and detached
        on every traced forward, so that walk is not repeated each time.
        """
        self._prefix = ""
        for i, block in enumerate(self.layers):
            block._prefix = f"layers.{i}."
            block.attention_norm._prefix = f"layers.{i}.attn_norm."
            block.attention._prefix = f"layers.{i}.attn."
            block.ffn_norm._prefix = f"layers.{i}.mlp_norm."
            block.feed_forward._prefix = f"layers.{i}.mlp."
        self.norm._prefix = "norm."
        self._all_modules = tuple(super().modules())
        self._kernel_slots = dispatcher.slots(self._all_modules[1:])       # the layers a kernel may replace
        self._axes = self._walk_snapshot_axes()

    def begin_forward(self, plan=None, **step) -> None:
        """Tell an attached tracer that a forward begins (n, m, start, tokens, pad) and which path each
        layer that a kernel may replace takes: ``paths`` {layer name: kernel name or "reference"},
        from the dispatcher's ``plan`` {layer: Kernel}."""
        if self._tracer is not None:
            plan = plan or {}
            paths = {layer.prefix[:-1]: plan[layer].name if layer in plan else "reference"
                     for layer, _ in self._kernel_slots}
            self._tracer.begin_forward(paths=paths, **step)

    def modules(self) -> list[Module]:
        """As :meth:`Module.modules`, walked once at construction (the structure is fixed there)."""
        return list(self._all_modules)

    def _cast_buffers(self, dtype) -> None:
        self.rotary.cast(dtype)

    @property
    def dtype(self):
        return self.tok_embeddings.weight.dtype

    @property
    def kernel_slots(self):
        """The layers a kernel may replace, with their options (:func:`glassllm.kernels.slots`), for
        :func:`glassllm.kernels.chosen` around a forward of part of the model (a lazy trace's block)."""
        return self._kernel_slots

    @property
    def _cache_axes(self) -> tuple[int, int, int]:
        c = self.config
        return (c.n_layers, c.n_kv_heads, c.head_dim)

    def snapshot_axes(self) -> dict[str, tuple[str, ...]]:
        return dict(self._axes)

    def _walk_snapshot_axes(self) -> dict[str, tuple[str, ...]]:
        own = super().snapshot_axes()
        out = {"embed": own["embed"]}
        for block in self.layers:
            out.update(block.snapshot_axes())
        out.update(self.norm.snapshot_axes())
        out["logits"], out["probs"] = own["logits"], own["probs"]
        return out

    def new_cache(self, batch: int = 1, capacity: int | None = None, pad=None) -> KVCache:
        return KVCache(self.config, batch, self.dtype, capacity, pad)

    def check_tokens(self, tokens) -> np.ndarray:
        """Validate token ids: ints in [0, V), shape (B, n) or (n,). Returns (B, n) int64."""
        if isinstance(tokens, Tensor):
            tokens = tokens.data
        arr = np.asarray(tokens)
        if arr.dtype == object or (arr.size and arr.dtype.kind not in "iu"):
            raise TypeError(f"token ids must be integers, got dtype {arr.dtype}")
        if arr.ndim == 1:
            arr = arr[None, :]
        if arr.ndim != 2:
            raise ValueError(f"token ids must have shape (B, n) or (n,), got shape {arr.shape}")
        if arr.shape[1] == 0:
            raise ValueError("token ids are empty: need at least one token")
        V = self.config.vocab_size
        bad = (arr < 0) | (arr >= V)
        if bad.any():
            raise ValueError(f"token id {arr[bad][0]} is out of range [0, {V})")
        return arr.astype(np.int64, copy=False)

    def __call__(self, tokens, cache: KVCache | None = None) -> Tensor:
        """Logits (B, n, V) for token ids (B, n).

        With a ``cache``, the n tokens sit at positions cache.start .. cache.start+n-1,
        read the m = start + n cached keys, and the cache advances by n.
        """
        tokens = self.check_tokens(tokens)
        B, n = tokens.shape
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache (model.new_cache(batch)) or None, got {type(cache).__name__}")
        start = 0 if cache is None else cache.start
        m = start + n
        if cache is None:
            check_fits(start, n, self.config.max_seq_len)
        else:
            check_fits(start, n, cache.capacity, "cache capacity")
        if cache is not None and cache.batch != B:
            raise ValueError(f"cache was made for batch {cache.batch}, got tokens with batch {B}")
        if cache is not None and (cache.k.dtype != self.dtype or cache.k.shape[0::2] != self._cache_axes):
            raise ValueError(f"cache holds {cache.k.dtype} keys of shape (L, B, G, capacity, D) = {cache.k.shape}; "
                             f"this model needs {self.dtype} with (L, G, D) = {self._cache_axes}: make it with "
                             "model.new_cache(batch)")
        pad = None if cache is None else cache.pad

        # Positions: row b of a left-padded batch counts from pad[b].
        cos, sin = self.rotary.tables(positions(start, m, pad))             # (n, D/2) or (B, n, D/2)
        if pad is not None:
            cos, sin = cos[:, None], sin[:, None]                           # (B, 1, n, D/2)

        with dispatcher.chosen(self._kernel_slots, n=n, m=m, cache=cache) as plan:  # which layers run a kernel
            self.begin_forward(plan, n=n, m=m, start=start, tokens=tokens, pad=pad)
            x = self.snap("embed", self.tok_embeddings.run(tokens))         # (B, n, C)
            for block in self.layers:
                x = block.run(x, (cos, sin), cache, start, pad)             # (B, n, C)
            x = self.norm.run(x)                                            # (B, n, C)
            logits = self.snap("logits", self.output.run(x))                # (B, n, V)
        self.snap_derived("probs", ag.softmax, logits, axis=-1)             # (B, n, V)
        if cache is not None:
            cache.start = m
        return logits

    def loss(self, tokens, targets, ignore_index: int = -100) -> Tensor:
        """Mean cross-entropy of next-token ``targets`` (B, n) given ``tokens`` (B, n); (n,) and (n,) also do."""
        logits = self(tokens)
        targets = np.asarray(targets.data if isinstance(targets, Tensor) else targets)
        if targets.ndim == 1 and logits.shape[0] == 1:                  # one row given without its batch axis
            targets = targets[None]
        return ag.cross_entropy(logits, targets, ignore_index)

    def num_params(self) -> int:
        """How many numbers the parameters hold (a tied head counts once, inside the embedding)."""
        return int(sum(p.data.size for p in self.parameters()))
