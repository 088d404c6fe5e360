"""The inspector's traced forward passes: runs, the thread's copy of the model, and their cache keys.

This is the only part of the inspector that runs the model. Forward passes are traced with
:mod:`glassllm.trace`, always with the gradients of the next-token loss, and kept in a
:class:`~glassllm.inspector.cache.TraceCache` (bounded in bytes, least recently used out first)
under a key of the model's digest, the prompt's ids, the intervention and the gradient's target:
switching layer, head, snapshot or value/gradient only slices arrays that are already computed,
and identical requests that arrive together are computed once. Decoding steps come from
:func:`glassllm.generate.generate` (greedy, module path, KV cache), traced the same way, a few
steps ahead.

Requests may come from many threads at once: each thread that computes runs its own copy of the
model, which shares the weights' arrays (a tracer attaches to a model, so two traces cannot share one).
"""

from __future__ import annotations

import copy
import threading

import numpy as np

from ..checks import shown
from ..trace import Tracer, registry
from ..trace.interventions import from_fields
from .cache import TraceCache, model_digest, nbytes

__all__ = ["Run", "Runs", "trace_prompt", "trace_decoding", "refuse_non_finite", "run_bytes", "run_bound", "edits",
           "kept_block_bytes", "kept_grid_bytes", "KEEP_BYTES", "GRID_BYTES"]

KEEP_BYTES = 128 << 20      # a prompt's pass keeps at most this many bytes of computed blocks (and a quarter of the cache)
# A prompt's pass keeps every block's attention weights (and their gradients) for the head grid when the weights
# fit in this many bytes: a grid that is not kept costs every block's forward and backward at each request.
GRID_BYTES = 512 << 20


class Run:
    """One traced forward pass: step ``step`` of a :class:`~glassllm.trace.Trace`.

    ``ids``: the token ids of all m positions the pass could read;
    ``target``: the token whose loss was differentiated (None: no gradients).
    """

    def __init__(self, trace, step: int, ids: list[int], target: int | None):
        self.trace, self.step, self.ids, self.target = trace, step, ids, target
        self.start = trace.steps[step].start                             # positions already cached
        last = getattr(trace, "last_logits", None)                       # a LazyTrace keeps them
        self.logits = last if last is not None else trace.get("logits", step=step)[-1]  # (V,) the last position's

    def get(self, full: str, head: int | None, grad: bool) -> np.ndarray:
        read = self.trace.grad if grad else self.trace.get
        return self.checked(full, read(full, head=head, step=self.step), grad)

    @staticmethod
    def checked(full: str, a: np.ndarray, grad: bool) -> np.ndarray:
        """``a``, the values (or with ``grad`` the gradient) of ``full`` read from a pass, if finite: a lazy
        trace's block is computed when read, so nothing else has looked at it yet."""
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ValueError(f"{'the gradient of ' if grad else ''}{shown(full)} contains NaN or inf: the model's "
                             "numbers overflow, so its output is broken")
        return a


