"""From logits to the distribution a token is drawn from, and the draw itself.

Pure array functions, no model. The pipeline, in this order::

    logits (V,) --/T--> softmax over all V --top-k--> --top-p--> renormalise over survivors --> draw

- **Temperature** ``T``: the distribution is ``softmax(logits / T)`` over the
  whole vocabulary. ``T = 1`` is the model's own distribution, ``T < 1``
  sharpens it, ``T > 1`` flattens it. ``T = 0`` means *greedy*: all mass on the
  arg-max (the lowest id among equal maxima). ``T`` must be a finite number >= 0.
- **Top-k** (``None`` = off; else an int in [1, V]): only ids whose logit is at
  least the k-th largest logit survive. Ids tied with the k-th logit all
  survive, so more than k ids can survive a tie (Hugging Face's rule).
- **Top-p** (``None`` = off; else a number in (0, 1]): applied *after* top-k, to
  the top-k survivors' distribution renormalised over those survivors. Ids are
  ranked by probability (ties: lower id first) and an id survives when the
  probability of the ids ranked above it is < p -- the smallest prefix whose
  mass reaches p. The most likely id always survives; ``p = 1`` keeps everything.
- **The distribution sampled from** is ``softmax(logits / T)`` restricted to the
  ids that survive both filters and renormalised over the survivors only.
  Filtered-out ("forbidden") ids get probability exactly 0 and are never
  drawn; they take no part in any normalisation.

All arithmetic is float64, whatever the dtype of the logits.

>>> sampling_distribution(np.array([2.0, 1.0, 0.0, -1.0]), temperature=1.0, top_k=2).round(4)
array([0.7311, 0.2689, 0.    , 0.    ])
>>> sampling_distribution(np.array([2.0, 1.0, 0.0, -1.0]), temperature=0).tolist()
[1.0, 0.0, 0.0, 0.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .autograd import softmax_np
from .checks import ParameterError, ParameterTypeError, check_int, is_int, is_number

__all__ = [
    "ParameterError", "ParameterTypeError", "SamplingConfig", "check_temperature", "check_top_k", "check_top_p",
    "sampling_distribution", "sample", "model_probs",
]


def check_temperature(temperature, name: str = "temperature") -> float:
    """``temperature`` as a float; raise unless it is a finite number >= 0. ``name`` is what errors call it."""
    if not is_number(temperature):
        raise ParameterTypeError(name, f"must be a number >= 0, got {temperature!r}")
    t = float(temperature)
    if not math.isfinite(t) or t < 0:
        raise ParameterError(name, f"must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    return t


def check_top_k(top_k, vocab_size: int, name: str = "top_k") -> int | None:
    """``top_k`` as an int (or None = off); raise unless it is in [1, vocab_size].

    ``name`` is what errors call it. The error's ``problem`` (what a command line shows) leaves out
    "or None": an option left out is its None.
    """
    if top_k is None:
        return None
    if not is_int(top_k):
        raise ParameterTypeError(name, f"must be an int in [1, {vocab_size}], got {top_k!r}",
                                 api_problem=f"must be an int in [1, {vocab_size}] or None, got {top_k!r}")
    if not 1 <= top_k <= vocab_size:
        raise ParameterError(name, f"must be in [1, {vocab_size}] (the vocabulary), got {top_k!r}",
                             api_problem=f"must be in [1, {vocab_size}] (the vocabulary) or None, got {top_k!r}")
    return int(top_k)


def check_top_p(top_p, name: str = "top_p") -> float | None:
    """``top_p`` as a float (or None = off); raise unless it is in (0, 1]. ``name`` as in :func:`check_top_k`."""
    if top_p is None:
        return None
    if not is_number(top_p):
        raise ParameterTypeError(name, f"must be a number in (0, 1], got {top_p!r}",
                                 api_problem=f"must be a number in (0, 1] or None, got {top_p!r}")
    p = float(top_p)
    if not (0.0 < p <= 1.0):  # also false for NaN
        raise ParameterError(name, f"must be in (0, 1], got {top_p!r}",
                             api_problem=f"must be in (0, 1] or None, got {top_p!r}")
    return p


@dataclass(frozen=True)
class SamplingConfig:
    """Validated sampling parameters; ``top_k`` is checked against ``vocab_size``.

    >>> SamplingConfig(temperature=0.8, top_k=40, vocab_size=1024).greedy
    False
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    vocab_size: int = 1024

    def __post_init__(self):
        if not is_int(self.vocab_size) or self.vocab_size < 1:
            raise ParameterError("vocab_size", f"must be an int >= 1, got {self.vocab_size!r}")
        object.__setattr__(self, "temperature", check_temperature(self.temperature))
        object.__setattr__(self, "top_k", check_top_k(self.top_k, self.vocab_size))
        object.__setattr__(self, "top_p", check_top_p(self.top_p))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def distribution(self, logits) -> np.ndarray:
        return sampling_distribution(logits, self.temperature, self.top_k, self.top_p)


