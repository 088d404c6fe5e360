"""What decides a training run: :class:`TrainConfig`, and the named :data:`RECIPES`.

Every field is checked when the config is made; a bad one raises
:class:`~glassllm.checks.ParameterError` naming it (``TrainConfig.lr must be > 0``),
which ``glassllm train`` reports under its option (``--lr must be > 0``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checks import ParameterError, ParameterTypeError, check_int
from ..config import JsonConfig
from ..limits import over_limit
from ..data import REPEAT_TOKENS
from ..optim import lr_at

__all__ = ["TrainConfig", "RECIPES", "DTYPES"]

DTYPES = {"float32": np.float32, "float64": np.float64}   # TrainConfig.dtype -> the model's float type


_LIMITED = {"timeline_points": "timeline_points", "workers": "threads"}   # fields bounded by glassllm.limits


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
    doc_start_fraction: float = 0.0  # share of text windows that start at a document's start token (a whole story in view)
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
            value = check_int(name, getattr(self, name), low=low, owner="TrainConfig")
            object.__setattr__(self, name, value)                # a NumPy integer is kept as the int it is
            problem = name in _LIMITED and over_limit(value, _LIMITED[name])
            if problem:                                          # glassllm.limits
                raise ParameterError(name, problem, owner="TrainConfig")
        for name in ("lr", "min_lr", "weight_decay", "beta1", "beta2", "eps", "grad_clip", "repeat_fraction",
                     "short_repeat_fraction", "doc_start_fraction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ParameterTypeError(name, f"must be a finite number, got {value!r}", owner="TrainConfig")
        if not self.lr > 0:
            raise ParameterError("lr", f"must be > 0, got {self.lr}", owner="TrainConfig")
        if not math.isfinite(self.lr * (self.warmup + 1)):                # lr_at's warm-up multiplies first
            raise ParameterError("lr", f"={self.lr} is too large: the learning-rate schedule overflows",
                                 owner="TrainConfig")
        if not 0 <= self.min_lr <= self.lr:
            raise ParameterError("min_lr", f"must be in [0, lr={self.lr}], got {self.min_lr}", owner="TrainConfig")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ParameterError(name, f"must be in [0, 1), got {getattr(self, name)}", owner="TrainConfig")
        if not self.eps > 0:
            raise ParameterError("eps", f"must be > 0, got {self.eps}", owner="TrainConfig")
        if self.weight_decay < 0 or self.grad_clip < 0:
            bad = "weight_decay" if self.weight_decay < 0 else "grad_clip"
            raise ParameterError(bad, f"must be >= 0, got {getattr(self, bad)}", owner="TrainConfig")
        if not 0 <= self.repeat_fraction <= 1:
            raise ParameterError("repeat_fraction", f"must be in [0, 1], got {self.repeat_fraction}", owner="TrainConfig")
        if not 0 <= self.doc_start_fraction <= 1:
            raise ParameterError("doc_start_fraction", f"must be in [0, 1], got {self.doc_start_fraction}",
                                 owner="TrainConfig")
        if not (0 <= self.short_repeat_fraction <= 1 or self.short_repeat_fraction == -1):
            raise ParameterError("short_repeat_fraction", f"must be in [0, 1] (or -1: the same as {{repeat_fraction}}), "
                                 f"got {self.short_repeat_fraction}", owner="TrainConfig", refs=("repeat_fraction",))
        if self.repeat_tokens not in REPEAT_TOKENS:
            raise ParameterError("repeat_tokens", f"must be one of {', '.join(REPEAT_TOKENS)}, got {self.repeat_tokens!r}",
                                 owner="TrainConfig")
        if self.short_steps and not (self.short_seq_len < self.seq_len
                                     and self.batch_size * self.seq_len % self.short_seq_len == 0):
            raise ParameterError("short_seq_len", f"must be below {{seq_len}} {self.seq_len} and divide "
                                 f"{{batch_size}} x {{seq_len}} = {self.batch_size * self.seq_len}, "
                                 f"got {self.short_seq_len}", owner="TrainConfig", refs=("seq_len", "batch_size"),
                                 api_problem=f"must be below seq_len={self.seq_len} and divide batch_size * seq_len "
                                             f"= {self.batch_size * self.seq_len}, got {self.short_seq_len}")
        if self.dtype not in DTYPES:
            raise ParameterError("dtype", f"must be one of {sorted(DTYPES)}, got {self.dtype!r}", owner="TrainConfig")

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


# The bundled model (src/glassllm/assets/tinystories.safetensors) was trained in two stages.
# RECIPES["bundled"], from scratch: eight times the default steps; the first 1,000 steps on
# 32-token windows, half of them one random span repeated (so copying pays, and from short
# windows the model learns it within a few hundred steps: induction heads); after that
# full windows, 15% of them repeated spans, so that copying stays useful.
# RECIPES["bundled-512"], with --init-from the first stage's model: 512-token windows, 80% of
# them from a story's start, so that the model is right at every position of its context and
# its stories run their course (docs/training-log.md gives the runs).
RECIPES = {
    "default": TrainConfig(),
    "bundled": TrainConfig(steps=12000, repeat_fraction=0.15, short_repeat_fraction=0.5, repeat_tokens="random",
                           short_steps=1000, short_seq_len=32, eval_every=500),
    "bundled-512": TrainConfig(steps=3000, batch_size=8, seq_len=512, lr=8e-4, min_lr=8e-5, warmup_steps=30,
                               eval_every=100, doc_start_fraction=0.8, repeat_fraction=0.1,
                               repeat_tokens="random", workers=2),
    # Fine-tuning a model file (glassllm train --init-from): a short warm-up, a peak a third of a
    # fresh run's, cosine down to a tenth of it.
    "finetune": TrainConfig(steps=1000, lr=1e-3, min_lr=1e-4, warmup_steps=20, eval_every=100),
    # A classroom run: a few minutes on a laptop, already story-shaped text.
    "class": TrainConfig(steps=800, batch_size=16, seq_len=128, lr=4e-3, eval_every=200, checkpoint_every=100,
                         timeline_points=24, workers=2),
}
