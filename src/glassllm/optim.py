"""AdamW, its learning-rate schedule, and gradient clipping by global norm.

All three are plain NumPy over the ``.data`` and ``.grad`` arrays of
:class:`~glassllm.autograd.Tensor` parameters. They follow PyTorch's
definitions (``torch.optim.AdamW``, ``LambdaLR`` with :func:`lr_lambda`,
``torch.nn.utils.clip_grad_norm_``) so that a PyTorch twin can be trained
step for step against them (``tests/test_optim.py``).

AdamW, for one parameter p with gradient g at step t = 1, 2, ...::

    p <- p * (1 - lr * wd)                 # decoupled weight decay (Loshchilov & Hutter)
    m <- b1 * m + (1 - b1) * g             # first moment
    v <- b2 * v + (1 - b2) * g**2          # second moment
    p <- p - lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)

Weight decay is applied to the weight *matrices* only -- every parameter with
two or more axes: the attention and MLP projections, the token embedding and
the output head. Vectors (the RMSNorm gains) are not decayed: shrinking a gain
towards zero would shrink the whole normalised signal, which is not the
regulariser we want. :func:`decay_mask` states the rule in one place.

Schedule (:func:`lr_at`), for the 0-based optimiser step s::

    s <  warmup:  lr = peak * (s + 1) / warmup                 (linear warm-up)
    s >= warmup:  lr = min + (peak - min) * (1 + cos(pi * q)) / 2,
                  q = (s - warmup) / max(1, total - warmup)     (cosine decay)

Clipping (:func:`clip_grad_norm`): with N the L2 norm of all gradients
concatenated, every gradient is multiplied by ``min(1, max_norm / (N + 1e-6))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .checks import is_int
from .autograd import Tensor

__all__ = ["AdamW", "decay_mask", "lr_at", "lr_lambda", "check_lr", "clip_grad_norm", "global_norm"]


def decay_mask(named_params) -> dict[str, bool]:
    """Which parameters get weight decay: those with >= 2 axes (matrices), not norms.

    >>> from glassllm.nn import Transformer
    >>> from glassllm.config import ModelConfig
    >>> mask = decay_mask(Transformer(ModelConfig(n_layers=1)).named_parameters())
    >>> mask["layers.0.attention.wq.weight"], mask["layers.0.attention_norm.weight"]
    (True, False)
    """
    return {name: p.data.ndim >= 2 for name, p in named_params}


def lr_at(step: int, peak: float, warmup: int, total: int, min_lr: float = 0.0) -> float:
    """Learning rate at 0-based optimiser step ``step`` (see the module docstring).

    >>> [round(lr_at(s, 1.0, warmup=2, total=4), 3) for s in range(5)]
    [0.5, 1.0, 1.0, 0.5, 0.0]
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    q = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + (peak - min_lr) * 0.5 * (1.0 + math.cos(math.pi * q))


def lr_lambda(peak: float, warmup: int, total: int, min_lr: float = 0.0):
    """The schedule as a multiplier of ``peak``, the form ``torch.optim.lr_scheduler.LambdaLR`` takes."""
    return lambda step: lr_at(step, peak, warmup, total, min_lr) / peak


def check_lr(lr, what: str = "AdamW lr") -> float:
    """``lr`` as a float if it is a finite number >= 0; a ValueError naming ``what`` otherwise."""
    if isinstance(lr, bool) or not isinstance(lr, (int, float, np.floating, np.integer)) \
            or not math.isfinite(lr) or lr < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {lr!r}")
    return float(lr)


def global_norm(params) -> float:
    """L2 norm of all gradients together (parameters without a gradient count as zero)."""
    grads = [p.grad.ravel() for p in params if p.grad is not None]
    with np.errstate(over="ignore", invalid="ignore"):
        total = math.fsum(float(np.dot(g, g)) for g in grads)  # per tensor in its own dtype, as PyTorch does
    if not math.isfinite(total):
        # A float32 sum of squares overflows past ~1.8e38 (gradients ~1e19) although every
        # gradient is finite: redo it in float64, so only a real inf or NaN gives a non-finite norm.
        total = math.fsum(float(g @ g) for g in (g.astype(np.float64) for g in grads))
    return math.sqrt(total)


def clip_grad_norm(params, max_norm: float, norm: float | None = None) -> float:
    """Scale all gradients so their global L2 norm is at most ``max_norm`` (each ``.grad`` is replaced).

    Returns the norm *before* clipping. As in PyTorch, the factor is
    ``min(1, max_norm / (norm + 1e-6))``; a NaN or infinite norm makes it NaN or 0, and the
    gradients with it, as PyTorch's does (the training loop stops on a non-finite norm first).
    ``norm``: the gradients' :func:`global_norm`, when the caller has it already.
    """
    params = list(params)
    norm = global_norm(params) if norm is None else norm
    coef = max_norm / (norm + 1e-6)
    coef = coef if math.isnan(coef) else min(1.0, coef)                  # min(1, nan) would be 1
    if not coef >= 1.0:
        for p in params:
            if p.grad is not None:
                p.grad = p.grad * np.asarray(coef, dtype=p.grad.dtype)
    return norm


