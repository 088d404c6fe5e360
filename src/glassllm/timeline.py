"""A training timeline: one probe prompt, looked at again and again while a model trains.

A trained model is a still photograph. A :class:`Timeline` is the film: at
log-spaced steps of a run (0 = the random initialisation, then 1, 2, 3, 4, 6,
... up to the last step) the trainer runs a fixed *probe* through the model and
keeps, for that step,

- the attention weights of every layer and head on the probe, (L, H, n, n);
- the next-token distribution at the probe's last position, (V,);
- each head's *induction score*: the probe is a span of P tokens written twice,
  so a head that copies puts its weight, for query i >= P, on key i - P + 1 (the
  token after the earlier occurrence of the current one); the score is that
  weight averaged over the second copy, (L, H);
- the training loss, the held-out loss and bits per byte (when the run has
  held-out text), and a short sample of generated text.

The whole history is a few hundred KB (weights stored as float16), saved next to
the run's checkpoints as ``timeline.safetensors`` and resumed with it;
``glassllm inspect --run RUN`` plays it back with a step slider.

>>> from glassllm.nn import Transformer
>>> from glassllm.config import ModelConfig
>>> from glassllm.tokenizers import Tokenizer
>>> tok = Tokenizer.train("the cat sat on the mat. " * 20, vocab_size=260)
>>> model = Transformer(ModelConfig(vocab_size=260, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
...                                 ffn_dim=64, max_seq_len=64), seed=0)
>>> tl = Timeline.for_model(model, tok, steps=100, points=8, span="the cat sat")
>>> tl.schedule
[0, 1, 2, 4, 7, 14, 27, 52, 100]
>>> tl.record(model, tok, step=0, tokens=0, lr=None, train_loss=None)
>>> tl.attn.shape == (1, 2, 4, 2 * tl.period, 2 * tl.period), tl.induction.shape
(True, (1, 2, 4))
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import ModelConfig
from .limits import parse_json

__all__ = ["Timeline", "load_timeline", "timeline_path_for", "log_steps", "sample_text", "PROBE_SPAN", "SAMPLE_PROMPT",
           "TIMELINE_FORMAT", "TIMELINE_VERSION"]

TIMELINE_FORMAT = "glassllm timeline"
TIMELINE_VERSION = "1"
# The probe: a short sentence, written twice. Copying the second copy from the
# first is the induction heads' job, so their pattern shows up as a stripe.
PROBE_SPAN = "Max the dog found a red ball in the park."
# Samples printed at each evaluation (and kept in the timeline) continue this prompt.
SAMPLE_PROMPT = "Once upon a time"
SAMPLE = {"temperature": 0.8, "top_k": 40, "seed": 0, "max_new_tokens": 40}
HISTORY_ROWS = 600        # at most this many rows of the run's per-step history are kept for the curve


def sample_text(model, tokenizer) -> str:
    """The sample a run prints at each evaluation: :data:`SAMPLE_PROMPT` continued with the fixed
    :data:`SAMPLE` settings (its own seed: no run's generator is touched), as long as the context allows."""
    from .generate import generate_text

    room = model.config.max_seq_len - len(tokenizer.encode(SAMPLE_PROMPT))
    if room <= 0:
        return ""
    return generate_text(model, tokenizer, SAMPLE_PROMPT,
                         **{**SAMPLE, "max_new_tokens": min(SAMPLE["max_new_tokens"], room)})


def log_steps(total: int, points: int) -> list[int]:
    """Step 0 and about ``points`` log-spaced steps from 1 to ``total`` (distinct, ascending).

    >>> log_steps(1000, 6)
    [0, 1, 4, 16, 63, 251, 1000]
    """
    if total < 1 or points < 1:
        raise ValueError(f"log_steps needs total >= 1 and points >= 1, got total={total}, points={points}")
    raw = np.geomspace(1, total, num=points) if points > 1 else np.array([total])
    return [0] + sorted({int(round(s)) for s in raw} | {total})


def timeline_path_for(path) -> Path:
    """Where the timeline of a model file or run folder lives.

    A run folder holds ``timeline.safetensors``; a model file ``X.safetensors``
    has ``X.timeline.safetensors`` beside it (the bundled model's is shipped so).
    """
    path = Path(path)
    if path.is_dir():
        return path / "timeline.safetensors"
    if path.name == "model.safetensors":
        return path.parent / "timeline.safetensors"
    return path.with_name(path.name.removesuffix(".safetensors") + ".timeline.safetensors")


@dataclass
class Timeline:
    """The probe's history over a training run (see the module docstring).

    ``attn`` (S, L, H, n, n), ``probs`` (S, V) and ``induction`` (S, L, H) hold
    one row per recorded step, in the order of ``steps``; ``rows`` gives that
    step's figures; ``history`` is the run's per-step loss curve (at most
    :data:`HISTORY_ROWS` rows, every evaluation kept).
    """

    ids: list[int]
    pieces: list[str]
    period: int
    config: ModelConfig
    schedule: list[int]
    steps: list[int] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    attn: np.ndarray | None = None
    probs: np.ndarray | None = None
    induction: np.ndarray | None = None
    history: list[dict] = field(default_factory=list)

    @classmethod
    def for_model(cls, model, tokenizer, steps: int, points: int = 40, span: str = PROBE_SPAN) -> "Timeline":
        """An empty timeline for a run of ``steps`` steps: the probe is ``span`` encoded, then repeated."""
        half = [int(i) for i in tokenizer.encode(span)]
        if not half:
            raise ValueError(f"the probe span {span!r} encodes to no tokens")
        ids = half + half
        if len(ids) > model.config.max_seq_len:
            keep = model.config.max_seq_len // 2
            half = half[:keep]
            ids = half + half
        pieces = [tokenizer.decode([i]) for i in ids]
        return cls(ids=ids, pieces=pieces, period=len(half), config=model.config,
                   schedule=log_steps(steps, points))

    def due(self, step: int) -> bool:
        """Is ``step`` on the schedule and not yet recorded?"""
        return step in self.schedule and (not self.steps or step > self.steps[-1])

    def record(self, model, tokenizer, step: int, tokens: int, lr: float | None, train_loss,
               valid=None) -> None:
        """Run the probe through ``model`` and append what it shows at ``step``.

        ``lr`` is the learning rate of the optimiser step that led to this model, as the training history's
        row of the same step holds it (:func:`glassllm.optim.lr_at` of ``step - 1``, whose steps count from
        0), and None at step 0, before any step; ``train_loss`` is that step's loss.
        ``valid`` is a zero-argument function returning the held-out
        :class:`~glassllm.train.EvalResult` (or None for no held-out text).
        Nothing here draws from the run's random generators, so recording does
        not change the run.
        """
        from .trace import trace

        L, n = self.config.n_layers, len(self.ids)
        tr = trace(model, self.ids, names=["attn.softmax", "probs"])
        attn = np.stack([tr.get(f"layers.{l}.attn.softmax") for l in range(L)]).astype(np.float32)  # (L, H, n, n)
        probs = np.asarray(tr.get("probs")[-1], dtype=np.float32)                                 # (V,)
        P = self.period
        i = np.arange(P, n)
        induction = attn[:, :, i, i - P + 1].mean(axis=-1)                                        # (L, H)
        result = valid() if valid is not None else None
        sample = sample_text(model, tokenizer)
        self.steps.append(int(step))
        self.rows.append({"step": int(step), "tokens": int(tokens), "lr": None if lr is None else float(lr),
                          "train_loss": None if train_loss is None else float(train_loss),
                          "val_loss": None if result is None else float(result.loss),
                          "val_bpb": None if result is None else float(result.bits_per_byte),
                          "sample": sample})
        self.attn = _append(self.attn, attn)
        self.probs = _append(self.probs, probs)
        self.induction = _append(self.induction, induction.astype(np.float32))

    def set_history(self, history: list[dict]) -> None:
        """Keep the run's loss curve: every evaluation, and at most :data:`HISTORY_ROWS` rows in all."""
        stride = max(1, math.ceil(len(history) / HISTORY_ROWS))
        keys = ("step", "tokens", "lr", "loss", "val_loss", "val_bpb")
        self.history = [{k: row.get(k) for k in keys} for j, row in enumerate(history)
                        if j % stride == 0 or row.get("val_loss") is not None or j == len(history) - 1]

    def then(self, later: "Timeline") -> "Timeline":
        """One timeline of a two-stage run: this one, then ``later``, the timeline of a run that started
        from this run's last model (``glassllm train --init-from``). ``later``'s steps and tokens are
        counted on from this run's last row, and its step 0 (the same model as this run's last step) is
        dropped. Both must watch the same probe with the same architecture."""
        if later.ids != self.ids or later.period != self.period:
            raise ValueError("the two timelines watch different probes; only a run's continuation can follow it")
        if {**later.config.to_dict(), "max_seq_len": 0} != {**self.config.to_dict(), "max_seq_len": 0}:
            raise ValueError("the two timelines are of different architectures; only a run's continuation "
                             "can follow it")
        if not self.rows or not later.steps:
            raise ValueError("both timelines need at least one recorded step")
        step0, tokens0 = self.rows[-1]["step"], self.rows[-1]["tokens"]
        keep = [j for j, s in enumerate(later.steps) if s > 0]

        def shifted(row):
            return {**row, "step": row["step"] + step0, "tokens": row["tokens"] + tokens0}

        return Timeline(ids=list(self.ids), pieces=list(self.pieces), period=self.period, config=later.config,
                        schedule=self.schedule + [s + step0 for s in later.schedule if s > 0],
                        steps=self.steps + [later.steps[j] + step0 for j in keep],
                        rows=self.rows + [shifted(later.rows[j]) for j in keep],
                        attn=np.concatenate([self.attn, later.attn[keep]]),
                        probs=np.concatenate([self.probs, later.probs[keep]]),
                        induction=np.concatenate([self.induction, later.induction[keep]]),
                        history=self.history + [shifted(r) for r in later.history if r["step"] > 0])

    # -- the file ---------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        from .files import encode_safetensors

        if not self.steps:
            raise ValueError("an empty timeline (no step recorded) cannot be saved")
        meta = {"format": TIMELINE_FORMAT, "version": TIMELINE_VERSION, "ids": json.dumps(self.ids),
                "pieces": json.dumps(self.pieces), "period": str(self.period),
                "model_config": self.config.to_json(), "schedule": json.dumps(self.schedule),
                "steps": json.dumps(self.steps), "rows": json.dumps(self.rows),
                "history": json.dumps(self.history)}
        tensors = {"attn": self.attn.astype(np.float16), "probs": self.probs.astype(np.float16),
                   "induction": self.induction.astype(np.float32)}
        return encode_safetensors(tensors, meta)

    def save(self, path) -> None:
        """Write the timeline to ``path`` atomically."""
        from .files import atomic_write

        atomic_write(path, self.to_bytes())


def _append(stack: np.ndarray | None, row: np.ndarray) -> np.ndarray:
    return row[None] if stack is None else np.concatenate([stack, row[None]])


def load_timeline(path) -> Timeline:
    """Read a timeline file (or the one of a run folder or model file: :func:`timeline_path_for`)."""
    from .files import read_tagged

    path = Path(path)
    if path.is_dir() or not path.name.endswith("timeline.safetensors"):
        path = timeline_path_for(path)
    if not path.is_file():
        raise ValueError(f"no training timeline at {str(path)!r} (runs record one as they train)")
    meta, tensors = read_tagged(path, TIMELINE_FORMAT, TIMELINE_VERSION, "a glassllm timeline")
    try:
        config = ModelConfig.from_json(meta["model_config"])
        def decoded(name):                           # each metadata field's JSON bounded, as every reader's is
            return parse_json(meta[name], f"its field {name!r}")

        tl = Timeline(ids=decoded("ids"), pieces=decoded("pieces"), period=int(meta["period"]),
                      config=config, schedule=decoded("schedule"), steps=decoded("steps"),
                      rows=decoded("rows"), attn=tensors["attn"].astype(np.float32),
                      probs=tensors["probs"].astype(np.float32),
                      induction=tensors["induction"].astype(np.float32), history=decoded("history"))
    except (KeyError, TypeError, ValueError) as e:   # a missing or malformed field
        raise ValueError(f"cannot read the timeline {str(path)!r}: {type(e).__name__}: {e}") from None
    S, n = len(tl.steps), len(tl.ids)
    L, H, V = config.n_layers, config.n_heads, config.vocab_size
    for name, arr, shape in (("attn", tl.attn, (S, L, H, n, n)), ("probs", tl.probs, (S, V)),
                             ("induction", tl.induction, (S, L, H))):
        if arr.shape != shape:
            raise ValueError(f"timeline {str(path)!r}: {name} has shape {arr.shape}, expected {shape}")
    if len(tl.rows) != S or len(tl.pieces) != n or not 0 < tl.period <= n:
        raise ValueError(f"timeline {str(path)!r}: rows, pieces or period do not fit its {S} steps of {n} tokens")
    return tl
