"""The inspector's data layer: a model, a tokenizer and a request in; a JSON-ready answer out.

This is the only part of the inspector that runs the model. The server
(:mod:`glassllm.inspector.server`) and the offline export
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

Forward passes are traced with :mod:`glassllm.trace`, always with the
gradients of the next-token loss, and kept in a :class:`~glassllm.inspector.cache.TraceCache`
(bounded in bytes, least recently used out first) under a key of the model's
digest, the prompt's ids, the intervention and the gradient's target: switching
layer, head, snapshot or value/gradient only slices arrays that are already
computed, and identical requests that arrive together are computed once.
Decoding steps come from :func:`glassllm.generate.generate` (greedy, module
path, KV cache), traced the same way, a few steps ahead.

Requests may come from many threads at once: each thread that computes runs
its own copy of the model, which shares the weights' arrays (a tracer attaches
to a model, so two traces cannot share one).
"""

from __future__ import annotations

import base64
import copy
import threading
from collections import OrderedDict

import numpy as np

from .. import kernels
from ..nn import causal_mask
from ..sampling import sampling_distribution
from ..trace import Tracer, registry
from ..trace.explain import explain
from ..trace.registry import axis_sizes
from .cache import TraceCache, model_digest, nbytes
from .schema import (
    AttributionRequest, HeadsRequest, Intervention, Limits, NextRequest, PromptRequest, SnapshotRequest, TimelineRequest, shown,
)

__all__ = ["Inspector", "encode_array", "pool"]

# Axis letters that select a head; the slice keeps the two axes after it.
HEAD_AXES = ("H", "G")
# The head grid's thumbnails hold at most this many rows and columns; longer prompts are averaged in blocks.
THUMB_CELLS = 64
# Which snapshot names (without their layer prefix) the page groups under which heading.
GROUPS = (
    ("residual stream", ("resid_pre", "resid_mid", "resid_post", "embed")),
    ("attention", ("attn_norm.", "attn.")),
    ("MLP", ("mlp_norm.", "mlp.")),
    ("output", ("norm.", "logits", "probs")),
)


def encode_array(a: np.ndarray) -> dict:
    """An array as exact little-endian bytes in base64: ``{"dtype", "shape", "b64"}``.

    Floats travel bit for bit (no decimal rounding, and -inf survives), so the
    page shows exactly the numbers the tracer recorded.
    """
    a = np.asarray(a)
    kinds = {"f": {2: "float16", 4: "float32", 8: "float64"}, "b": {1: "uint8"}, "u": {1: "uint8"}}
    dtype = kinds.get(a.dtype.kind, {}).get(a.dtype.itemsize)
    if dtype is None:
        a, dtype = a.astype(np.float64), "float64"
    data = np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<"))
    return {"dtype": dtype, "shape": list(a.shape), "b64": base64.b64encode(data.tobytes()).decode("ascii")}


class _Run:
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
        a = read(full, head=head, step=self.step)
        if a.dtype.kind == "f" and not np.isfinite(a).all():       # a lazy trace's block, computed just now
            raise ValueError(f"{'the gradient of ' if grad else ''}{shown(full)} contains NaN or inf: the model's "
                             "numbers overflow, so its output is broken")
        return a