class Runs:
    """The traced passes of one model, cached in ``cache``: the prompt's (under an intervention, with
    gradients) and greedy decoding's. Thread-safe: each computing thread runs its own copy of the model."""

    def __init__(self, model, tokenizer, limits, cache: TraceCache):
        self.model, self.tokenizer, self.limits, self.cache = model, tokenizer, limits, cache
        self.config = model.config
        self.model_key = model_digest(model)
        self._local = threading.local()

    def replica(self):
        """This thread's copy of the model: its own modules (and tracer slot), the model's weight arrays."""
        model = getattr(self._local, "model", None)
        if model is None:
            shared = {id(p.data): p.data for p in self.model.parameters()}
            model = self._local.model = copy.deepcopy(self.model, shared)
        return model

    def prompt_key(self, ids, iv, target, grad) -> tuple:
        """The cache key of the prompt's pass (``iv``: an intervention body, or None)."""
        return (self.model_key, "prompt", tuple(ids), None if iv is None else iv.model_dump_json(),
                target if grad else None)

    def lens_key(self, ids, start: int, stop: int) -> tuple:
        """The cache key of the prompt's logit lens over positions ``[start, stop)``."""
        return (self.model_key, "lens", tuple(ids), start, stop)

    def decode_key(self, ids, step) -> tuple:
        """The cache key of the decoding passes that hold ``step``; its last entry is how many passes."""
        # Decode a few steps ahead (8, 16, 32 ... passes), so stepping on is a lookup.
        want = min(max(8, 1 << step.bit_length()), self.limits.max_new_tokens + 1,
                   self.config.max_seq_len - len(ids))
        return (self.model_key, "decode", tuple(ids), want)

    def prompt(self, ids, iv, target, grad) -> Run:
        """The prompt's pass, traced with gradients (d loss of ``target``, default the top choice)."""
        keep = kept_block_bytes(self.cache.max_bytes)                        # a run's computed blocks
        grid = kept_grid_bytes(self.cache.max_bytes)                         # and its head grid
        def compute():
            # With no target, the model's own top choice under the same intervention: read from the
            # trace's own forward, then back-propagated (one forward, one backward).
            return trace_prompt(self.replica(), ids, iv, True, target if grad else None, keep, grid)
        return self.cache.get(self.prompt_key(ids, iv, target, grad), compute, size=run_bytes)

    def decoded(self, ids, step) -> Run:
        """Greedy decoding's pass ``step`` (>= 1) after the prompt ``ids``."""
        key = self.decode_key(ids, step)
        passes = self.cache.get(key, lambda: trace_decoding(self.replica(), self.tokenizer, ids, key[-1]),
                                size=lambda runs: run_bytes(runs[1]) if len(runs) > 1 else 0)
        if step >= len(passes):
            raise ValueError(f"greedy decoding of this prompt ended (end-of-text) after step "
                             f"{len(passes) - 1}; there is no step {step}")
        return passes[step]

    def run_for(self, ids: list[int], step: int, iv, target: int | None, grad: bool) -> Run:
        """Pass ``step`` of the prompt ``ids``: 0 the prompt's (under ``iv``), s >= 1 decoding's."""
        if step == 0:
            return self.prompt(ids, iv, target, grad)
        if step > self.limits.max_new_tokens:
            raise ValueError(f"step {step} is beyond this inspector's {self.limits.max_new_tokens} "
                             "generation steps (--max-new-tokens)")
        if len(ids) + step >= self.config.max_seq_len:
            raise ValueError(f"step {step} after a {len(ids)}-token prompt would exceed the context of "
                             f"{self.config.max_seq_len} positions")
        return self.decoded(ids, step)

    def finished(self, ids: list[int], step: int, run: Run) -> str | None:
        """Why greedy decoding cannot take a step after pass ``step`` (None if it can)."""
        top = int(np.argmax(run.logits))
        if top in self.tokenizer.end_ids:
            return f"the model's top choice is {self.tokenizer.piece(top)}: the text ends here"
        if step + 1 > self.limits.max_new_tokens:
            return f"this inspector stops after {self.limits.max_new_tokens} steps (--max-new-tokens)"
        if len(ids) + step + 1 >= self.config.max_seq_len:
            return f"the context of {self.config.max_seq_len} positions is full"
        return None

    def cached(self, keys) -> bool:
        """Are the passes of every key in ``keys`` already in the cache?"""
        return all(self.cache.peek(k) is not None for k in keys)