def _check_logits(logits) -> tuple[np.ndarray, np.ndarray]:
    """Logits as a new float64 array (B, V) or (V,), and each row's maximum; ValueError if unusable.

    One maximum catches every broken row: it is NaN if the row has a NaN, +inf
    if it has a +inf, and -inf if every entry is -inf (no id can be drawn).
    """
    z = np.asarray(logits)
    if z.dtype.kind not in "fiu" or z.ndim not in (1, 2) or z.shape[-1] == 0:
        raise ValueError(f"logits must be a non-empty (V,) or (B, V) array of numbers, "
                         f"got shape {z.shape} dtype {z.dtype}")
    z = z.astype(np.float64)
    peak = z.max(axis=-1, keepdims=True)
    if not np.isfinite(peak).all():
        if np.isnan(peak).any() or np.isposinf(peak).any():
            raise ValueError("logits contain NaN or +inf: the model's output is broken")
        raise ValueError("logits are -inf for every id: no token can be drawn")
    return z, peak


def model_probs(logits) -> np.ndarray:
    """The model's own next-token distribution ``softmax(logits)`` (T = 1, no filters), float64."""
    z, _ = _check_logits(logits)                                       # float64
    return softmax_np(z, axis=-1)                                      # (..., V)


def sampling_distribution(logits, temperature: float = 1.0, top_k: int | None = None,
                          top_p: float | None = None) -> np.ndarray:
    """The distribution actually sampled from, for logits (V,) or (B, V): same shape, float64.

    Temperature, then top-k, then top-p, as the module docstring states. Rows
    sum to 1; filtered-out ids are exactly 0.
    """
    z, peak = _check_logits(logits)
    squeeze = z.ndim == 1
    if squeeze:
        z, peak = z[None], peak[None]                                    # (B, V), (B, 1)
    V = z.shape[-1]
    t = check_temperature(temperature)
    k = check_top_k(top_k, V)
    p_top = check_top_p(top_p)

    if t == 0.0:
        # Greedy: a point mass on the first arg-max. Every filter keeps that id.
        out = np.zeros_like(z)
        out[np.arange(len(z)), z.argmax(axis=-1)] = 1.0
        return out[0] if squeeze else out

    # 1. softmax(logits / T) over the whole vocabulary. (z - peak) <= 0, so a tiny
    #    T can only overflow toward -inf, and exp(-inf) = 0: the arg-max keeps all the mass.
    with np.errstate(over="ignore"):
        probs = softmax_np((z - peak) / t, axis=-1)                      # (B, V)
    keep = probs > 0                                                     # (B, V)

    # 2. Top-k on the logits (the order does not depend on T): ties with the k-th survive.
    if k is not None and k < V:
        kth = np.partition(z, V - k, axis=-1)[:, V - k : V - k + 1]       # (B, 1)
        keep &= z >= kth

    # 3. Top-p on the top-k survivors, renormalised over them, one row at a time.
    if p_top is not None and p_top < 1.0:
        for b in range(len(z)):
            ids = np.flatnonzero(keep[b])                                # survivors, ascending ids
            q = probs[b, ids] / probs[b, ids].sum()                      # renormalised over them
            order = np.argsort(-q, kind="stable")                        # most likely first; ties: lower id
            ranked = q[order]
            above = np.concatenate(([0.0], np.cumsum(ranked)[:-1]))     # mass ranked above each id
            # A mass that reaches p up to rounding counts as reaching it: ten ids of 0.1 sum to
            # 0.7999999999999999 after eight, and top_p = 0.8 means those eight.
            cut = above >= p_top - 1e-12
            cut[0] = False                                               # the top id always stays, even for
            keep[b, ids[order[cut]]] = False                             # a top_p below the tolerance

    # 4. Restrict to the survivors and renormalise over them only.
    out = np.where(keep, probs, 0.0)
    out /= out.sum(axis=-1, keepdims=True)
    return out[0] if squeeze else out


