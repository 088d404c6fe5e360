"""Training from scratch on a CPU, evaluation, checkpoints and exact resume.

The loop, one optimiser step at a time (:func:`train_step`)::

    for each of grad_accum micro-batches (B random windows of T tokens):
        loss_i = mean cross-entropy;  backward(loss_i / grad_accum)
    loss = mean of the loss_i;  stop if it or any gradient is not finite, naming the
        first non-finite snapshot (a traced re-run of the batch: find_non_finite)
    clip the gradients to global L2 norm grad_clip (0 = no clipping)
    AdamW step with lr = lr_at(step) (linear warm-up, then cosine decay)

Everything that decides the numbers is in a frozen :class:`TrainConfig` (plus
the :class:`~glassllm.config.ModelConfig`); the ``glassllm train`` options map
onto their fields one to one.

The run folder (``--out DIR``)::

    train_state.safetensors   weights, AdamW moments (``param/``, ``adam_m/``, ``adam_v/`` + name),
                              and metadata: step, both configs, tokenizer, the data sampler's
                              RNG state, data file hashes, the loss history
    model.safetensors         the inference file (checkpoint.save_model) + run metadata
    tokenizer.json            the tokenizer (trained on --data unless --tokenizer is given)
    loss.csv, loss.png        the loss curve
    cache/                    token ids, uint16, memory-mapped (unless --cache-dir)

Resuming reads ``train_state.safetensors`` only: it is one file, written
atomically, so weights, moments and data position always belong to the same
step. ``model.safetensors`` is exported from it afterwards; a kill between the
two writes leaves an inference file one checkpoint behind, never a mismatched
pair. ``--resume`` continues bit-identically: same weights, moments, step and
generator state give the same next batch and the same update.

Evaluation (:func:`evaluate`) cuts the token stream of the held-out text into
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

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .autograd import no_grad
from .checkpoint import atomic_path, atomic_write, make_folder, save_model
from .config import JsonConfig, ModelConfig
from .data import (REPEAT_TOKENS, WindowSampler, expand_paths, hub_source, resolve_sources, text_sha256s,
                   token_ids)
from .nn import Transformer
from .optim import AdamW, check_lr, clip_grad_norm, global_norm, lr_at
from .timeline import SAMPLE, SAMPLE_PROMPT, Timeline, load_timeline

__all__ = ["TrainConfig", "EvalResult", "Trainer", "train_step", "find_non_finite", "NonFinite",
           "evaluate", "evaluate_text",
           "STATE_FORMAT", "STATE_VERSION", "add_cli"]

RUN_FILES = ("train_state.safetensors", "model.safetensors", "tokenizer.json", "loss.csv", "loss.png",
             "timeline.safetensors")
STATE_FORMAT = "glassllm-train-state"
STATE_VERSION = "1"
_DTYPES = {"float32": np.float32, "float64": np.float64}


# ----------------------------------------------------------------------------
# The configuration
# ----------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainConfig(JsonConfig):
    """Every number that decides a training run.

    The defaults are a plain run: every window is text, 256 tokens long. The
    bundled model's recipe changes some of them; it is :data:`RECIPES` ``["bundled"]``
    (``glassllm train --recipe bundled``).

    >>> TrainConfig().tokens_per_step
    4096
    """

    KIND = "train config"

    steps: int = 1500            # optimiser steps
    batch_size: int = 16         # windows per micro-batch (B)
    seq_len: int = 256           # tokens per window (T)
    grad_accum: int = 1          # micro-batches per optimiser step
    lr: float = 3e-3             # peak learning rate, reached after warm-up
    min_lr: float = 3e-4         # learning rate at the end of the cosine decay
    warmup_steps: int = -1       # linear warm-up from lr/warmup_steps to lr; -1: a tenth of steps, at most 100
    weight_decay: float = 0.1    # decoupled, on weight matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0       # max global gradient norm; 0 = no clipping
    repeat_fraction: float = 0.0 # share of windows that are one span of tokens, repeated
    repeat_tokens: str = "text"  # the span: "text" (a piece of the data) or "random" (tokens drawn from it)
    short_steps: int = 0         # sequence-length warm-up: the first steps train on shorter windows ...
    short_seq_len: int = 64      # ... of this many tokens, batch_size * seq_len / short_seq_len of them
    short_repeat_fraction: float = -1.0  # repeat_fraction during those first steps; -1: the same as repeat_fraction
    seed: int = 1337             # model init and batch sampling
    workers: int = 1             # threads, each back-propagating a share of every batch's rows (1 BLAS thread each)
    dtype: str = "float32"       # float32 or float64
    eval_every: int = 250        # steps between held-out evaluations; 0 = only at the end
    eval_windows: int = 64       # windows of the held-out text per periodic evaluation; 0 = all
    checkpoint_every: int = 100  # steps between checkpoints; 0 = only at the end
    timeline_points: int = 40    # log-spaced steps at which the probe prompt is recorded (glassllm.timeline); 0 = off

    def __post_init__(self):
        ints = {"steps": 1, "batch_size": 1, "seq_len": 1, "grad_accum": 1, "warmup_steps": -1,
                "short_steps": 0, "short_seq_len": 1, "workers": 1,
                "seed": 0, "eval_every": 0, "eval_windows": 0, "checkpoint_every": 0, "timeline_points": 0}
        for name, low in ints.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"TrainConfig.{name} must be an int, got {value!r}")
            if value < low:
                raise ValueError(f"TrainConfig.{name} must be >= {low}, got {value}")
        for name in ("lr", "min_lr", "weight_decay", "beta1", "beta2", "eps", "grad_clip", "repeat_fraction",
                     "short_repeat_fraction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TypeError(f"TrainConfig.{name} must be a finite number, got {value!r}")
        if not self.lr > 0:
            raise ValueError(f"TrainConfig.lr must be > 0, got {self.lr}")
        if not math.isfinite(self.lr * (self.warmup + 1)):                # lr_at's warm-up multiplies first
            raise ValueError(f"TrainConfig.lr={self.lr} is too large: the learning-rate schedule overflows")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"TrainConfig.min_lr must be in [0, lr={self.lr}], got {self.min_lr}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0:
            raise ValueError(f"TrainConfig.eps must be > 0, got {self.eps}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            bad = "weight_decay" if self.weight_decay < 0 else "grad_clip"
            raise ValueError(f"TrainConfig.{bad} must be >= 0, got {getattr(self, bad)}")
        if not 0 <= self.repeat_fraction <= 1:
            raise ValueError(f"TrainConfig.repeat_fraction must be in [0, 1], got {self.repeat_fraction}")
        if not (0 <= self.short_repeat_fraction <= 1 or self.short_repeat_fraction == -1):
            raise ValueError(f"TrainConfig.short_repeat_fraction must be in [0, 1] (or -1: the same as "
                             f"repeat_fraction), got {self.short_repeat_fraction}")
        if self.repeat_tokens not in REPEAT_TOKENS:
            raise ValueError(f"TrainConfig.repeat_tokens must be one of {', '.join(REPEAT_TOKENS)}, "
                             f"got {self.repeat_tokens!r}")
        if self.short_steps and not (self.short_seq_len < self.seq_len
                                     and self.batch_size * self.seq_len % self.short_seq_len == 0):
            raise ValueError(f"TrainConfig.short_seq_len must be below seq_len={self.seq_len} and divide "
                             f"batch_size * seq_len = {self.batch_size * self.seq_len}, got {self.short_seq_len}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"TrainConfig.dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len * self.grad_accum

    @property
    def warmup(self) -> int:
        """Warm-up steps in effect: ``warmup_steps``, or for -1 a tenth of the run, at most 100.

        >>> TrainConfig().warmup, TrainConfig(steps=100).warmup, TrainConfig(steps=100, warmup_steps=50).warmup
        (100, 10, 50)
        """
        return self.warmup_steps if self.warmup_steps >= 0 else min(100, self.steps // 10)

    def repeat_at(self, step: int) -> float:
        """Share of repeated-span windows at 0-based step ``step``.

        >>> c = TrainConfig(repeat_fraction=0.1, short_steps=10, short_repeat_fraction=0.5)
        >>> c.repeat_at(9), c.repeat_at(10)
        (0.5, 0.1)
        """
        if step < self.short_steps and self.short_repeat_fraction >= 0:
            return self.short_repeat_fraction
        return self.repeat_fraction

    def lr_at(self, step: int) -> float:
        """Learning rate of 0-based optimiser step ``step``."""
        return lr_at(step, self.lr, self.warmup, self.steps, self.min_lr)

    def window_shape(self, step: int) -> tuple[int, int]:
        """(windows, tokens per window) of each micro-batch of 0-based step ``step``.

        The first ``short_steps`` steps train on short windows, as many more of
        them as keeps the tokens per step the same (sequence-length warm-up).

        >>> TrainConfig(short_steps=10, short_seq_len=64).window_shape(0)
        (64, 64)
        >>> TrainConfig(short_steps=10, short_seq_len=64).window_shape(10)
        (16, 256)
        """
        if step < self.short_steps:
            return self.batch_size * self.seq_len // self.short_seq_len, self.short_seq_len
        return self.batch_size, self.seq_len


# The bundled model (src/glassllm/assets/tinystories.safetensors) was trained with
# RECIPES["bundled"]: eight times the default steps; the first 1,000 steps on 32-token
# windows, half of them one random span repeated (so copying pays, and from short
# windows the model learns it within a few hundred steps: induction heads); after that
# full windows, 15% of them repeated spans, so that copying stays useful
# (DEVELOPING.md lists the runs).
RECIPES = {
    "default": TrainConfig(),
    "bundled": TrainConfig(steps=12000, repeat_fraction=0.15, short_repeat_fraction=0.5, repeat_tokens="random",
                           short_steps=1000, short_seq_len=32, eval_every=500),
    # A classroom run: a few minutes on a laptop, already story-shaped text.
    "class": TrainConfig(steps=800, batch_size=16, seq_len=128, lr=4e-3, eval_every=200, checkpoint_every=100,
                         timeline_points=24, workers=2),
}


# ----------------------------------------------------------------------------
# One optimiser step
# ----------------------------------------------------------------------------

class GradientThreads:
    """Data parallelism on threads: ``n`` copies of the model that share its weights.

    :meth:`backward` cuts a micro-batch's rows into ``n`` shares; each copy runs
    the forward and backward of one share in its own thread (NumPy and BLAS
    release the GIL in their loops, so the threads run at once), and the copies'
    gradients are summed into the model's. Each share's loss is weighted by its
    share of the rows, so the sum is the gradient of the whole micro-batch's mean
    loss -- equal up to float rounding, since the sums are grouped differently.
    The copies hold no weights of their own: their parameters' ``.data`` are the
    model's arrays, re-linked before every use (so an optimiser that updates
    in place, or a ``load_state_dict``, is always seen). BLAS should run one
    thread per worker (the trainer sets that).
    """

    def __init__(self, model: Transformer, n: int):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"workers must be an int >= 1, got {n!r}")
        from concurrent.futures import ThreadPoolExecutor

        self.model, self.n = model, n
        dtype = model.tok_embeddings.weight.dtype
        self.copies = [model] + [Transformer(model.config, seed=0, dtype=dtype) for _ in range(n - 1)]
        self.pool = ThreadPoolExecutor(n - 1, thread_name_prefix="glassllm-grad") if n > 1 else None

    def backward(self, x: np.ndarray, y: np.ndarray, scale: float = 1.0) -> float:
        """Accumulate ``scale * d mean_loss(x, y)`` into the model's ``.grad``; return the mean loss."""
        shares = [rows for rows in np.array_split(np.arange(len(x)), self.n) if len(rows)]
        params = self.model.parameters()
        for copy in self.copies[1:len(shares)]:
            for p, q in zip(params, copy.parameters()):
                q.data, q.grad = p.data, None

        # A share's loss is the mean over its counted targets (not -100): weighting it by its share of
        # all counted targets makes the sum the mean over the whole batch, as one forward would give.
        counted = np.asarray(y) != -100
        total_counted = max(int(counted.sum()), 1)

        def run(copy, rows):
            loss = copy.loss(x[rows], y[rows])
            weight = int(counted[rows].sum()) / total_counted
            (loss * (scale * weight)).backward()
            return float(loss.data) * weight

        futures = [self.pool.submit(run, copy, rows) for copy, rows in zip(self.copies[1:], shares[1:])]
        total = run(self.model, shares[0])                               # the calling thread takes share 0
        total += sum(f.result() for f in futures)
        for copy in self.copies[1:len(shares)]:
            for p, q in zip(params, copy.parameters()):
                if q.grad is not None:
                    p.grad = q.grad if p.grad is None else p.grad + q.grad
                    q.grad = None
        return total

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def train_step(model: Transformer, optimizer: AdamW, batches, lr: float, grad_clip: float,
               step: int = 0, threads: GradientThreads | None = None) -> tuple[float, float]:
    """One AdamW step over the micro-batches ``[(x, y), ...]`` (each (B, T) ints).

    Gradients of the micro-batches are averaged (each loss is scaled by
    1/len(batches) before its backward). With ``threads``, a
    :class:`GradientThreads` of the model, each micro-batch's rows are shared out
    among its threads. Returns ``(mean loss, gradient norm before clipping)``.

    A non-finite loss or gradient stops the step before any weight changes,
    with one ``ValueError`` line naming ``step``, the first parameter whose
    gradient is not finite, and what :func:`find_non_finite` traced: the first
    snapshot that is not finite in forward order, and the first snapshot
    gradient that is not finite in backward order.
    """
    if not batches:
        raise ValueError("train_step needs at least one micro-batch [(x, y), ...], got none")
    check_lr(lr, f"step {step}: the learning rate")
    optimizer.zero_grad()
    scale = 1.0 / len(batches)
    total = 0.0
    for x, y in batches:
        if threads is not None:
            value = threads.backward(x, y, scale)                         # forward and backward, shared out
        else:
            loss = model.loss(x, y)
            value = float(loss.data)
            if math.isfinite(value):
                (loss if len(batches) == 1 else loss * scale).backward()
        if not math.isfinite(value):                                     # before any weight changes
            raise ValueError(f"step {step}: the loss is {value} (not finite); "
                             f"{_diagnosis(model, batches)}; lower --lr or check the data")
        total += value
    params = list(optimizer.params.values())
    norm = global_norm(params)
    if not math.isfinite(norm):                                          # named before clipping spreads it
        bad = next(name for name, p in optimizer.params.items()
                   if p.grad is not None and not np.all(np.isfinite(p.grad)))
        raise ValueError(f"step {step}: non-finite gradient in {bad}; {_diagnosis(model, batches)}; "
                         "lower --lr or --grad-clip")
    if grad_clip > 0:
        clip_grad_norm(params, grad_clip, norm)
    optimizer.lr = lr
    optimizer.step()
    return total * scale, norm