def kept_block_bytes(cache_bytes: int) -> int:
    """Bytes of computed blocks a prompt's pass keeps in a cache of ``cache_bytes``: a quarter of it, at most
    :data:`KEEP_BYTES` (a block not kept costs one block's forward and backward to compute again), so
    that the cache holds passes of several prompts and interventions rather than many blocks of one."""
    return max(min(cache_bytes // 4, KEEP_BYTES), 1)


def kept_grid_bytes(cache_bytes: int) -> int:
    """Bytes of attention weights (their gradients as many again) a prompt's pass keeps for the head grid in a
    cache of ``cache_bytes``: a quarter of it, at most :data:`GRID_BYTES`."""
    return max(min(cache_bytes // 4, GRID_BYTES), 1)


def run_bound(model, n: int, cache_bytes: int | None = None) -> int:
    """The most bytes the traced pass of an ``n``-token prompt holds in the cache (its gradients, kept blocks and
    attention weights for the head grid), before it runs: :meth:`glassllm.trace.LazyTrace.bytes_for`."""
    from ..trace import LazyTrace

    keep = KEEP_BYTES if cache_bytes is None else kept_block_bytes(cache_bytes)
    grid = GRID_BYTES if cache_bytes is None else kept_grid_bytes(cache_bytes)
    return LazyTrace.bytes_for(model.config, n, itemsize=np.dtype(model.dtype).itemsize, keep_bytes=keep,
                               grid_bytes=grid)


def run_bytes(run: Run) -> int:
    """Bytes a traced run holds: every step's values and gradients (a lazy trace: what it may grow to)."""
    reserved = getattr(run.trace, "reserved_bytes", None)
    if reserved is not None:
        return reserved
    return nbytes(*[(s.values, s.grads) for s in run.trace.steps])


# ----------------------------------------------------------------------------
# The tracer calls (glassllm.trace): the only place the model runs
# ----------------------------------------------------------------------------

def edits(iv, model, n: int) -> list:
    """The page's intervention (a body of :mod:`glassllm.inspector.schema`, or None) as the tracer's,
    for ``model`` and an ``n``-token prompt (:func:`glassllm.trace.interventions.from_fields`)."""
    if iv is None:
        return []
    return [from_fields(**iv.model_dump(), axes=registry(model), config=model.config, n=n)]


def trace_prompt(model, ids, iv, grad, target, keep_bytes: int = KEEP_BYTES, grid_bytes: int = GRID_BYTES) -> Run:
    """One traced forward of the prompt; with ``grad``, also d(-log p(target) at the last position)/d snapshot
    (``target`` None: the model's top choice).

    The trace is lazy (:class:`~glassllm.trace.LazyTrace`): it keeps the residual stream between the
    blocks (and the gradient arriving at each), and computes a block's snapshots when a view reads
    them, keeping up to ``keep_bytes`` of computed blocks, and every block's attention weights and their
    gradients for the head grid when the weights fit in ``grid_bytes``. ValueError if an edit (a number set by hand,
    e.g. an rms of 0) makes the logits non-finite.
    """
    from ..trace import LazyTrace

    tokens = np.array(ids)                                               # (n,)
    edit = iv is not None and iv.kind == "edit"
    with np.errstate(all="ignore"):                                      # overflow is refused below instead
        # With gradients: one forward and one backward on one graph (the backward follows at once).
        lazy = LazyTrace(model, tokens, None, edits(iv, model, len(ids)), keep_bytes=keep_bytes, graph=grad,
                         grid_bytes=grid_bytes)
        if not np.isfinite(lazy.last_logits).all():
            target = None                                                # refused below, before any backward
        elif grad:
            if target is None:
                target = int(np.argmax(lazy.last_logits))
            # Cross-entropy only at the last position: every other target is ignored (-100).
            targets = np.full(len(ids), -100)
            targets[-1] = target
            lazy.backward(targets)
        run = Run(lazy, 0, list(ids), target if grad else None)
    if edit and not np.isfinite(run.logits).all():
        raise ValueError(f"this intervention makes the forward pass non-finite (NaN or inf logits): "
                         f"{shown(iv.name)} = {iv.value} is outside what the model can compute with "
                         "(an rms of 0 divides by zero)")
    if not np.isfinite(run.logits).all():
        raise ValueError("logits contain NaN or +inf: the model's output is broken")
    refuse_non_finite(run.trace)                 # what the lazy trace holds now; Run.get checks the rest
    return run


def refuse_non_finite(trace) -> None:
    """Nothing non-finite leaves the inspector: a ValueError line if the traced pass's logits (the line
    ``generate`` gives) or any snapshot or gradient holds NaN or an infinity."""
    for step in trace.steps:
        logits = step.values.get("logits")
        if logits is not None and not np.isfinite(logits).all():
            raise ValueError("logits contain NaN or +inf: the model's output is broken")
    for step in trace.steps:
        for kind, arrays in (("", step.values), ("the gradient of ", step.grads)):
            for name, a in arrays.items():
                if a.dtype.kind == "f" and not np.isfinite(a).all():
                    raise ValueError(f"{kind}{shown(name)} contains NaN or inf: the model's numbers overflow, "
                                     "so its output is broken")


def trace_decoding(model, tokenizer, ids, passes: int) -> list[Run | None]:
    """Greedy decoding with the KV cache, traced: one Run per forward pass after the prompt's
    (entry 0 is None: the prompt's own pass is :func:`trace_prompt`'s, so it is not recorded here)."""
    from ..generate import generate

    with np.errstate(all="ignore"), _AfterPrompt(model) as tracer:      # overflow is refused below instead
        chosen = [tok.id for tok in generate(model, tokenizer, ids, max_new_tokens=passes,
                                             temperature=0, fast=False)]
    t = tracer.trace
    refuse_non_finite(t)
    seq = list(ids) + chosen
    return [None] + [Run(t, s, seq[: step.m], None) for s, step in enumerate(t.steps) if s > 0]


class _AfterPrompt(Tracer):
    """A tracer that records nothing of the first forward (the prompt). Every layer still runs its
    reference code there, as under a tracer of every name, so the keys cached for the later passes
    are those of a full trace, bit for bit."""

    def wants(self, names) -> bool:
        return len(self.steps) <= 1 or super().wants(names)

    def observes(self, name) -> bool:
        return len(self.steps) > 1 and super().observes(name)

    def record(self, name, t):
        return t if len(self.steps) <= 1 else super().record(name, t)