def sample(probs, rng: np.random.Generator, size: int | None = None) -> np.ndarray | int:
    """Draw ids from ``probs`` by inverting the cumulative distribution.

    probs (V,): one id (an int), or ``size`` ids (an array) when ``size`` is given.
    probs (B, V): one id per row, (B,). One uniform number is used per draw, so
    the stream of draws depends only on the generator's state. An id with
    probability 0 is never drawn. ``probs`` need not sum to 1, but must be
    >= 0 with a finite, positive sum (ValueError otherwise: a NaN is never drawn from).
    """
    if not isinstance(rng, np.random.Generator):
        raise ParameterTypeError("rng", f"must be a numpy.random.Generator, got {type(rng).__name__}")
    try:
        probs = np.asarray(probs, dtype=np.float64)
    except (TypeError, ValueError):
        raise ParameterTypeError("probs", f"must be an array of numbers, got {type(probs).__name__}") from None
    if probs.ndim not in (1, 2) or probs.shape[-1] == 0:
        raise ValueError(f"probs must be a (V,) or (B, V) array, got shape {probs.shape}")
    if probs.ndim == 2 and size is not None:
        raise ValueError("size is only for a single (V,) distribution")
    size = check_int("size", size, low=0, none=True)
    cdf = np.cumsum(probs, axis=-1)                                      # (..., V)
    total = cdf[..., -1]
    if not (np.isfinite(total).all() and (total > 0).all()) or probs.min() < 0:  # NaN fails every test
        raise ValueError(f"probs must be numbers >= 0 with a finite, positive sum (a distribution); "
                         f"got sum {float(np.min(total)) if np.isfinite(total).all() else 'nan or inf'}, "
                         f"smallest entry {float(np.nanmin(probs)) if not np.isnan(probs).all() else 'nan'}")
    # side="right" finds i with cdf[i-1] <= u < cdf[i], so p[i] > 0. Only a u
    # that rounds up to the total can run off the end: it goes to the last
    # id with positive mass.
    if probs.ndim == 1:
        u = rng.random(size) * cdf[-1]
        ids = np.searchsorted(cdf, u, side="right")
        if np.any(ids >= len(probs)):
            ids = np.minimum(ids, np.flatnonzero(probs > 0)[-1])
        return int(ids) if size is None else ids.astype(np.int64)
    u = rng.random(len(probs)) * cdf[:, -1]                              # (B,)
    return np.array([int(_sample_row(c, x, p)) for c, x, p in zip(cdf, u, probs)], dtype=np.int64)


def _sample_row(cdf: np.ndarray, u: float, probs: np.ndarray) -> int:
    i = int(np.searchsorted(cdf, u, side="right"))
    return i if i < len(cdf) else int(np.flatnonzero(probs > 0)[-1])