@dataclass(frozen=True)
class NonFinite:
    """Where a traced forward and backward first stop being finite (see :func:`find_non_finite`).

    ``batch``: which micro-batch; ``row``: which of its rows. ``value``: the
    first snapshot (forward order) with a NaN or infinity, or None.
    ``grad``: the first snapshot gradient (backward order: ``probs``,
    ``logits``, ... down to ``embed``) with one, or None.
    """

    batch: int
    row: int
    value: str | None
    grad: str | None

    def line(self) -> str:
        where = f"row {self.row} of micro-batch {self.batch}"
        parts = [f"first non-finite snapshot {self.value} (forward order)" if self.value else
                 "every snapshot finite",
                 f"first non-finite gradient {self.grad} (backward order)" if self.grad else
                 "every snapshot gradient finite"]
        return f"traced {where}: {', '.join(parts)}"


def find_non_finite(model: Transformer, batches) -> NonFinite | None:
    """Re-run micro-batches ``[(x, y), ...]`` under a :class:`~glassllm.trace.Tracer`, with gradients.

    Rows are traced one at a time (a tracer keeps one batch row; rows do not
    interact) until one has a snapshot or a snapshot gradient that is not
    finite. Returns None if every snapshot and gradient of every row is
    finite: then the non-finite number arises in a parameter's own gradient.
    The model's parameters and their ``.grad`` are left as they were.
    """
    from .trace import trace

    for i, (x, y) in enumerate(batches):
        x, y = np.atleast_2d(np.asarray(x)), np.atleast_2d(np.asarray(y))   # (B, T)
        for b in range(len(x)):
            with np.errstate(all="ignore"):
                t = trace(model, x[b], targets=y[b])
            step = t.steps[0]
            order = t.names()                                                 # forward order
            value = next((k for k in order if not np.isfinite(step.values[k]).all()), None)
            grad = next((k for k in reversed(order) if k in step.grads
                         and not np.isfinite(step.grads[k]).all()), None)
            if value or grad:
                return NonFinite(i, b, value, grad)
    return None


