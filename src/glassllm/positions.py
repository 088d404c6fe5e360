"""Where each token sits: the causal mask (with left padding) and the rotary positions.

Query i of a forward of n new tokens sits at absolute position ``start + i``
and may read keys 0 .. start + i (m = start + n keys in all). In a batch of
prompts of different lengths, row b is left-padded with ``pad[b]`` filler
tokens: no query may read them, and row b's own positions count from
``pad[b]``. The model (:mod:`glassllm.nn`) and every kernel that replaces its
attention take the mask and the positions from here, so the rule is written
once.

This module imports nothing from glassllm but :mod:`glassllm.checks`.
"""

from __future__ import annotations

import numpy as np

from .checks import is_int

__all__ = ["causal_mask", "positions", "check_fits"]


def check_fits(start: int, n: int, limit: int, what: str = "context length") -> None:
    """Refuse a forward of ``n`` new tokens after ``start`` that passes ``limit`` positions (the model's
    context, or a cache's capacity): one ValueError line naming both.

    >>> check_fits(0, 513, 512)
    Traceback (most recent call last):
    ValueError: sequence of 513 positions (start 0 + 513 new) exceeds the context length 512
    """
    if start + n > limit:
        raise ValueError(f"sequence of {start + n} positions (start {start} + {n} new) exceeds the {what} {limit}")


def causal_mask(n: int, m: int, start: int = 0, pad: np.ndarray | None = None) -> np.ndarray:
    """Forbidden positions for ``n`` new queries against ``m`` keys: (n, m) bool.

    Query i sits at absolute position ``start + i`` and may read keys
    0 .. start + i; entry (i, j) is True -- forbidden -- where ``j > start + i``.
    With ``pad`` (B,), the left padding of each row of a batch, the keys
    before ``pad[b]`` are forbidden too and the mask is (B, n, m).

    >>> causal_mask(2, 3, start=1).astype(int)
    array([[0, 0, 1],
           [0, 0, 0]])
    >>> causal_mask(2, 3, start=1, pad=np.array([0, 1])).astype(int)[1]
    array([[1, 0, 1],
           [1, 0, 0]])
    """
    for name, value in (("n", n), ("m", m), ("start", start)):
        if not is_int(value) or value < 0:
            raise ValueError(f"causal_mask: {name} must be an int >= 0, got {value!r}")
    mask = np.arange(m)[None, :] > (start + np.arange(n))[:, None]     # (n, m)
    if pad is not None:
        mask = mask | (np.arange(m) < np.asarray(pad)[:, None, None])  # (B, n, m)
    return mask


def positions(start: int, m: int, pad: np.ndarray | None = None) -> np.ndarray:
    """The rotary position of each new token: start .. m-1, (n,); with ``pad`` (B,), row b counts from
    ``pad[b]`` (its filler tokens sit at position 0): (B, n).

    >>> positions(2, 5, pad=np.array([0, 3]))
    array([[2, 3, 4],
           [0, 0, 1]])
    """
    if pad is None:
        return np.arange(start, m)                                     # (n,)
    return np.maximum(np.arange(start, m)[None, :] - np.asarray(pad)[:, None], 0)  # (B, n)