class Inspector:
    """Answers the page's requests for one model.

    ``model``: a :class:`~glassllm.nn.Transformer`; ``tokenizer``: its
    tokenizer (:class:`~glassllm.tokenizing.TextTokenizer`: byte-level or SentencePiece);
    ``limits``: what one request may cost (the prompt is capped to fit the context); ``timeline``: the
    :class:`~glassllm.timeline.Timeline` of the run that trained it, if there is one (the page's Training
    tab); ``cache``: where traced passes are kept (default: a new
    :class:`~glassllm.inspector.cache.TraceCache` of ``cache_mb`` MB). Thread-safe: each computing thread
    runs its own copy of the model.
    """

    timeline = None                 # the run's Timeline, if the model has one
    _timeline_answer = None         # its answer, made once

    def __init__(self, model, tokenizer, limits: Limits | None = None, meta: dict | None = None,
                 cache: TraceCache | None = None, cache_mb: float = 512, timeline=None):
        if tokenizer.vocab_size != model.config.vocab_size:
            raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but the model expects "
                             f"{model.config.vocab_size}")
        self.model, self.tokenizer = model, tokenizer
        self.config = model.config
        self.limits = (limits or Limits()).fit(model.config.max_seq_len)
        self.meta = dict(meta or {})
        self.axes = registry(model)                             # full name -> axis letters, forward order
        if isinstance(cache_mb, bool) or not isinstance(cache_mb, (int, float)) or not cache_mb >= 0:
            raise ValueError(f"cache_mb must be a number >= 0, got {cache_mb!r}")
        self.cache = cache if cache is not None else TraceCache(int(cache_mb * 2**20))
        self.model_key = model_digest(model)
        self._local = threading.local()
        self._ids: OrderedDict[str, list[int]] = OrderedDict()      # prompt -> ids, the last 256 prompts
        self._ids_lock = threading.Lock()
        self._vocab = tokenizer.pieces(range(tokenizer.vocab_size))
        if timeline is not None and timeline.config != model.config:
            raise ValueError(f"the timeline was recorded for another model shape ({timeline.config}) than this "
                             f"model's ({model.config})")
        self.timeline = timeline
        self._timeline_answer = None

    # ------------------------------------------------------------------ names
    def local_names(self) -> list[str]:
        """Snapshot names as the page lists them: layer 0's names without ``layers.0.``, then the rest."""
        out = []
        for full in self.axes:
            if full.startswith("layers.0."):
                out.append(full.removeprefix("layers.0."))
            elif not full.startswith("layers."):
                out.append(full)
        return out

    def full_name(self, name: str, layer: int | None) -> str:
        """``attn.softmax`` + layer 2 -> ``layers.2.attn.softmax``; checks both against the registry."""
        if name in self.axes and not name.startswith("layers."):
            if layer is not None:
                raise ValueError(f"snapshot {name!r} is outside the layers; send layer null, got layer {layer}")
            return name
        if f"layers.0.{name}" not in self.axes:
            raise ValueError(f"unknown snapshot {name[:64]!r}; expected one of: {', '.join(self.local_names())}")
        L = self.config.n_layers
        if layer is None:
            raise ValueError(f"snapshot {name!r} is inside the layers: send a layer in 0..{L - 1}")
        if not 0 <= layer < L:
            raise ValueError(f"layer {layer} is out of range: this model has layers 0..{L - 1}")
        return f"layers.{layer}.{name}"

    def _heads(self, axes) -> tuple[str | None, int]:
        """A snapshot's head axis ("H" query heads, "G" key/value heads, or None) and how many heads it has."""
        head_axis = next((a for a in axes if a in HEAD_AXES), None)
        return head_axis, {"H": self.config.n_heads, "G": self.config.n_kv_heads}.get(head_axis, 0)

    # ------------------------------------------------------------------ info
    def info(self) -> dict:
        c = self.config
        names = []
        for local in self.local_names():
            full = local if local in self.axes else f"layers.0.{local}"
            axes = self.axes[full]
            head_axis, heads = self._heads(axes)
            names.append({
                "name": local, "axes": list(axes), "in_layer": full.startswith("layers."),
                "head_axis": head_axis, "heads": heads,
                "group": _group(local), "explain": _explain(local),
            })
        return {
            "model": {**c.to_dict(), "head_dim": c.head_dim, "params": self.model.num_params(),
                      "dtype": str(self.model.dtype)},
            "meta": {k: v for k, v in self.meta.items() if k in ("step", "valid_loss", "valid_bits_per_byte")},
            "names": names,
            "vocab": self._vocab,
            "eot_id": _eot(self.tokenizer),
            "end_ids": list(self.tokenizer.end_ids),
            "tokenizer": self.tokenizer.kind,
            "timeline": None if self.timeline is None else {
                "steps": len(self.timeline.steps), "last": self.timeline.steps[-1], "tokens": len(self.timeline.ids)},
            "limits": {"max_prompt_tokens": self.limits.max_prompt_tokens,
                       "max_new_tokens": self.limits.max_new_tokens, "max_cells": self.limits.max_cells},
        }

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
        limit = self.limits.max_prompt_tokens
        if not ids:
            raise ValueError("prompt is empty: type at least one character")
        if len(ids) > limit:
            raise ValueError(f"prompt has {len(ids)} tokens; this inspector takes at most {limit} "
                             f"(--max-prompt-tokens, at most the context {self.config.max_seq_len} - 1)")
        return ids

    def tokens(self, req: PromptRequest) -> dict:
        ids = self.encode(req.prompt)
        return {"ids": ids, "pieces": [self._vocab[i] for i in ids]}

    def check_pass(self, prompt: str) -> None:
        """Encode ``prompt`` and run its pass (cached): a bad prompt, or a model whose pass is not finite,
        raises the ValueError line the server answers with."""
        self._prompt_run(self.encode(prompt), None, None, True)

    # ------------------------------------------------------------------ logit lens, attribution
    def lens(self, req: PromptRequest) -> dict:
        """The logit lens of the prompt: for every residual stream (rows: the embedding, each layer's
        input, the last layer's output) and position, the most likely token and its probability."""
        from ..trace import lens_top

        ids = self.encode(req.prompt)
        self._prompt_run(ids, None, None, True)                          # refuses a non-finite pass (cached)
        top, prob = lens_top(self._replica(), ids)                      # this thread's copy of the model
        rows = np.asarray(top).tolist()                                  # (L+1, n) token ids
        return {"streams": list(top.labels[0]), "pieces": [self._vocab[i] for i in ids], "top": rows,
                "top_pieces": [[self._vocab[i] for i in row] for row in rows],
                "prob": np.asarray(prob, dtype=np.float64).tolist()}

    def attribution(self, req: AttributionRequest) -> dict:
        """Direct logit attribution at one position: each head's and MLP's share of one logit,
        the final norm's scale frozen (the shares sum to the logit)."""
        from ..trace import direct_attribution

        ids = self.encode(req.prompt)
        n, V = len(ids), self.config.vocab_size
        position = n - 1 if req.position is None else req.position
        if position >= n:
            raise ValueError(f"position {position} is out of range: the prompt has positions 0..{n - 1}")
        if req.token is not None and req.token >= V:
            raise ValueError(f"token {req.token} is out of range: token ids are 0..{V - 1}")
        self._prompt_run(ids, None, None, True)                          # refuses a non-finite pass (cached)
        bars = direct_attribution(self._replica(), ids, position, req.token)
        token = bars.baseline["token"]
        return {"labels": bars.labels[0], "values": np.asarray(bars, dtype=np.float64).tolist(),
                "total": bars.baseline["total"], "token": token, "piece": self._vocab[token],
                "position": position, "pieces": [self._vocab[i] for i in ids]}

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, req: SnapshotRequest) -> dict:
        """One (rows, cols) slice of a snapshot: see the module docstring."""
        full = self.full_name(req.name, req.layer)
        axes = self.axes[full]
        head_axis, heads = self._heads(axes)
        if head_axis is None and req.head is not None:
            raise ValueError(f"snapshot {req.name!r} has no head axis (axes {axes}); send head null")
        if head_axis is not None:
            if req.head is None:
                raise ValueError(f"snapshot {req.name!r} has {heads} heads: send a head in 0..{heads - 1}")
            if not 0 <= req.head < heads:
                raise ValueError(f"head {req.head} is out of range: {req.name!r} has heads 0..{heads - 1}")
        if req.grad and req.step:
            raise ValueError(f"gradients are shown for the prompt's pass only (step 0), got step {req.step}")
        if req.intervention is not None and req.step:
            raise ValueError(f"interventions apply to the prompt's pass only (step 0), got step {req.step}")
        self._check_target(req)
        ids = self.encode(req.prompt)
        self._check_intervention(req.intervention, len(ids))
        self._check_cells(full, axes, len(ids), req.step)                # before any forward runs

        run = self._run_for(ids, req.step, req.intervention, req.target if req.grad else None, req.grad)
        a = run.get(full, req.head, req.grad)                            # head axis dropped
        row_axes = axes[1:] if head_axis is not None else axes
        assert head_axis is None or axes[0] == head_axis
        if a.ndim == 1:
            a = a[:, None]                                               # (n,) -> (n, 1)
            row_axes = (row_axes[0], "")
        rows, cols = a.shape
        if rows * cols > self.limits.max_cells:
            raise ValueError(f"snapshot {full!r} has {rows} x {cols} = {rows * cols} values; this inspector "
                             f"sends at most {self.limits.max_cells} (--max-cells)")

        m = len(run.ids)
        n = m - run.start
        pieces = [self._vocab[i] for i in run.ids]
        labels = {"n": (pieces[run.start:], list(range(run.start, m))), "m": (pieces, list(range(m)))}
        row_labels, row_pos = labels.get(row_axes[0], ([], []))
        col_kind = {"n": "token", "m": "token", "V": "vocab", "": "none"}.get(row_axes[1], "feature")
        col_labels = labels[row_axes[1]][0] if col_kind == "token" else None

        masked = None
        if row_axes == ("n", "m") or full.endswith("attn.mask"):
            layer_mask = run.get(full.rsplit(".", 1)[0] + ".mask", None, False)  # (n, m) True = forbidden
            masked = encode_array(layer_mask.astype(np.uint8))
        out = {
            "name": full, "local": req.name, "layer": req.layer, "head": req.head,
            "head_axis": head_axis, "heads": heads, "axes": list(row_axes), "shape": [rows, cols],
            "step": req.step, "grad": req.grad, "n": n, "m": m, "start": run.start,
            "rows": row_labels, "row_pos": row_pos, "cols": col_labels, "col_kind": col_kind,
            "values": encode_array(a), "masked": masked,
            # A plain request may be served by a cached run with gradients: its target is not this answer's.
            "target": run.target if req.grad else None,
            "target_piece": self._vocab[run.target] if req.grad and run.target is not None else None,
        }
        return out

    def _check_cells(self, full: str, axes, n_prompt: int, step: int) -> None:
        """Refuse a view larger than --max-cells from the shapes alone, before the model runs."""
        n, m = (n_prompt, n_prompt) if not step else (1, n_prompt + step)
        sizes = axis_sizes(self.config, n, m)
        cells = int(np.prod([sizes[a] for a in axes if a not in HEAD_AXES]))
        if cells > self.limits.max_cells:
            shape = " x ".join(str(sizes[a]) for a in axes if a not in HEAD_AXES)
            raise ValueError(f"snapshot {full!r} has {shape} = {cells} values; this inspector "
                             f"sends at most {self.limits.max_cells} (--max-cells)")

    def _check_target(self, req) -> None:
        """A gradient request's target: only with ``grad``, and a token id of the vocabulary."""
        if req.target is not None and not req.grad:
            raise ValueError(f"target {req.target} is only used with grad true (the token whose loss is differentiated)")
        if req.target is not None and req.target >= self.config.vocab_size:
            raise ValueError(f"target {req.target} is out of range [0, {self.config.vocab_size})")

    # ------------------------------------------------------------------ the head grid
    def heads(self, req: HeadsRequest) -> dict:
        """Every layer's and head's ``attn.softmax`` (or its gradient) of the prompt's pass, as thumbnails.

        ``values``: (L, H, r, c) float32, the (n, n) patterns averaged over f x f blocks of query and key
        positions (f = ceil(n / 64), so r = c = ceil(n / f); f = 1 keeps every cell); ``masked``: (L, r, c),
        1 where every cell of a block is a forbidden key. The masked cells of ``values`` are 0.
        """
        self._check_target(req)
        ids = self.encode(req.prompt)
        self._check_intervention(req.intervention, len(ids))
        run = self._run_for(ids, 0, req.intervention, req.target if req.grad else None, req.grad)
        L, n = self.config.n_layers, len(ids)
        f = -(-n // THUMB_CELLS)
        weights, masks = [], []
        # The weights alone: one forward for every layer (a lazy trace's across); gradients: block by block.
        every = run.trace.across("attn.softmax", "attn.mask") if not req.grad and hasattr(run.trace, "across") else {}
        for layer in range(L):
            a = every.get(f"layers.{layer}.attn.softmax")
            a = run.get(f"layers.{layer}.attn.softmax", None, req.grad) if a is None else a    # (H, n, n)
            mask = every.get(f"layers.{layer}.attn.mask")
            mask = run.get(f"layers.{layer}.attn.mask", None, False) if mask is None else mask  # (n, n) True = forbidden
            pooled, blocked = pool(a, mask, f)
            weights.append(pooled)
            masks.append(blocked)
        return {"layers": L, "heads": self.config.n_heads, "n": n, "block": f, "grad": req.grad,
                "pieces": [self._vocab[i] for i in ids],
                "values": encode_array(np.stack(weights).astype(np.float32)),       # (L, H, r, r)
                "masked": encode_array(np.stack(masks).astype(np.uint8)),           # (L, r, r)
                "target": run.target if req.grad else None,
                "target_piece": self._vocab[run.target] if req.grad and run.target is not None else None}

    # ------------------------------------------------------------------ the training timeline
    def timeline_view(self) -> dict:
        """The run's probe history for the Training tab (see :mod:`glassllm.timeline`).

        ``attn`` (S, L, H, n, n) and ``probs`` (S, V) travel as float16 (as the file stores them),
        ``induction`` (S, L, H) as float32; ``rows``, ``history`` and ``steps`` as the file has them.
        """
        tl = self.timeline
        if tl is None:
            raise ValueError("this model has no training timeline (train with --timeline-points, or open "
                             "a run folder with --run)")
        if self._timeline_answer is None:
            self._timeline_answer = {
                "ids": tl.ids, "pieces": [self._vocab[i] for i in tl.ids], "period": tl.period,
                "steps": tl.steps, "rows": tl.rows, "history": tl.history,
                "attn": encode_array(tl.attn.astype(np.float16)),                 # (S, L, H, n, n)
                "probs": encode_array(tl.probs.astype(np.float16)),               # (S, V)
                "induction": encode_array(tl.induction.astype(np.float32)),       # (S, L, H)
            }
        return self._timeline_answer

    # ------------------------------------------------------------------ next token
    def next_token(self, req: NextRequest) -> dict:
        """Logits of the last position, survivors of top-k / top-p, and before/after an intervention."""
        ids = self.encode(req.prompt)
        V = self.config.vocab_size
        if req.top_k is not None and req.top_k > V:
            raise ValueError(f"top_k {req.top_k} is out of range: this vocabulary has {V} ids")
        if req.intervention is not None and req.step:
            raise ValueError(f"interventions apply to the prompt's pass only (step 0), got step {req.step}")
        self._check_intervention(req.intervention, len(ids))
        run = self._run_for(ids, req.step, None, None, False)
        out = {"step": req.step, "position": len(run.ids) - 1, "m": len(run.ids), "start": run.start,
               "tokens": [self._vocab[i] for i in run.ids], "ids": run.ids,
               "paths": kernels.summary(run.trace.steps[run.step].paths),
               **self._distribution(run.logits, req)}
        if req.step:
            out["fed"] = {"id": run.ids[-1], "piece": self._vocab[run.ids[-1]]}
        out["finished"] = self._finished(ids, req.step, run)
        if req.intervention is not None:
            after = self._run_for(ids, 0, req.intervention, None, False)
            out["after"] = self._distribution(after.logits, req)
        return out

    def _distribution(self, logits: np.ndarray, req: NextRequest) -> dict:
        dist = sampling_distribution(logits, req.temperature, req.top_k, req.top_p)  # (V,) float64
        survivors = np.flatnonzero(dist > 0)
        survivors = survivors[np.lexsort((survivors, -dist[survivors]))]
        return {"logits": encode_array(logits), "sampled": encode_array(dist),
                "survivors": [int(i) for i in survivors]}

    # ------------------------------------------------------------------ runs
    def _check_intervention(self, iv: Intervention | None, n: int) -> None:
        """Refuse an intervention this model and an n-token prompt cannot take, naming the bad field."""
        if iv is None:
            return
        L, H = self.config.n_layers, self.config.n_heads
        if iv.layer >= L:
            raise ValueError(f"intervention layer {iv.layer} is out of range: this model has layers 0..{L - 1}")
        if iv.kind != "edit" and any(v is not None for v in (iv.name, iv.row, iv.col, iv.value)):
            raise ValueError(f"intervention {iv.kind!r} takes no name, row, col or value (those are for 'edit')")
        if iv.kind == "edit":
            self._check_edit(iv, n)
            return
        if iv.head is not None and iv.head >= H:
            raise ValueError(f"intervention head {iv.head} is out of range: attention has heads 0..{H - 1}")
        if iv.kind == "ablate" and iv.head is None:
            raise ValueError("intervention 'ablate' needs a head")
        if iv.kind == "temperature" and iv.temperature is None:
            raise ValueError("intervention 'temperature' needs a temperature (a number in (0, 100])")
        if iv.kind != "temperature" and iv.temperature is not None:
            raise ValueError(f"intervention {iv.kind!r} takes no temperature; got {iv.temperature}")
        if iv.kind == "mask_off" and iv.head is not None:
            raise ValueError("intervention 'mask_off' switches the mask off for the whole layer; send head null")

    def _check_edit(self, iv: Intervention, n: int) -> None:
        missing = [f for f in ("name", "row", "col", "value") if getattr(iv, f) is None]
        if missing:
            raise ValueError(f"intervention 'edit' needs {', '.join(missing)}")
        if iv.temperature is not None:
            raise ValueError(f"intervention 'edit' takes no temperature; got {iv.temperature}")
        full = f"layers.{iv.layer}.{iv.name}"
        if full not in self.axes:
            inside = sorted({k.split(".", 2)[2] for k in self.axes if k.startswith("layers.0.")})
            raise ValueError(f"intervention 'edit': {shown(iv.name)} is not a snapshot inside the blocks; "
                             f"expected one of {', '.join(inside)}")
        if iv.name == "attn.mask":
            raise ValueError("intervention 'edit' cannot set the boolean attn.mask; use 'mask_off'")
        axes = self.axes[full]
        head_axis, heads = self._heads(axes)
        if head_axis is None and iv.head is not None:
            raise ValueError(f"intervention 'edit': {iv.name!r} has no head axis; send head null")
        if head_axis is not None and (iv.head is None or iv.head >= heads):
            raise ValueError(f"intervention 'edit': {iv.name!r} needs a head in 0..{heads - 1}, got {iv.head}")
        sizes = axis_sizes(self.config, n, n)
        matrix = [sizes[a] for a in axes if a not in HEAD_AXES] + [1]    # (rows, cols[, 1]): a (n,) shows as (n, 1)
        rows, cols = matrix[0], matrix[1]
        if iv.row >= rows or iv.col >= cols:
            raise ValueError(f"intervention 'edit': cell ({iv.row}, {iv.col}) is outside {iv.name!r}, "
                             f"which is {rows} x {cols} for this prompt")
        if iv.name in ("attn.scores", "attn.softmax") and causal_mask(n, n)[iv.row, iv.col]:
            # (the prompt's pass: no cache, no padding)
            raise ValueError(f"intervention 'edit': cell ({iv.row}, {iv.col}) of {iv.name!r} is a future key, "
                             "masked by rule (its weight is 0 whatever the score); switch the mask off with "
                             "'mask_off' to let queries read the future")

    def _finished(self, ids: list[int], step: int, run: _Run) -> str | None:
        """Why greedy decoding cannot take a step after pass ``step`` (None if it can)."""
        top = int(np.argmax(run.logits))
        if top in self.tokenizer.end_ids:
            return f"the model's top choice is {self.tokenizer.piece(top)}: the text ends here"
        if step + 1 > self.limits.max_new_tokens:
            return f"this inspector stops after {self.limits.max_new_tokens} steps (--max-new-tokens)"
        if len(ids) + step + 1 >= self.config.max_seq_len:
            return f"the context of {self.config.max_seq_len} positions is full"
        return None

    def _run_for(self, ids: list[int], step: int, iv: Intervention | None, target: int | None,
                 grad: bool) -> _Run:
        if step == 0:
            return self._prompt_run(ids, iv, target, grad)
        if step > self.limits.max_new_tokens:
            raise ValueError(f"step {step} is beyond this inspector's {self.limits.max_new_tokens} "
                             "generation steps (--max-new-tokens)")
        if len(ids) + step >= self.config.max_seq_len:
            raise ValueError(f"step {step} after a {len(ids)}-token prompt would exceed the context of "
                             f"{self.config.max_seq_len} positions")
        return self._step_run(ids, step)

    def _replica(self):
        """This thread's copy of the model: its own modules (and tracer slot), the model's weight arrays."""
        model = getattr(self._local, "model", None)
        if model is None:
            shared = {id(p.data): p.data for p in self.model.parameters()}
            model = self._local.model = copy.deepcopy(self.model, shared)
        return model

    def _prompt_key(self, ids, iv, target, grad) -> tuple:
        return (self.model_key, "prompt", tuple(ids), None if iv is None else iv.model_dump_json(),
                target if grad else None)

    def _decode_key(self, ids, step) -> tuple:
        # Decode a few steps ahead (8, 16, 32 ... passes), so stepping on is a lookup.
        want = min(max(8, 1 << step.bit_length()), self.limits.max_new_tokens + 1,
                   self.config.max_seq_len - len(ids))
        return (self.model_key, "decode", tuple(ids), want)

    def _prompt_run(self, ids, iv, target, grad) -> _Run:
        """The prompt's pass, traced with gradients (d loss of ``target``, default the top choice)."""
        keep = max(self.cache.max_bytes // 4, 1)                          # a run's computed blocks
        def compute():
            # With no target, the model's own top choice under the same intervention: read from the
            # trace's own forward, then back-propagated (one forward, one backward).
            return _trace_prompt(self._replica(), ids, iv, True, target if grad else None, keep)
        return self.cache.get(self._prompt_key(ids, iv, target, grad), compute, size=_run_bytes)

    def _step_run(self, ids, step) -> _Run:
        key = self._decode_key(ids, step)
        passes = self.cache.get(key, lambda: _trace_decoding(self._replica(), self.tokenizer, ids, key[-1]),
                                size=lambda runs: _run_bytes(runs[1]) if len(runs) > 1 else 0)
        if step >= len(passes):
            raise ValueError(f"greedy decoding of this prompt ended (end-of-text) after step "
                             f"{len(passes) - 1}; there is no step {step}")
        return passes[step]

    def ready(self, req) -> bool:
        """Can ``req`` be answered from passes already traced, without running the model? (A quick guess
        from dictionaries, no tokenizing: the server sends such requests to a lane of their own, so that
        switching views never waits behind another prompt's forward pass.)"""
        if isinstance(req, TimelineRequest):
            return self._timeline_answer is not None
        if not isinstance(req, (SnapshotRequest, NextRequest, HeadsRequest)):
            return True                     # tokenizing: at most 20,000 characters, no model
        with self._ids_lock:
            ids = self._ids.get(req.prompt)
        if ids is None:
            return False
        if isinstance(req, SnapshotRequest):
            keys = [self._decode_key(ids, req.step) if req.step else
                    self._prompt_key(ids, req.intervention, req.target, req.grad)]
        elif isinstance(req, NextRequest):
            keys = [self._decode_key(ids, req.step) if req.step else self._prompt_key(ids, None, None, False)]
            if req.intervention is not None:
                keys.append(self._prompt_key(ids, req.intervention, None, False))
        else:
            keys = [self._prompt_key(ids, req.intervention, req.target, req.grad)]
        return all(self.cache.peek(k) is not None for k in keys)


def _run_bytes(run: _Run) -> int:
    """Bytes a traced run holds: every step's values and gradients (a lazy trace: what it may grow to)."""
    reserved = getattr(run.trace, "reserved_bytes", None)
    if reserved is not None:
        return reserved
    return nbytes(*[(s.values, s.grads) for s in run.trace.steps])


def pool(a: np.ndarray, mask: np.ndarray, f: int) -> tuple[np.ndarray, np.ndarray]:
    """Average (..., n, m) ``a`` over f x f blocks, leaving out the cells ``mask`` (n, m) forbids.

    Returns the (..., r, c) means (r = ceil(n / f), c = ceil(m / f); 0 where a whole block is masked)
    and the (r, c) blocks that are masked throughout.

    >>> a = np.arange(16.0).reshape(4, 4); m = np.triu(np.ones((4, 4), bool), 1)
    >>> pool(a, m, 2)[0].tolist(), pool(a, m, 2)[1].tolist()
    ([[3.0, 0.0], [10.5, 13.0]], [[False, True], [False, False]])
    """
    if f == 1:
        return np.where(mask, 0, a), mask.copy()
    n, m = mask.shape
    r, c = -(-n // f), -(-m // f)
    keep = np.zeros((r * f, c * f))
    keep[:n, :m] = ~mask
    grid = np.zeros(a.shape[:-2] + (r * f, c * f))
    grid[..., :n, :m] = np.where(mask, 0, a)
    keep = keep.reshape(r, f, c, f)                                        # (r, f, c, f)
    grid = grid.reshape(a.shape[:-2] + (r, f, c, f))                      # (..., r, f, c, f)
    count = keep.sum(axis=(1, 3))                                         # (r, c)
    total = grid.sum(axis=(-3, -1))                                       # (..., r, c)
    return np.where(count > 0, total / np.maximum(count, 1), 0), count == 0


def _explain(local: str) -> dict:
    """What the page shows beside a snapshot: its equation (LaTeX and text), the statement of ``nn.py`` that
    records it with the lines around it (:func:`glassllm.trace.explain.explain`)."""
    info = explain(local)
    return {k: info[k] for k in ("equation", "description", "path", "function", "line", "first", "last", "code",
                                 "context")}


def _group(local: str) -> str:
    for title, prefixes in GROUPS:
        if any(local == p or (p.endswith(".") and local.startswith(p)) for p in prefixes):
            return title
    return "other"


def _eot(tokenizer) -> int | None:
    try:
        return tokenizer.eot_id
    except ValueError:
        return None


# ----------------------------------------------------------------------------
# The tracer calls (glassllm.trace): the only place the model runs
# ----------------------------------------------------------------------------

def _edits(iv: Intervention | None) -> list:
    """The page's intervention as the tracer's."""
    from .. import trace as tr

    if iv is None:
        return []
    if iv.kind == "ablate":
        return [tr.ZeroAblate(iv.layer, iv.head)]
    if iv.kind == "mask_off":
        return [tr.MaskOff(layers=[iv.layer])]
    if iv.kind == "edit":
        cell = ((iv.head,) if iv.head is not None else ()) + (iv.row,)

        def set_cell(a):                                                 # one batch row, batch axis removed
            index = cell + ((iv.col,) if a.ndim > len(cell) else ())     # a (n,) snapshot has no col
            a[index] = iv.value
            return a
        return [tr.Edit(f"layers.{iv.layer}.{iv.name}", set_cell)]
    return [tr.Temperature(iv.temperature, layers=[iv.layer], heads=iv.head)]


def _trace_prompt(model, ids, iv, grad, target, keep_bytes: int = 128 << 20) -> _Run:
    """One traced forward of the prompt; with ``grad``, also d(-log p(target) at the last position)/d snapshot
    (``target`` None: the model's top choice).

    The trace is lazy (:class:`~glassllm.trace.LazyTrace`): it keeps the residual stream between the
    blocks (and the gradient arriving at each), and computes a block's snapshots when a view reads
    them, keeping up to ``keep_bytes`` of computed blocks. ValueError if an edit (a number set by hand,
    e.g. an rms of 0) makes the logits non-finite.
    """
    from ..trace import LazyTrace

    tokens = np.array(ids)                                               # (n,)
    edit = iv is not None and iv.kind == "edit"
    with np.errstate(all="ignore"):                                      # overflow is refused below instead
        lazy = LazyTrace(model, tokens, None, _edits(iv), keep_bytes=keep_bytes)
        if not np.isfinite(lazy.last_logits).all():
            target = None                                                # refused below, before any backward
        elif grad:
            if target is None:
                target = int(np.argmax(lazy.last_logits))
            # Cross-entropy only at the last position: every other target is ignored (-100).
            targets = np.full(len(ids), -100)
            targets[-1] = target
            lazy.backward(targets)
        run = _Run(lazy, 0, list(ids), target if grad else None)
    if edit and not np.isfinite(run.logits).all():
        raise ValueError(f"this intervention makes the forward pass non-finite (NaN or inf logits): "
                         f"{shown(iv.name)} = {iv.value} is outside what the model can compute with "
                         "(an rms of 0 divides by zero)")
    if not np.isfinite(run.logits).all():
        raise ValueError("logits contain NaN or +inf: the model's output is broken")
    refuse_non_finite(run.trace)                 # what the lazy trace holds now; _Run.get checks the rest
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


def _trace_decoding(model, tokenizer, ids, passes: int) -> list[_Run | None]:
    """Greedy decoding with the KV cache, traced: one _Run per forward pass after the prompt's
    (entry 0 is None: the prompt's own pass is :func:`_trace_prompt`'s, so it is not recorded here)."""
    from ..generate import generate

    with np.errstate(all="ignore"), _AfterPrompt(model) as tracer:      # overflow is refused below instead
        chosen = [tok.id for tok in generate(model, tokenizer, ids, max_new_tokens=passes,
                                             temperature=0, fast=False)]
    t = tracer.trace
    refuse_non_finite(t)
    seq = list(ids) + chosen
    return [None] + [_Run(t, s, seq[: step.m], None) for s, step in enumerate(t.steps) if s > 0]


class _AfterPrompt(Tracer):
    """A tracer that records nothing of the first forward (the prompt). Every layer still runs its
    reference code there, as under a tracer of every name, so the keys cached for the later passes
    are those of a full trace, bit for bit."""

    def wants(self, names) -> bool:
        return len(self.steps) <= 1 or super().wants(names)

    def record(self, name, t):
        return t if len(self.steps) <= 1 else super().record(name, t)