class AdamW:
    """AdamW over named parameters (``model.named_parameters()``).

    ``lr`` is set by the caller before each :meth:`step` (the training loop
    writes ``lr_at(...)`` into it). The state -- the step count ``t`` and the
    moments ``m``, ``v`` (same names, shapes and dtype as the parameters) --
    round-trips through :meth:`state_dict` / :meth:`load_state_dict` exactly.

    A parameter whose ``.grad`` is None is left untouched by a step, but the
    step count ``t`` is shared by all parameters (PyTorch counts per
    parameter); in training every parameter gets a gradient every step, where
    the two agree.
    """

    def __init__(self, named_params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.1):
        if isinstance(named_params, Mapping):                           # {name: parameter}, e.g. dict(...)
            named_params = named_params.items()
        named_params = list(named_params)
        if any(isinstance(p, Tensor) for p in named_params):
            raise TypeError("AdamW takes (name, parameter) pairs: pass model.named_parameters(), "
                            "not model.parameters()")
        self.params: dict[str, Tensor] = dict(named_params)
        if not self.params:
            raise ValueError("AdamW got no parameters to optimise")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"AdamW betas must be two numbers (beta1, beta2), got {betas!r}")
        check_lr(lr)
        b1, b2 = betas
        for name, value in (("beta1", b1), ("beta2", b2)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"AdamW {name} must be in [0, 1), got {value!r}")
        if not eps > 0:
            raise ValueError(f"AdamW eps must be > 0, got {eps!r}")
        if not weight_decay >= 0:
            raise ValueError(f"AdamW weight_decay must be >= 0, got {weight_decay!r}")
        self.lr, self.beta1, self.beta2 = float(lr), float(b1), float(b2)
        self.eps, self.weight_decay = float(eps), float(weight_decay)
        self.decay = decay_mask(self.params.items())
        self.t = 0
        self.m = {k: np.zeros_like(p.data) for k, p in self.params.items()}
        self.v = {k: np.zeros_like(p.data) for k, p in self.params.items()}

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        self.t += 1
        lr, b1, b2 = self.lr, self.beta1, self.beta2
        bc1 = 1.0 - b1 ** self.t
        bc2_sqrt = math.sqrt(1.0 - b2 ** self.t)
        scratch = {}  # one work buffer per dtype, as large as the largest parameter: no allocation per tensor
        for name, p in self.params.items():
            g = p.grad
            if g is None:
                continue
            if g.shape != p.data.shape:
                raise ValueError(f"AdamW: the gradient of {name!r} has shape {g.shape}, the parameter {p.data.shape}")
            dt = p.data.dtype
            m, v = self.m[name], self.v[name]
            if dt not in scratch:
                scratch[dt] = np.empty(max(q.data.size for q in self.params.values()), dtype=dt)
            t = scratch[dt][: p.data.size].reshape(p.data.shape)
            if self.decay[name] and self.weight_decay:
                p.data *= dt.type(1.0 - lr * self.weight_decay)
            np.subtract(g, m, out=t)                     # m <- m + (1 - b1)(g - m), PyTorch's lerp
            t *= dt.type(1.0 - b1)
            m += t
            v *= dt.type(b2)                             # v <- b2 v + (1 - b2) g^2
            np.multiply(g, g, out=t)
            t *= dt.type(1.0 - b2)
            v += t
            np.sqrt(v, out=t)                            # denominator sqrt(v) / sqrt(1 - b2^t) + eps
            t /= dt.type(bc2_sqrt)
            t += dt.type(self.eps)
            np.divide(m, t, out=t)
            t *= dt.type(lr / bc1)
            p.data -= t

    # -- state ------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{"t": int, "m": {name: array}, "v": {name: array}}`` (arrays are the live buffers)."""
        return {"t": self.t, "m": self.m, "v": self.v}

    def load_state_dict(self, state: dict) -> None:
        t = state.get("t")
        if not is_int(t) or t < 0:
            raise ValueError(f"optimiser state step must be an int >= 0, got {t!r}")
        for key in ("m", "v"):
            arrays = state.get(key, {})
            for name, p in self.params.items():
                if name not in arrays:
                    raise ValueError(f"optimiser state is missing {key}[{name!r}]")
                if arrays[name].shape != p.data.shape:
                    raise ValueError(f"optimiser state {key}[{name!r}] has shape {arrays[name].shape}, "
                                     f"expected {p.data.shape}")
        self.t = int(t)
        self.m = {k: np.array(state["m"][k], dtype=p.data.dtype) for k, p in self.params.items()}
        self.v = {k: np.array(state["v"][k], dtype=p.data.dtype) for k, p in self.params.items()}
