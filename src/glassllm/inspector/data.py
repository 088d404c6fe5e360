"""The inspector's data layer: a model, a tokenizer and a request in; a JSON-ready answer out.

The server (:mod:`glassllm.inspector.server`) and the offline export
(:mod:`glassllm.inspector.export`) both call :class:`Inspector`, so the page
sees the same numbers in both modes.

Three kinds of answer, one per request type of :mod:`glassllm.inspector.schema`:

- ``info()``: the model's shape, every snapshot name with its axes, the
  vocabulary's pieces and the limits -- what the page needs to build its menus;
- ``snapshot(req)``: one (rows, cols) slice of one snapshot of one forward
  pass, as exact binary floats, with the row and column labels and, for
  attention, which cells the causal mask forbids;
- ``next_token(req)``: the last position's logits (the page recomputes
  ``softmax(logits / T)`` live), the ids that survive top-k / top-p
  (:mod:`glassllm.sampling`), and, with an intervention, the logits before and after.

:class:`Inspector` composes three parts, one concept each: every check of a request's
parameters (:mod:`glassllm.inspector.requests`), the traced passes, their cache keys and the
threads' copies of the model (:mod:`glassllm.inspector.runs`), and the views computed from a
pass (:mod:`glassllm.inspector.views`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..trace import registry
from . import requests, views
from .cache import TraceCache
from .runs import Run, Runs, refuse_non_finite, run_bound
from .schema import (
    AttributionRequest, HeadsRequest, InterventionBody, LensRequest, Limits, NextRequest, PromptRequest,
    SnapshotRequest, TimelineRequest,
)
from .views import encode_array, pool

__all__ = ["Inspector", "encode_array", "pool", "refuse_non_finite"]

HEAD_AXES = requests.HEAD_AXES
THUMB_CELLS = views.THUMB_CELLS
GROUPS = views.GROUPS


CACHE_MB = 512          # the least memory the default cache has, in MB


def default_cache_mb(model, limits: Limits, least: float = CACHE_MB) -> float:
    """MB for three traced passes of the longest prompt ``limits`` allow (:func:`~glassllm.inspector.runs.run_bound`),
    and at least ``least``: the bundled model's passes are small, a 135M-parameter Llama's at 256 tokens
    about 365 MB each."""
    return max(float(least), 3 * run_bound(model, limits.max_prompt_tokens) / 2**20)


class Inspector:
    """Answers the page's requests for one model.

    ``model``: a :class:`~glassllm.nn.Transformer`; ``tokenizer``: its
    tokenizer (:class:`~glassllm.tokenizing.TextTokenizer`: byte-level or SentencePiece);
    ``limits``: what one request may cost (the prompt is capped to fit the context); ``timeline``: the
    :class:`~glassllm.timeline.Timeline` of the run that trained it, if there is one (the page's Training
    tab); ``cache``: where traced passes are kept (default: a new
    :class:`~glassllm.inspector.cache.TraceCache` of ``cache_mb`` MB; None: room for three traced passes
    of the longest prompt the limits allow, and never less than :data:`CACHE_MB` -- a view under an
    intervention then keeps the plain pass and the intervened one side by side, for a large model too).
    Thread-safe: each computing thread runs its own copy of the model.
    """

    timeline = None                 # the run's Timeline, if the model has one
    _timeline_answer = None         # its answer, made once

    def __init__(self, model, tokenizer, limits: Limits | None = None, meta: dict | None = None,
                 cache: TraceCache | None = None, cache_mb: float | None = None, timeline=None):
        if tokenizer.vocab_size != model.config.vocab_size:
            raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but the model expects "
                             f"{model.config.vocab_size}")
        self.model, self.tokenizer = model, tokenizer
        self.config = model.config
        self.limits = (limits or Limits()).fit(model.config.max_seq_len)
        self.meta = dict(meta or {})
        self.axes = registry(model)                             # full name -> axis letters, forward order
        if cache_mb is None:
            cache_mb = default_cache_mb(model, self.limits)
        if isinstance(cache_mb, bool) or not isinstance(cache_mb, (int, float)) or not cache_mb >= 0:
            raise ValueError(f"cache_mb must be a number >= 0, got {cache_mb!r}")
        self.runs = Runs(model, tokenizer, self.limits,
                         cache if cache is not None else TraceCache(int(cache_mb * 2**20)))
        self._ids: OrderedDict[str, list[int]] = OrderedDict()      # prompt -> ids, the last 256 prompts
        self._ids_lock = threading.Lock()
        self._vocab = tokenizer.pieces(range(tokenizer.vocab_size))
        if timeline is not None and timeline.config != model.config:
            raise ValueError(f"the timeline was recorded for another model shape ({timeline.config}) than this "
                             f"model's ({model.config})")
        self.timeline = timeline
        self._timeline_answer = None

    @property
    def cache(self) -> TraceCache:
        """Where the traced passes are kept."""
        return self.runs.cache

    @property
    def model_key(self) -> str:
        """The model's digest, the first part of every cache key."""
        return self.runs.model_key

    # ------------------------------------------------------------------ names
    def local_names(self) -> list[str]:
        """Snapshot names as the page lists them: layer 0's names without ``layers.0.``, then the rest."""
        return requests.local_names(self.axes)

    def full_name(self, name: str, layer: int | None) -> str:
        """``attn.softmax`` + layer 2 -> ``layers.2.attn.softmax``; checks both against the registry."""
        return requests.full_name(self.axes, self.config.n_layers, name, layer, self.local_names())

    def info(self) -> dict:
        return views.info_view(self.model, self.tokenizer, self.config, self.axes, self.local_names(), self._vocab,
                               self.meta, self.limits, self.timeline)

    # ------------------------------------------------------------------ tokens
    def encode(self, prompt: str) -> list[int]:
        """Prompt text -> ids as ``glassllm generate`` reads it (the tokenizer's ``encode_prompt``:
        special tokens allowed, ``<s>`` first for a SentencePiece Llama), length-checked."""
        with self._ids_lock:
            ids = self._ids.get(prompt)
            if ids is not None:
                self._ids.move_to_end(prompt)
        if ids is None:
            ids = self.tokenizer.encode_prompt(prompt)
            with self._ids_lock:
                self._ids[prompt] = ids
                while len(self._ids) > 256:                  # prompts are at most 20,000 characters
                    self._ids.popitem(last=False)
        return requests.check_prompt(ids, self.limits, self.config)

    def tokens(self, req: PromptRequest) -> dict:
        ids = self.encode(req.prompt)
        return {"ids": ids, "pieces": [self._vocab[i] for i in ids]}

    def check_pass(self, prompt: str) -> None:
        """Encode ``prompt`` and run its pass (cached): a bad prompt, or a model whose pass is not finite,
        raises the ValueError line the server answers with."""
        self.runs.prompt(self.encode(prompt), None, None, True)

    # ------------------------------------------------------------------ logit lens, attribution
    def lens(self, req: LensRequest | PromptRequest) -> dict:
        """The logit lens of the prompt over one window of positions (``req.positions``, default the
        last :data:`~glassllm.inspector.requests.LENS_WINDOW`): for every residual stream (rows: the
        embedding, each layer's input, the last layer's output) and position of the window, the most
        likely token and its probability. Only the window's columns are computed, and each window is
        kept in the trace cache, so moving back to one is a lookup."""
        from ..trace import LazyTrace, lens_top

        ids = self.encode(req.prompt)
        start, stop = requests.check_lens_window(_as_lens(req), len(ids))   # before any forward

        def compute():
            run = self.runs.prompt(ids, None, None, True)                # refuses a non-finite pass (cached)
            kept = run.trace if isinstance(run.trace, LazyTrace) else None  # its residual streams, if kept
            return lens_top(self.runs.replica(), ids, trace=kept, positions=(start, stop))  # this thread's model
        top, prob = self.cache.get(self.runs.lens_key(ids, start, stop), compute,
                                   size=lambda pair: sum(x.values.nbytes for x in pair))
        return views.lens_view(top, prob, ids, self._vocab, *requests.lens_neighbours(start, stop, len(ids)))

    def attribution(self, req: AttributionRequest) -> dict:
        """Direct logit attribution at one position: each head's and MLP's share of one logit,
        the final norm's scale frozen (the shares sum to the logit)."""
        from ..trace import direct_attribution

        ids = self.encode(req.prompt)
        position = requests.check_attribution(req, len(ids), self.config)
        self.runs.prompt(ids, None, None, True)                          # refuses a non-finite pass (cached)
        bars = direct_attribution(self.runs.replica(), ids, position, req.token)
        return views.attribution_view(bars, position, ids, self._vocab)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, req: SnapshotRequest) -> dict:
        """One (rows, cols) slice of a snapshot: see the module docstring."""
        full = self.full_name(req.name, req.layer)
        letters = self.axes[full]
        requests.check_snapshot(req, letters, self.config)
        requests.check_target(req, self.config)
        ids = self.encode(req.prompt)
        self._check_intervention(req.intervention, len(ids))
        requests.check_cells(full, letters, self.config, self.limits, len(ids), req.step)  # before any forward

        run = self._run_for(ids, req.step, req.intervention, req.target if req.grad else None, req.grad)
        heads = requests.heads_of(letters, self.config)
        a, row_axes = views.snapshot_matrix(run, full, letters, heads[0], req)
        requests.check_values(full, *a.shape, self.limits)
        return views.snapshot_view(run, full, req, a, row_axes, heads, self._vocab)

    def heads(self, req: HeadsRequest) -> dict:
        """Every layer's and head's ``attn.softmax`` (or its gradient) of the prompt's pass, as thumbnails
        (:func:`glassllm.inspector.views.heads_view`)."""
        requests.check_target(req, self.config)
        ids = self.encode(req.prompt)
        self._check_intervention(req.intervention, len(ids))
        run = self._run_for(ids, 0, req.intervention, req.target if req.grad else None, req.grad)
        return views.heads_view(run, req, self.config, ids, self._vocab)

    # ------------------------------------------------------------------ the training timeline
    def timeline_view(self) -> dict:
        """The run's probe history for the Training tab (:func:`glassllm.inspector.views.timeline_answer`)."""
        if self.timeline is None:
            raise ValueError("this model has no training timeline (train with --timeline-points, or open "
                             "a run folder with --run)")
        if self._timeline_answer is None:
            self._timeline_answer = views.timeline_answer(self.timeline, self._vocab)
        return self._timeline_answer

    # ------------------------------------------------------------------ next token
    def next_token(self, req: NextRequest) -> dict:
        """Logits of the last position, survivors of top-k / top-p, and before/after an intervention."""
        ids = self.encode(req.prompt)
        requests.check_top_k(req, self.config)
        requests.check_step_zero(req)
        self._check_intervention(req.intervention, len(ids))
        run = self._run_for(ids, req.step, None, None, False)
        out = views.next_view(run, req, self._vocab)
        out["finished"] = self._finished(ids, req.step, run)
        if req.intervention is not None:
            after = self._run_for(ids, 0, req.intervention, None, False)
            out["after"] = views.distribution(after.logits, req)
        return out

    # ------------------------------------------------------------------ runs
    def _check_intervention(self, iv: InterventionBody | None, n: int) -> None:
        """Refuse an intervention this model and an n-token prompt cannot take, naming the bad field."""
        requests.check_intervention(iv, self.axes, self.config, n)

    def _finished(self, ids: list[int], step: int, run: Run) -> str | None:
        """Why greedy decoding cannot take a step after pass ``step`` (None if it can)."""
        return self.runs.finished(ids, step, run)

    def _run_for(self, ids: list[int], step: int, iv: InterventionBody | None, target: int | None,
                 grad: bool) -> Run:
        return self.runs.run_for(ids, step, iv, target, grad)

    def ready(self, req) -> bool:
        """Can ``req`` be answered from passes already traced, without running the model? (A quick guess
        from dictionaries, no tokenizing: the server sends such requests to a lane of their own, so that
        switching views never waits behind another prompt's forward pass.)"""
        if isinstance(req, TimelineRequest):
            return self._timeline_answer is not None
        if not isinstance(req, (SnapshotRequest, NextRequest, HeadsRequest, LensRequest)):
            return True                     # tokenizing: at most 20,000 characters, no model
        with self._ids_lock:
            ids = self._ids.get(req.prompt)
        if ids is None:
            return False
        runs = self.runs
        if isinstance(req, LensRequest):
            try:
                keys = [runs.lens_key(ids, *requests.check_lens_window(req, len(ids)))]
            except ValueError:
                return True                 # refused at once, without the model
        elif isinstance(req, SnapshotRequest):
            keys = [runs.decode_key(ids, req.step) if req.step else
                    runs.prompt_key(ids, req.intervention, req.target, req.grad)]
        elif isinstance(req, NextRequest):
            keys = [runs.decode_key(ids, req.step) if req.step else runs.prompt_key(ids, None, None, False)]
            if req.intervention is not None:
                keys.append(runs.prompt_key(ids, req.intervention, None, False))
        else:
            keys = [runs.prompt_key(ids, req.intervention, req.target, req.grad)]
        return runs.cached(keys)


def _as_lens(req) -> LensRequest:
    """A lens request from a plain prompt request (the default window), as callers before windows sent."""
    return req if isinstance(req, LensRequest) else LensRequest(prompt=req.prompt)
