"""One optimiser step, and what stops one: a loss or gradient that is not finite.

The step (:func:`train_step`)::

    for each of grad_accum micro-batches (B random windows of T tokens):
        loss_i = mean cross-entropy;  backward(loss_i / grad_accum)
    loss = mean of the loss_i;  stop if it or any gradient is not finite, naming the
        first non-finite snapshot (a traced re-run of the batch: find_non_finite)
    clip the gradients to global L2 norm grad_clip (0 = no clipping)
    AdamW step with lr = lr_at(step) (linear warm-up, then cosine decay)

:class:`GradientThreads` shares each micro-batch's rows out among threads;
:func:`blas_threads` limits BLAS's own threads.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np

from ..checks import ParameterError, check_int
from ..limits import over_limit
from ..nn import Transformer
from ..optim import AdamW, check_lr, clip_grad_norm, global_norm
from ..optional import require

__all__ = ["train_step", "GradientThreads", "NonFinite", "find_non_finite", "blas_threads"]


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
        n = check_int("workers", n, low=1)
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
    from ..trace import trace

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


def blas_threads(n):
    """Limit BLAS to ``n`` threads while the context is open (None: the library's choice)."""
    if n is None:
        return contextlib.nullcontext()
    if n < 1:
        raise ParameterError("threads", f"must be >= 1, got {n}")
    if over_limit(n, "threads"):
        raise ParameterError("threads", over_limit(n, "threads"))
    return require("threadpoolctl", "limiting BLAS threads (--threads)").threadpool_limits(n)
