"""Held-out loss, perplexity and bits per byte.

:func:`evaluate` cuts the token stream of the held-out text into
non-overlapping windows: window i reads ids[iT : iT+T] and predicts
ids[iT+1 : iT+T+1] (the last window may be shorter), so every token but the
first is predicted exactly once, each from at most T tokens of context. Under
``no_grad``, in float64 log-softmax::

    loss        = nats / tokens            (mean nats per predicted token)
    perplexity  = exp(loss)
    bits/byte   = nats / (ln 2 * bytes)    bytes = UTF-8 bytes of the predicted tokens' text

Bits per byte divides by the length of the text rather than the number of
tokens, so models with different tokenizers can be compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..autograd import logsumexp_np, no_grad
from ..checks import ParameterError
from ..nn import Transformer

__all__ = ["EvalResult", "evaluate", "evaluate_text"]


@dataclass(frozen=True)
class EvalResult:
    """Held-out figures (see the module docstring for the exact definitions)."""

    loss: float           # nats per predicted token
    perplexity: float     # exp(loss)
    bits_per_byte: float  # nats / (ln 2 * bytes)
    nats: float           # summed over predicted tokens
    tokens: int           # predicted tokens
    bytes: int            # UTF-8 bytes of the predicted tokens' text
    windows: int

    def line(self) -> str:
        return (f"loss {self.loss:.4f}  perplexity {self.perplexity:.3f}  bits/byte {self.bits_per_byte:.4f}  "
                f"({_count(self.tokens, 'token')}, {_count(self.bytes, 'byte')}, {_count(self.windows, 'window')})")


def _count(n: int, noun: str) -> str:
    """``1 window``, ``996 windows``, ``254,915 tokens``."""
    return f"{n:,} {noun}{'s' * (n != 1)}"


def evaluate(model: Transformer, ids, tokenizer, seq_len: int = 256, batch_size: int = 16,
             max_windows: int | None = None) -> EvalResult:
    """Loss, perplexity and bits per byte of ``model`` on the token stream ``ids``.

    Non-overlapping windows of ``seq_len`` (see the module docstring); with
    ``max_windows`` only the first that many windows count (None or 0: all).
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or len(ids) < 2:
        raise ValueError(f"evaluation needs at least 2 tokens, got {len(ids) if ids.ndim == 1 else ids.shape}")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"evaluation needs integer token ids, got dtype {ids.dtype}")
    for name, value, low in (("seq_len", seq_len, 1), ("batch_size", batch_size, 1), ("max_windows", max_windows, 0)):
        if value is None and name == "max_windows":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ParameterError(name, f"must be an int >= {low}, got {value!r}")
    if seq_len > model.config.max_seq_len:
        raise ParameterError("seq_len", f"must be in [1, {model.config.max_seq_len}], got {seq_len}")
    n_windows = math.ceil((len(ids) - 1) / seq_len)
    if max_windows:
        n_windows = min(n_windows, int(max_windows))
    end = min(len(ids), n_windows * seq_len + 1)            # ids[:end] are read; ids[1:end] predicted
    full = (end - 1) // seq_len                              # windows of exactly seq_len
    starts = np.arange(full) * seq_len
    nats = 0.0
    with no_grad():
        for lo in range(0, full, batch_size):
            rows = starts[lo:lo + batch_size, None] + np.arange(seq_len + 1)   # (B, T+1)
            chunk = np.asarray(ids[rows], dtype=np.int64)
            nats += _nats(model, chunk[:, :-1], chunk[:, 1:])
        if full * seq_len + 1 < end:                                           # the short last window
            tail = np.asarray(ids[full * seq_len:end], dtype=np.int64)[None]   # (1, t+1)
            nats += _nats(model, tail[:, :-1], tail[:, 1:])
    if not math.isfinite(nats):
        raise ValueError(f"the model's loss on this text is {nats} (not finite): its numbers overflow; "
                         "check the model file (glassllm.train.find_non_finite names the first bad snapshot)")
    tokens = end - 1
    n_bytes = len(tokenizer.decode_bytes(np.asarray(ids[1:end], dtype=np.int64)))
    loss = nats / tokens
    perplexity = math.exp(loss) if loss < 709.0 else math.inf   # e^709 is near float64's largest number
    return EvalResult(loss=loss, perplexity=perplexity, bits_per_byte=nats / (math.log(2) * max(n_bytes, 1)),
                      nats=nats, tokens=int(tokens), bytes=int(n_bytes), windows=int(n_windows))


def _nats(model: Transformer, x: np.ndarray, y: np.ndarray) -> float:
    """Summed negative log-likelihood of targets ``y`` (B, T), in float64."""
    z = model(x).data.astype(np.float64)                                # (B, T, V)
    lse = logsumexp_np(z, axis=-1)                                      # (B, T)
    picked = np.take_along_axis(z, y[..., None], axis=-1)[..., 0]        # (B, T)
    return float((lse - picked).sum())


def evaluate_text(model: Transformer, tokenizer, text_or_paths, seq_len: int = 256,
                  batch_size: int = 16) -> EvalResult:
    """:func:`evaluate` on text (a str, a path, or a list of them) encoded with ``encode_corpus``."""
    return evaluate(model, tokenizer.encode_corpus(text_or_paths), tokenizer, seq_len, batch_size)
