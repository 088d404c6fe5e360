"""Training from scratch on a CPU, evaluation, checkpoints and exact resume.

A run is a loop of optimiser steps (:func:`train_step`; :mod:`~glassllm.train.step`
spells one out: accumulated micro-batches, a stop at the first non-finite loss or
gradient, clipping, AdamW with a warmed-up cosine learning rate).

Everything that decides the numbers is in a frozen :class:`TrainConfig` (plus
the :class:`~glassllm.config.ModelConfig`); the ``glassllm train`` options map
onto their fields one to one.

One concept per module:

- :mod:`~glassllm.train.config`    :class:`TrainConfig` and the named :data:`RECIPES`;
- :mod:`~glassllm.train.step`      one optimiser step (:func:`train_step`, :class:`GradientThreads`,
  :func:`find_non_finite`);
- :mod:`~glassllm.train.evaluate`  held-out loss, perplexity and bits per byte (:func:`evaluate`);
- :mod:`~glassllm.train.folder`    the run folder: its files, the state file, the loss curve, the lock;
- :mod:`~glassllm.train.trainer`   :class:`Trainer`: a run built fresh or resumed, and the loop.

The ``glassllm train`` and ``glassllm eval`` commands are :mod:`glassllm.commands.train`
and :mod:`glassllm.commands.eval`.
"""

from .config import DTYPES, RECIPES, TrainConfig
from .evaluate import EvalResult, evaluate, evaluate_text
from .folder import RUN_FILES, STATE_FORMAT, STATE_VERSION, lock_run_folder, write_loss_png
from .step import GradientThreads, NonFinite, blas_threads, find_non_finite, train_step
from .trainer import Trainer

__all__ = ["TrainConfig", "RECIPES", "DTYPES", "EvalResult", "Trainer", "train_step", "GradientThreads",
           "find_non_finite", "NonFinite", "blas_threads", "evaluate", "evaluate_text", "lock_run_folder",
           "write_loss_png", "RUN_FILES", "STATE_FORMAT", "STATE_VERSION"]