def _diagnosis(model: Transformer, batches) -> str:
    found = find_non_finite(model, batches)
    if found is None:
        return ("traced again, every snapshot and snapshot gradient is finite: "
                "the non-finite number arises in a parameter's own gradient")
    return found.line()


# ----------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------

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
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if seq_len > model.config.max_seq_len:
        raise ValueError(f"seq_len must be in [1, {model.config.max_seq_len}], got {seq_len}")
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
    peak = z.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z - peak).sum(axis=-1)) + peak[..., 0]           # (B, T)
    picked = np.take_along_axis(z, y[..., None], axis=-1)[..., 0]        # (B, T)
    return float((lse - picked).sum())


def evaluate_text(model: Transformer, tokenizer, text_or_paths, seq_len: int = 256,
                  batch_size: int = 16) -> EvalResult:
    """:func:`evaluate` on text (a str, a path, or a list of them) encoded with ``encode_corpus``."""
    return evaluate(model, tokenizer.encode_corpus(text_or_paths), tokenizer, seq_len, batch_size)


# ----------------------------------------------------------------------------
# A run: model, optimiser, data, history, and its folder
# ----------------------------------------------------------------------------

@contextlib.contextmanager
def _stop_between_steps():
    """While training: the first Ctrl-C (SIGINT) or SIGTERM only asks the loop to stop after the step it is
    in, so that it can save the run there; a second Ctrl-C interrupts at once. Yields a list that holds the
    signal once one came. Outside the main thread signals cannot be caught: the list stays empty."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def ask(signum, frame):
        if got and signum == signal.SIGINT:
            raise KeyboardInterrupt                                      # the second Ctrl-C: now
        got.append(signum)

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, ask)
    try:
        yield got
    finally:
        for s, handler in old.items():
            # None: a handler installed outside Python, which cannot be put back from here; use the default
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


class Trainer:
    """A training run in a folder: build it fresh or resume it, then :meth:`run`.

    ``Trainer(config, model_config, train_files, out_dir, ...)`` starts a new
    run; :meth:`Trainer.resume` continues the one saved in a folder.
    """

    def __init__(self, config: TrainConfig, model_config: ModelConfig, train_files, out_dir,
                 valid_files=(), tokenizer=None, cache_dir=None, command: str = "", progress: bool = True):
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        if not isinstance(model_config, ModelConfig):
            raise TypeError(f"model_config must be a ModelConfig, got {type(model_config).__name__}")
        if config.seq_len > model_config.max_seq_len:
            raise ValueError(f"seq_len={config.seq_len} exceeds the model's max_seq_len={model_config.max_seq_len}")
        from .tokenizer import Tokenizer

        self.config, self.model_config = config, model_config
        self.out = make_folder(out_dir)
        self.cache_dir = Path(cache_dir) if cache_dir else self.out / "cache"
        self.progress = progress
        # a path or a list of them; folders give their *.txt files (as on the command line)
        self.train_files = [f.resolve() for f in expand_paths(train_files)]
        valid_files = [valid_files] if isinstance(valid_files, (str, os.PathLike)) else list(valid_files)
        self.valid_files = [f.resolve() for f in expand_paths(valid_files)] if valid_files else []
        for files, what in ((self.train_files, "training"), (self.valid_files, "held-out")):
            if files and all(f.is_file() and f.stat().st_size == 0 for f in files):
                names = ", ".join(repr(str(f)) for f in files[:3]) + (" ..." if len(files) > 3 else "")
                raise ValueError(f"the {what} text is empty: {names} {'has' if len(files) == 1 else 'have'} no bytes")
        self.train_hashes = text_sha256s(self.train_files)
        self.valid_hashes = text_sha256s(self.valid_files)
        if tokenizer is None:
            tokenizer = Tokenizer.train(self.train_files, vocab_size=model_config.vocab_size)
        if tokenizer.vocab_size != model_config.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size "
                             f"is {model_config.vocab_size}")
        self.tokenizer = tokenizer
        init_seq, data_seq = np.random.SeedSequence(config.seed).spawn(2)
        self.model = Transformer(model_config, seed=np.random.default_rng(init_seq),
                                 dtype=_DTYPES[config.dtype])
        self.optimizer = AdamW(self.model.named_parameters(), lr=config.lr, betas=(config.beta1, config.beta2),
                               eps=config.eps, weight_decay=config.weight_decay)
        self.train_ids = token_ids(self.train_files, tokenizer, self.cache_dir, self.train_hashes)
        self.valid_ids = (token_ids(self.valid_files, tokenizer, self.cache_dir, self.valid_hashes)
                          if self.valid_files else None)
        if self.valid_ids is not None and len(self.valid_ids) < 2:
            raise ValueError(f"the held-out text is {len(self.valid_ids)} token long; evaluation needs at least 2 "
                             f"(one to read, one to predict): give more --valid text")
        self.sampler = WindowSampler(self.train_ids, config.seq_len, config.batch_size,
                                     np.random.default_rng(data_seq), config.repeat_fraction, config.repeat_tokens)
        self.step = 0
        self.elapsed = 0.0
        self.history: list[dict] = []
        self.command = command
        self.last_eval: EvalResult | None = None
        self.timeline = (Timeline.for_model(self.model, tokenizer, config.steps, config.timeline_points)
                         if config.timeline_points else None)

    # -- resume -------------------------------------------------------------------
    @classmethod
    def resume(cls, out_dir, cache_dir=None, progress: bool = True) -> "Trainer":
        """Rebuild the run saved in ``out_dir/train_state.safetensors`` exactly as it was saved."""
        from safetensors import safe_open

        from .tokenizer import Tokenizer

        path = Path(out_dir) / "train_state.safetensors"
        if not path.is_file():
            raise ValueError(f"cannot resume: {str(path)!r} does not exist (start a run without --resume)")
        for name in RUN_FILES:            # half-written temporary files of a run that was killed mid-save
            for stale in Path(out_dir).glob(f".{name}.*.tmp"):
                stale.unlink(missing_ok=True)
        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = f.metadata() or {}
                if meta.get("format") != STATE_FORMAT or meta.get("version") != STATE_VERSION:
                    raise ValueError(f"{str(path)!r} is not a glassllm training state "
                                     f"(format {meta.get('format')!r} v{meta.get('version')!r})")
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except ValueError:
            raise
        except Exception as e:  # safetensors' own error types
            raise ValueError(f"cannot read {str(path)!r}: {e}") from None
        config = TrainConfig.from_dict(json.loads(meta["train_config"]))
        model_config = ModelConfig.from_json(meta["model_config"])
        data = json.loads(meta["data"])
        for kind in ("train", "valid"):
            for file, digest in data[kind]:
                if not Path(file).is_file():
                    raise ValueError(f"cannot resume: {kind} file {file!r} is gone")
        self = cls.__new__(cls)
        self.config, self.model_config = config, model_config
        self.out = Path(out_dir)
        self.cache_dir = Path(cache_dir) if cache_dir else self.out / "cache"
        self.progress = progress
        self.train_files = [Path(f) for f, _ in data["train"]]
        self.valid_files = [Path(f) for f, _ in data["valid"]]
        self.train_hashes = text_sha256s(self.train_files)
        self.valid_hashes = text_sha256s(self.valid_files)
        for kind, files, now in (("train", data["train"], self.train_hashes), ("valid", data["valid"], self.valid_hashes)):
            for (file, then), digest in zip(files, now):
                if then != digest:
                    raise ValueError(f"cannot resume: {kind} file {file!r} changed since the run started "
                                     f"(SHA-256 {digest[:12]}..., was {then[:12]}...)")
        self.tokenizer = Tokenizer.from_json(meta["tokenizer"])
        self.model = Transformer(model_config, seed=0, dtype=_DTYPES[config.dtype])
        self.model.load_state_dict({k[len("param/"):]: v for k, v in tensors.items() if k.startswith("param/")})
        self.optimizer = AdamW(self.model.named_parameters(), lr=config.lr, betas=(config.beta1, config.beta2),
                               eps=config.eps, weight_decay=config.weight_decay)
        self.optimizer.load_state_dict({
            "t": int(meta["optimizer_t"]),
            "m": {k[len("adam_m/"):]: v for k, v in tensors.items() if k.startswith("adam_m/")},
            "v": {k[len("adam_v/"):]: v for k, v in tensors.items() if k.startswith("adam_v/")},
        })
        self.train_ids = token_ids(self.train_files, self.tokenizer, self.cache_dir, self.train_hashes)
        self.valid_ids = (token_ids(self.valid_files, self.tokenizer, self.cache_dir, self.valid_hashes)
                          if self.valid_files else None)
        self.sampler = WindowSampler(self.train_ids, config.seq_len, config.batch_size, np.random.default_rng(0),
                                     config.repeat_fraction, config.repeat_tokens)
        self.sampler.set_state(json.loads(meta["sampler"]))
        self.step = int(meta["step"])
        self.elapsed = float(meta["elapsed_s"])
        self.history = json.loads(meta["history"])
        self.command = meta.get("command", "")
        self.last_eval = None
        self.timeline = None
        if config.timeline_points:
            saved = self.out / "timeline.safetensors"
            self.timeline = (load_timeline(saved) if saved.is_file() else
                             Timeline.for_model(self.model, self.tokenizer, config.steps, config.timeline_points))
        return self

    # -- the loop ---------------------------------------------------------------
    @property
    def tokens_seen(self) -> int:
        return self.step * self.config.tokens_per_step

    def run(self, until: int | None = None) -> None:
        """Train up to step ``until`` (default: config.steps), checkpointing as configured."""
        from tqdm import tqdm

        c = self.config
        stop = c.steps if until is None else min(int(until), c.steps)
        if self.step >= stop:
            self._log(f"nothing to do: the run is at step {self.step} of {c.steps}")
            return
        tty = sys.stderr.isatty()
        bar = tqdm(total=c.steps, initial=self.step, desc="train", unit="step", disable=not self.progress,
                   mininterval=0.5 if tty else 60.0, dynamic_ncols=tty, ascii=not tty, file=sys.stderr)
        started, first_step = time.perf_counter(), self.step
        threads = GradientThreads(self.model, c.workers) if c.workers > 1 else None
        scope = contextlib.ExitStack()
        if threads is not None:
            scope.callback(threads.close)
            scope.enter_context(_threads(1))                             # the workers are the parallelism
        stopping = scope.enter_context(_stop_between_steps())
        try:
            while self.step < stop:
                if stopping:                                             # Ctrl-C or SIGTERM came during that step
                    self.save()
                    break
                t0 = time.perf_counter()
                if self.step == first_step:
                    self._look(None)                                     # the timeline's step 0, if due
                B, T = c.window_shape(self.step)
                r = c.repeat_at(self.step)
                batches = [self.sampler.next_batch(T, B, r) for _ in range(c.grad_accum)]
                lr = c.lr_at(self.step)
                loss, norm = train_step(self.model, self.optimizer, batches, lr, c.grad_clip, self.step + 1,
                                        threads)
                self.step += 1
                self.elapsed += time.perf_counter() - t0
                row = {"step": self.step, "tokens": self.tokens_seen, "lr": lr, "loss": loss,
                       "grad_norm": norm, "val_loss": None, "val_bpb": None, "elapsed_s": round(self.elapsed, 3)}
                self.history.append(row)
                final = self.step == c.steps
                if self.valid_ids is not None and (final or (c.eval_every and self.step % c.eval_every == 0)):
                    t1 = time.perf_counter()
                    result = evaluate(self.model, self.valid_ids, self.tokenizer, c.seq_len, c.batch_size,
                                      None if final else (c.eval_windows or None))
                    self.elapsed += time.perf_counter() - t1
                    row["val_loss"], row["val_bpb"] = result.loss, result.bits_per_byte
                    self.last_eval = result if final else None
                    sample = self._look(result) or self.sample()
                    if self.progress:
                        bar.write(f"step {self.step}: train loss {loss:.4f}  held-out {result.line()}",
                                  file=sys.stderr)
                        bar.write(f"  sample: {SAMPLE_PROMPT}{sample}".replace("\n", " / "), file=sys.stderr)
                else:
                    self._look(None)
                rate = (self.step - first_step) * c.tokens_per_step / (time.perf_counter() - started)
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{rate:,.0f}", lr=f"{lr:.2e}", refresh=False)
                bar.update(1)
                if self.step == stop or (c.checkpoint_every and self.step % c.checkpoint_every == 0):
                    self.save()
            if stopping:                                                 # the run is saved at this step
                bar.close()
                if self.step < c.steps:
                    print(f"interrupted at step {self.step} of {c.steps}: saved; continue with "
                          f"glassllm train --out {shlex.quote(str(self.out))} --resume", file=sys.stderr)
                if stopping[0] == signal.SIGTERM:
                    raise SystemExit(128 + signal.SIGTERM)
                raise KeyboardInterrupt
        finally:
            scope.close()
            bar.close()
        if self.step < c.steps:
            self._log(f"stopped at step {self.step} of {c.steps}; continue with --resume")

    def _log(self, text: str) -> None:
        if self.progress:
            print(text, file=sys.stderr)

    def sample(self) -> str:
        """A short continuation of the fixed sample prompt, with a fixed seed (the run's RNG is not touched)."""
        from .generate import generate_text

        room = self.model_config.max_seq_len - len(self.tokenizer.encode(SAMPLE_PROMPT))
        if room <= 0:
            return ""
        return generate_text(self.model, self.tokenizer, SAMPLE_PROMPT,
                             **{**SAMPLE, "max_new_tokens": min(SAMPLE["max_new_tokens"], room)})

    def _look(self, result: "EvalResult | None") -> str | None:
        """Record the timeline at this step if it is due; its sample, or None if nothing was recorded."""
        tl, c = self.timeline, self.config
        if tl is None or not tl.due(self.step):
            return None
        t0 = time.perf_counter()

        def valid():
            if result is not None or self.valid_ids is None:
                return result
            return evaluate(self.model, self.valid_ids, self.tokenizer, c.seq_len, c.batch_size,
                            c.eval_windows or None)

        last = self.history[-1] if self.history and self.history[-1]["step"] == self.step else None
        tl.record(self.model, self.tokenizer, self.step, self.tokens_seen, c.lr_at(max(self.step - 1, 0)),
                  None if last is None else last["loss"], valid)
        self.elapsed += time.perf_counter() - t0
        return tl.rows[-1]["sample"]

    # -- saving -------------------------------------------------------------------
    def save(self) -> None:
        """Write the training state, then the inference file, tokenizer and loss curve (all atomic)."""
        from safetensors.numpy import save

        c = self.config
        meta = {
            "format": STATE_FORMAT, "version": STATE_VERSION, "step": str(self.step),
            "optimizer_t": str(self.optimizer.t), "train_config": c.to_json(),
            "model_config": self.model_config.to_json(), "tokenizer": self.tokenizer.to_json(),
            "sampler": json.dumps(self.sampler.state()), "elapsed_s": repr(self.elapsed),
            "data": json.dumps({"train": [[str(f), h] for f, h in zip(self.train_files, self.train_hashes)],
                                "valid": [[str(f), h] for f, h in zip(self.valid_files, self.valid_hashes)]}),
            "history": json.dumps(self.history), "command": self.command,
        }
        tensors = {}
        for name, p in self.model.named_parameters():
            tensors["param/" + name] = np.ascontiguousarray(p.data)
            tensors["adam_m/" + name] = np.ascontiguousarray(self.optimizer.m[name])
            tensors["adam_v/" + name] = np.ascontiguousarray(self.optimizer.v[name])
        atomic_write(self.out / "train_state.safetensors", save(tensors, metadata=meta))
        save_model(self.out / "model.safetensors", self.model, self.tokenizer, self.model_metadata())
        # The run's tokenizer, also when a tokenizer.json of something else was in the folder before it.
        tok_path = self.out / "tokenizer.json"
        if not tok_path.is_file() or tok_path.read_text(encoding="utf-8", errors="replace") != self.tokenizer.to_json():
            self.tokenizer.save(tok_path)
        self.write_curve()
        if self.timeline is not None and self.timeline.steps:
            self.timeline.set_history(self.history)
            self.timeline.save(self.out / "timeline.safetensors")

    def model_metadata(self) -> dict[str, str]:
        """What the inference file records about how it was made."""
        c = self.config
        meta = {
            "step": str(self.step), "steps": str(c.steps), "tokens_seen": str(self.tokens_seen),
            "seed": str(c.seed), "train_config": c.to_json(), "wall_time_s": f"{self.elapsed:.1f}",
            # Keyed by the whole path: two folders may both hold a train.txt.
            "train_data_sha256": json.dumps({str(f): h for f, h in zip(self.train_files, self.train_hashes)}),
            "valid_data_sha256": json.dumps({str(f): h for f, h in zip(self.valid_files, self.valid_hashes)}),
            "command": self.command,
        }
        if self.history:
            meta["train_loss"] = repr(self.history[-1]["loss"])
        if self.last_eval is not None:
            meta["valid_loss"] = repr(self.last_eval.loss)
            meta["valid_bits_per_byte"] = repr(self.last_eval.bits_per_byte)
            meta["valid_tokens"] = str(self.last_eval.tokens)
        return meta

    def write_curve(self) -> None:
        """``loss.csv`` (one row per step) and ``loss.png`` (train and held-out loss against step)."""
        columns = ["step", "tokens", "lr", "loss", "grad_norm", "val_loss", "val_bpb", "elapsed_s"]
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        for row in self.history:
            writer.writerow(["" if row[k] is None else row[k] for k in columns])
        atomic_write(self.out / "loss.csv", buf.getvalue())
        write_loss_png(self.history, self.out / "loss.png")


def write_loss_png(history: list[dict], path) -> None:
    """Plot the loss curve with matplotlib's Agg backend (no display needed), atomically."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    ax = fig.add_subplot()
    steps = [r["step"] for r in history]
    ax.plot(steps, [r["loss"] for r in history], lw=0.8, alpha=0.7, label="train (per step)")
    val = [(r["step"], r["val_loss"]) for r in history if r["val_loss"] is not None]
    if val:
        ax.plot(*zip(*val), "o-", ms=3, label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")


# ----------------------------------------------------------------------------
# The ``glassllm train`` and ``glassllm eval`` commands
# ----------------------------------------------------------------------------

_TRAIN_HELP = {
    "steps": "optimiser steps in the whole run",
    "batch_size": "windows per micro-batch",
    "seq_len": "tokens per window (the context length trained)",
    "grad_accum": "micro-batches whose gradients are averaged per optimiser step",
    "lr": "peak learning rate (after warm-up)",
    "min_lr": "learning rate at the end of the cosine decay",
    "warmup_steps": "steps of linear warm-up (-1 = a tenth of --steps, at most 100)",
    "weight_decay": "AdamW decoupled weight decay, on weight matrices only (not norms)",
    "beta1": "AdamW first-moment decay",
    "beta2": "AdamW second-moment decay",
    "eps": "AdamW epsilon",
    "grad_clip": "clip gradients to this global L2 norm (0 = off)",
    "repeat_fraction": "share of training windows that repeat one span over and over (teaches copying: induction heads)",
    "repeat_tokens": "what a repeated span is made of: text (a piece of the data) or random (tokens drawn from it)",
    "short_steps": "sequence-length warm-up: this many first steps train on windows of --short-seq-len tokens "
                   "(0 = off)",
    "short_seq_len": "tokens per window during the warm-up; the batch grows to keep tokens per step the same",
    "short_repeat_fraction": "share of repeated-span windows during the sequence-length warm-up "
                             "(-1 = the same as --repeat-fraction)",
    "timeline_points": "log-spaced steps at which a probe prompt's attention, next-token distribution, "
                       "held-out loss and a sample are kept in timeline.safetensors (0 = off)",
    "seed": "seed of the weight initialisation and of the batch sampler",
    "workers": "threads that each back-propagate a share of every batch's rows, with one BLAS thread each "
               "(data parallelism; the same gradients up to float rounding)",
    "dtype": "precision of the weights, activations and optimiser state",
    "eval_every": "steps between held-out evaluations (0 = only at the end)",
    "eval_windows": "held-out windows per periodic evaluation (0 = all; the final one uses all)",
    "checkpoint_every": "steps between checkpoints (0 = only at the end)",
}
_MODEL_HELP = {
    "vocab_size": "token ids (the tokenizer trained on --data gets this many)",
    "dim": "model width C",
    "n_layers": "transformer blocks",
    "n_heads": "query heads H",
    "n_kv_heads": "key/value heads G (H must be a multiple)",
    "ffn_dim": "SwiGLU width F (default: LLaMA's 8/3 x dim rule, rounded up to 32: 352 at width 128)",
    "max_seq_len": "longest context the model accepts",
    "norm_eps": "RMSNorm epsilon",
    "rope_theta": "RoPE base",
}


# Fields whose values are names: argparse lists them in --help and refuses others in its own words.
_CHOICES = {"repeat_tokens": REPEAT_TOKENS, "dtype": tuple(_DTYPES)}


def _field_type(default):
    return type(default) if not isinstance(default, bool) else bool


def add_cli(name: str, parser) -> None:
    """Options of ``glassllm train`` or ``glassllm eval`` (cli.py routes both here)."""
    if name == "eval":
        _add_eval_cli(parser)
        return
    parser.description = ("Train a glassllm model from scratch on text files with AdamW, a warm-up + cosine "
                          "schedule and gradient clipping. The run folder gets model.safetensors (the file "
                          "to generate with), train_state.safetensors (for --resume), tokenizer.json, "
                          "loss.csv and loss.png.")
    io_ = parser.add_argument_group("data and run folder")
    io_.add_argument("--data", nargs="+", metavar="PATH",
                     help="training text: files, folders (their *.txt), 'tinystories:train' (downloads "
                          "TinyStories from the Hugging Face hub) or hf:OWNER/NAME/FILE; stories separated "
                          "by <|endoftext|> lines")
    io_.add_argument("--valid", nargs="+", metavar="PATH", default=None,
                     help="held-out text for loss, perplexity and bits per byte (same forms as --data)")
    io_.add_argument("--out", metavar="DIR", default="runs/train", help="run folder (default: runs/train)")
    io_.add_argument("--resume", action="store_true",
                     help="continue the run saved in --out from its last save (bit-identical); Ctrl-C saves "
                          "the step it stops at, a crash loses the steps since the last checkpoint")
    io_.add_argument("--until", type=int, metavar="STEP",
                     help="stop (with a checkpoint) after this step; the schedule still spans --steps")
    io_.add_argument("--tokenizer", metavar="FILE", help="use this tokenizer file instead of training one on --data")
    io_.add_argument("--cache-dir", metavar="DIR", help="where token ids and downloads are cached (default: OUT/cache)")
    io_.add_argument("--threads", type=int, metavar="N",
                     help="BLAS threads (default: the library's choice); --workers N uses N cores better")
    io_.add_argument("--no-progress", action="store_true", help="no progress bar or log lines")
    io_.add_argument("--quiet", action="store_true", help="the same as --no-progress: nothing but errors")
    tg = parser.add_argument_group("training (TrainConfig)")
    tg.add_argument("--recipe", choices=sorted(RECIPES), default=None,
                    help="start from a named TrainConfig; the options below override it ('bundled' made "
                         "the bundled model; default: 'default')")
    add_config_options(tg, TrainConfig)
    add_config_options(parser.add_argument_group("model (ModelConfig)"), ModelConfig)
    parser.set_defaults(func=_train_cli)


def add_config_options(group, cls, skip=(), ignored=None) -> None:
    """One option per field of TrainConfig or ModelConfig (``--batch-size`` ...), described and with its default.

    Values land in ``args.train_<field>`` or ``args.model_<field>`` (None when not given: see :func:`_given`).
    The PyTorch twin's command line (``glassllm.torch.train_ddp``) shares them; ``ignored`` maps the fields
    it accepts without using to the help that says so.
    """
    prefix, helps = ("train_", _TRAIN_HELP) if cls is TrainConfig else ("model_", _MODEL_HELP)
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        text = (ignored or {}).get(field.name, helps[field.name])
        choices = _CHOICES.get(field.name)
        group.add_argument("--" + field.name.replace("_", "-"), dest=prefix + field.name,
                           type=_field_type(field.default), default=None, choices=choices,
                           metavar="{" + ",".join(choices) + "}" if choices else field.name.upper(),
                           help=text if "default:" in text else f"{text} (default: {field.default})")


def _given(args, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in vars(args).items() if k.startswith(prefix) and v is not None}


def _threads(n):
    """Limit BLAS to ``n`` threads while the context is open (None: the library's choice)."""
    if n is None:
        return contextlib.nullcontext()
    if n < 1:
        raise ValueError(f"--threads must be >= 1, got {n}")
    from threadpoolctl import threadpool_limits
    return threadpool_limits(n)


def _odd_settings(c: TrainConfig, typed: set) -> list[str]:
    """Settings given on the command line (``typed``) that are valid but probably not what was meant."""
    notes = []
    if "warmup_steps" in typed and c.warmup_steps >= c.steps:
        notes.append(f"--warmup-steps {c.warmup_steps} is not below --steps {c.steps}: the learning rate never "
                     f"reaches --lr {c.lr}")
    if "short_steps" in typed and c.short_steps >= c.steps:
        notes.append(f"--short-steps {c.short_steps} is not below --steps {c.steps}: every step trains on "
                     f"{c.short_seq_len}-token windows")
    if "workers" in typed and c.workers > c.batch_size:
        notes.append(f"--workers {c.workers} is more than --batch-size {c.batch_size}: "
                     f"{c.workers - c.batch_size} of them will have no rows to work on")
    return notes


@contextlib.contextmanager
def _as_flags(from_recipe: set, recipe: str | None):
    """A config's error about ``TrainConfig.short_seq_len`` names the flag the user knows, ``--short-seq-len``,
    and says when the value came from ``--recipe`` (``from_recipe``: the fields the recipe set and the
    command line did not)."""
    try:
        yield
    except (ValueError, TypeError) as e:
        def flag(m):
            field = m.group(2)
            name = "--" + field.replace("_", "-")
            return f"{name} (set by --recipe {recipe})" if field in from_recipe else name
        text = re.sub(r"\b(TrainConfig|ModelConfig)\.(\w+)", flag, str(e))
        text = re.sub(r"\bseq_len=", "--seq-len ", text)
        text = text.replace("batch_size * seq_len", "--batch-size x --seq-len")
        raise type(e)(text) from None


def _train_cli(args) -> int:
    from .tokenizer import Tokenizer

    train_opts, model_opts = _given(args, "train_"), _given(args, "model_")
    typed = set(train_opts)               # what the command line itself set (the rest comes from --recipe)
    if args.recipe:                       # the recipe's values, as if given, under the explicit ones
        base, plain = RECIPES[args.recipe].to_dict(), TrainConfig().to_dict()
        train_opts = {**{k: v for k, v in base.items() if v != plain[k]}, **train_opts}
    progress = not (args.no_progress or args.quiet)
    if args.until is not None and args.until < 1:
        raise ValueError(f"--until must be a step >= 1, got {args.until}")
    if args.resume:
        if args.tokenizer:
            raise ValueError(f"--tokenizer {args.tokenizer} cannot change a resumed run: it keeps the tokenizer.json "
                             f"in {str(args.out)!r}")
        lock = lock_run_folder(args.out, create=False)               # held until this process ends
        trainer = Trainer.resume(args.out, args.cache_dir, progress)
        stored = {**{"train_" + k: v for k, v in trainer.config.to_dict().items()},
                  **{"model_" + k: v for k, v in trainer.model_config.to_dict().items()}}
        for key, value in {**{"train_" + k: v for k, v in train_opts.items()},
                           **{"model_" + k: v for k, v in model_opts.items()}}.items():
            if stored[key] != value:
                field = key.split("_", 1)[1]
                flag = "--" + field.replace("_", "-")
                source = (f"--recipe {args.recipe} sets {flag} {value}, which"
                          if key.startswith("train_") and field not in typed else f"{flag} {value}")
                raise ValueError(f"{source} differs from the resumed run's {stored[key]}; "
                                 "a resumed run keeps its configuration")
        for flag, given, kept in (("--data", args.data, trainer.train_hashes),
                                  ("--valid", args.valid, trainer.valid_hashes)):
            cache = args.cache_dir or Path(args.out) / "cache"             # where the run's downloads went
            if given and text_sha256s(resolve_sources(given, cache, progress=progress)) != kept:
                raise ValueError(f"{flag} {' '.join(given)} is not the data the resumed run was trained on")
        trainer._log(f"resuming {args.out} at step {trainer.step} of {trainer.config.steps}")
    else:
        if not args.data:
            raise ValueError("--data is required: text files or folders to train on (or --resume)")
        recipe_set = set()
        if args.recipe:
            base, plain = RECIPES[args.recipe].to_dict(), TrainConfig().to_dict()
            recipe_set = {k for k in base if base[k] != plain[k] and k not in typed}
        with _as_flags(recipe_set, args.recipe):
            config = TrainConfig(**train_opts)
        for note in _odd_settings(config, typed):                        # allowed, but rarely meant
            print(f"glassllm train: note: {note}", file=sys.stderr)
        tokenizer = Tokenizer.load(args.tokenizer) if args.tokenizer else None
        if tokenizer is not None:
            if "vocab_size" in model_opts and model_opts["vocab_size"] != tokenizer.vocab_size:
                raise ValueError(f"--vocab-size {model_opts['vocab_size']} differs from the tokenizer's "
                                 f"{tokenizer.vocab_size} ids")
            model_opts.setdefault("vocab_size", tokenizer.vocab_size)
        if "dim" in model_opts and "ffn_dim" not in model_opts:
            model_opts["ffn_dim"] = ModelConfig.llama_ffn_dim(model_opts["dim"])
        with _as_flags(set(), None):
            model_config = ModelConfig(**model_opts)
        fresh = not Path(args.out).exists()
        lock = lock_run_folder(args.out)                               # held until this process ends
        with _removed_on_failure(args.out if fresh else None):
            trainer = _new_trainer(args, config, model_config, tokenizer, progress)
        trainer._log(f"training {trainer.model.num_params():,} parameters on {len(trainer.train_ids):,} tokens "
                     f"for {config.steps} steps of {config.tokens_per_step:,} tokens -> {args.out}")
    with _threads(args.threads):
        trainer.run(args.until)
    if trainer.step == trainer.config.steps and progress:
        line = f"done: {trainer.step} steps, {trainer.tokens_seen:,} tokens, {trainer.elapsed:.0f} s"
        if trainer.last_eval is not None:
            line += f"; held-out {trainer.last_eval.line()}"
        print(line, file=sys.stderr)
    if lock is not None:
        lock.close()
    return 0


def _new_trainer(args, config, model_config, tokenizer, progress: bool) -> "Trainer":
    """The Trainer of a new run in ``args.out`` (whose lock the caller holds), after the folder's checks."""
    if (Path(args.out) / "train_state.safetensors").exists():
        raise ValueError(f"{str(args.out)!r} already holds a run; add --resume to continue it "
                         "or choose another --out")
    if (Path(args.out) / "model.safetensors").exists():
        raise ValueError(f"{str(args.out)!r} holds a model.safetensors that no run there saved (an export?); "
                         "a new run would replace it: choose another --out")
    cache = args.cache_dir or Path(args.out) / "cache"
    # Local paths first, for both: a typo in --valid must not come after a download (and undo it).
    for flag, specs in (("--data", args.data), ("--valid", args.valid or [])):
        for spec in specs:
            if hub_source(spec) is None and not Path(spec).exists():
                raise ValueError(f"{flag} path {str(spec)!r} does not exist")
    train_files = resolve_sources(args.data, cache, progress=progress)
    valid_files = resolve_sources(args.valid, cache, progress=progress) if args.valid else []
    command = shlex.join(["glassllm", "train", *sys.argv[2:]]) if _invoked_as_train() else ""
    with _threads(args.threads):
        return Trainer(config, model_config, train_files, args.out, valid_files, tokenizer,
                       args.cache_dir, command, progress)


@contextlib.contextmanager
def _removed_on_failure(folder):
    """If the block fails, remove ``folder`` (made for this run; None = keep it): a run refused
    before its first step leaves nothing behind -- at most a lock and a token cache it made."""
    try:
        yield
    except BaseException:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise


def lock_run_folder(out, create: bool = True):
    """Hold an exclusive lock on the run folder ``out`` (its ``.lock`` file) for as long as the returned
    file stays open, so that two trainings never write one folder; ``ValueError`` if another holds it.

    With ``create`` False a missing folder is left for the caller to report. Without ``fcntl``
    (Windows) nothing is locked.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        return None
    out = Path(out)
    if not out.is_dir():
        if not create:
            return None
        make_folder(out)
    f = open(out / ".lock", "a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ValueError(f"{str(out)!r} is in use by another glassllm train (it holds the folder's .lock); "
                         "wait for it to finish or choose another --out") from None
    return f


def _invoked_as_train() -> bool:
    return len(sys.argv) > 1 and sys.argv[1] == "train"


def _add_eval_cli(parser) -> None:
    parser.description = (
        "Held-out loss, perplexity and bits per byte of a model on text. The text is encoded with the model's "
        "tokenizer and cut into non-overlapping windows of --seq-len tokens; every token but the first is "
        "predicted once. loss = nats per predicted token, perplexity = exp(loss), bits/byte = total nats / "
        "(ln 2 x UTF-8 bytes of the predicted tokens' text).")
    parser.add_argument("--model", metavar="FILE", help="model file (default: the bundled TinyStories model)")
    parser.add_argument("--data", nargs="+", metavar="PATH", required=True,
                        help="text files or folders to evaluate on (same forms as train --data)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="window length in tokens (default: the length the model was trained on, from its "
                             "file; else 256, or the model's context if shorter)")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per forward pass (default: 16)")
    parser.add_argument("--threads", type=int, metavar="N", help="BLAS threads (default: the library's choice)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.set_defaults(func=_eval_cli)


def _trained_seq_len(meta: dict, context: int) -> int:
    """The window length a model file says it was trained on (its ``train_config``), else 256; at most ``context``."""
    try:
        trained = json.loads(meta.get("train_config", "{}")).get("seq_len")
    except (ValueError, AttributeError):
        trained = None
    ok = isinstance(trained, int) and not isinstance(trained, bool) and trained >= 1
    return min(trained if ok else 256, context)


def _eval_cli(args) -> int:
    from . import checkpoint

    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    model, tokenizer, meta = (checkpoint.load_model(args.model) if args.model else checkpoint.load_bundled())
    seq_len = args.seq_len if args.seq_len is not None else _trained_seq_len(meta, model.config.max_seq_len)
    files = resolve_sources(args.data, progress=False)
    with _threads(args.threads):
        result = evaluate_text(model, tokenizer, [str(f) for f in files], seq_len, args.batch_size)
    if args.json:
        print(json.dumps({**dataclasses.asdict(result), "seq_len": seq_len}))
    else:
        print(f"{result.line()}  [{seq_len}-token windows]")                # the loss depends on the length
    return 0


if __name__ == "__main__":  # pragma: no cover
    from .cli import main
    sys.exit(main(["train", *sys.argv[1:]]))
