"""A trace that computes a block's snapshots when they are read: one block's cost, not the whole model's.

A full trace of a large model holds every snapshot of every block, with its gradient: for a
135M-parameter Llama and 256 tokens, gigabytes. :class:`LazyTrace` keeps only what is cheap to keep
for the prompt -- the residual stream at each block's input (``layers.{i}.resid_pre``), the last
block's output, the embedding and, after one backward pass, the gradient arriving at each block's
output -- and computes the rest when it is read:

- a name inside block i (``layers.{i}.*``): block i runs again from its stored input, under a
  :class:`~glassllm.trace.Tracer` that records the block's snapshots (and applies the trace's
  interventions); with a loss, its output is back-propagated from the stored gradient, which gives
  every snapshot of the block its gradient;
- ``norm.*``, ``logits``, ``probs``: the final norm and head run again from the last block's output,
  and the loss is back-propagated from there.

Computed blocks are kept, least recently read first out, within ``keep_bytes``. The values equal a
full :func:`~glassllm.trace.trace` to float rounding (the stored inputs come from a forward that may
use fused kernels where a full trace runs the reference code). The gradients come from the same
backward, run a block at a time (as gradient checkpointing does): the stored gradients are exactly
what the full backward passes from block to block.

>>> from glassllm.nn import Transformer
>>> from glassllm.trace import trace
>>> model = Transformer(seed=0)
>>> lazy = trace(model, [5, 6, 7], targets=[6, 7, 8], lazy=True)
>>> lazy.get("layers.1.attn.softmax").shape, lazy.grad("layers.1.mlp.act").shape
((4, 3, 3), (3, 352))
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections import OrderedDict

import numpy as np

from .. import autograd as ag
from .. import kernels
from ..autograd import Tensor
from .record import Step, Trace

__all__ = ["LazyTrace"]

IGNORE_INDEX = -100


class LazyTrace(Trace):
    """The :class:`~glassllm.trace.Trace` of one forward of one row of tokens, computed a block at a time
    when read (see the module docstring). Made by ``trace(model, tokens, lazy=True)``.

    ``targets`` (n,): next-token ids, ``IGNORE_INDEX`` where the loss does not count (None: values
    only). ``keep_bytes``: how many bytes of computed blocks to keep (default 256 MB).
    ``nbytes`` is what the trace holds now; ``reserved_bytes`` what it may grow to.
    """

    def __init__(self, model, tokens, targets=None, interventions=(), dtype=None, keep_bytes: int = 256 << 20):
        from .tracer import Tracer

        tokens = model.check_tokens(tokens)
        if tokens.shape[0] != 1:
            raise ValueError(f"a lazy trace follows one row of tokens, got a batch of {tokens.shape[0]}")
        if isinstance(keep_bytes, bool) or not isinstance(keep_bytes, int) or keep_bytes < 0:
            raise ValueError(f"keep_bytes must be an int >= 0, got {keep_bytes!r}")
        shared = {id(p.data): p.data for p in model.parameters()}
        self._model = copy.deepcopy(model, shared)          # its own modules (and tracer slot), the same weights
        self._interventions = list(interventions)
        self._dtype = dtype
        self._keep = keep_bytes
        self._lock = threading.RLock()
        self._segments: OrderedDict[str, list[str]] = OrderedDict()  # computed segment -> the names it added
        self._held = 0
        L = model.config.n_layers
        self._n = n = tokens.shape[1]
        self._tokens = tokens

        # One forward, keeping the residual stream between blocks (and the logits, for the loss).
        base = ["embed"] + [f"layers.{i}.resid_pre" for i in range(L)] + [f"layers.{L - 1}.resid_post", "logits"]
        probe = Tracer(self._model, base, dtype=dtype, interventions=self._interventions)
        with ag.no_grad(), probe:
            self._model(tokens)
        step = probe.trace.steps[0]
        self._inputs = [step.values[f"layers.{i}.resid_pre"] for i in range(L)]       # (n, C) each
        self._final = step.values[f"layers.{L - 1}.resid_post"]                         # (n, C)
        self.last_logits = np.array(step.values["logits"][-1])                          # (V,)
        kept = {"embed": step.values["embed"]}
        super().__init__(model.config, probe.axes, list(probe.axes), [
            Step(0, n, n, 0, tokens[0].copy(), values=kept)], 0, probe.trace.dtype,
            [repr(iv) for iv in self._interventions])
        self._always = dict(kept)
        self._out_grads: list[np.ndarray | None] = [None] * L
        self._targets = None
        if targets is None:
            self.without_loss = True
            return
        targets = np.asarray(targets).reshape(1, n)
        self._targets = targets
        # One backward, a block at a time: the loss from the last block's output, then down the blocks.
        logits = step.values["logits"]
        self.loss = float(ag.cross_entropy(Tensor(logits[None].astype(model.dtype)), targets, IGNORE_INDEX).item())
        g = self._outer(None)
        for i in reversed(range(L)):
            self._out_grads[i] = g
            g = self._block(i, None, g)
        self.steps[0].grads["embed"] = g                     # the embedding is block 0's input
        self._always["embed.grad"] = g

    # -- bytes -----------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        fixed = sum(a.nbytes for a in self._inputs) + self._final.nbytes + self.last_logits.nbytes
        fixed += sum(g.nbytes for g in self._out_grads if g is not None)
        fixed += sum(a.nbytes for a in self._always.values())
        return fixed + self._held

    @property
    def reserved_bytes(self) -> int:
        return self.nbytes - self._held + self._keep

    # -- reading -----------------------------------------------------------------
    def _read(self, name, layer, head, step, grads: bool) -> np.ndarray:
        full = self.name(name, layer)
        self.step(step)                                      # one step: refuses another index
        with self._lock:
            self._ensure(full)
            return super()._read(full, None, head, step, grads)

    def _segment_of(self, full: str) -> str | None:
        if full == "embed" or full not in self.axes:
            return None
        if full.startswith("layers."):
            return ".".join(full.split(".", 2)[:2])          # "layers.3"
        return "outer"

    def _ensure(self, full: str) -> None:
        seg = self._segment_of(full)
        if seg is None:
            return
        if seg in self._segments:
            self._segments.move_to_end(seg)
            return
        tracer_names = [k for k in self.axes if self._segment_of(k) == seg]
        from .tracer import Tracer

        tracer = Tracer(self._model, tracer_names, dtype=self._dtype, interventions=self._interventions)
        if seg == "outer":
            self._outer(tracer)
        else:
            i = int(seg.split(".")[1])
            self._block(i, tracer, self._out_grads[i])
        got = tracer.trace.steps[0]
        self.steps[0].values.update(got.values)
        self.steps[0].grads.update(got.grads)
        added = sorted(set(got.values) | set(got.grads))
        self._segments[seg] = added
        self._held += sum(a.nbytes for a in got.values.values()) + sum(a.nbytes for a in got.grads.values())
        while self._held > self._keep and len(self._segments) > 1:   # the one just computed stays
            _, names = self._segments.popitem(last=False)
            for k in names:                                  # a segment's own names (never "embed")
                for store in (self.steps[0].values, self.steps[0].grads):
                    a = store.pop(k, None)
                    if a is not None:
                        self._held -= a.nbytes

    # -- running a segment ---------------------------------------------------------
    def _stored(self, g: np.ndarray) -> np.ndarray:
        g = np.array(g[0])
        g.flags.writeable = False
        return g

    def _run(self, tracer, fn, x: np.ndarray, grad_out):
        """``fn(Tensor x)`` under ``tracer`` (None: record nothing, apply the interventions); with
        ``grad_out`` back-propagate it (a scalar loss when ``grad_out`` is "loss") and return d/dx."""
        from .tracer import Tracer

        want_grad = grad_out is not None
        tracer = tracer if tracer is not None else Tracer(self._model, [], interventions=self._interventions)
        model = self._model
        params = model.parameters()
        saved = [p.grad for p in params]
        for p in params:
            p.grad = None
        try:
            with (contextlib.nullcontext() if want_grad else ag.no_grad()), tracer:
                tracer.begin_forward(n=self._n, m=self._n, start=0, tokens=self._tokens)
                leaf = Tensor(np.asarray(x, dtype=model.dtype)[None], requires_grad=want_grad)
                out = fn(leaf)
                if want_grad:
                    out.backward() if isinstance(grad_out, str) else out.backward(
                        np.asarray(grad_out, dtype=model.dtype)[None])
        finally:
            for p, g in zip(params, saved):
                p.grad = g
        return leaf.grad if want_grad else None

    def _block(self, i: int, tracer, grad_out):
        """Block i from its stored input; with ``grad_out`` (n, C) its backward: d loss / d input (1, n, C)."""
        model, n = self._model, self._n
        cos, sin = model.rotary.tables(np.arange(0, n))

        def fn(x):
            with kernels.chosen(model._kernel_slots, n=n, m=n, cache=None):
                return model.layers[i](x, (cos, sin), None, 0, None)
        g = self._run(tracer, fn, self._inputs[i], grad_out)
        return None if g is None else self._stored(g)


    def _outer(self, tracer):
        """The final norm and head from the last block's output; with a loss, d loss / d that output."""
        model = self._model
        targets = self._targets

        def fn(x):
            with kernels.chosen(model._kernel_slots, n=self._n, m=self._n, cache=None):
                logits = model.snap("logits", model.output(model.norm(x)))
            model.snap_derived("probs", ag.softmax, logits, axis=-1)
            return logits if targets is None else ag.cross_entropy(logits, targets, IGNORE_INDEX)
        g = self._run(tracer, fn, self._final, None if targets is None else "loss")
        return None if g is None else self._stored(g)
