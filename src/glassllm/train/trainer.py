"""A training run: :class:`Trainer` builds one fresh or resumes one from its folder, then runs the loop.

Each step is :func:`~glassllm.train.step.train_step`; held-out figures come from
:func:`~glassllm.train.evaluate.evaluate`; the files are those of
:mod:`glassllm.train.folder`. A new run and a resumed one are built by the
same code (``Trainer._build``); resuming then loads the saved weights, AdamW
moments, sampler state and history into it.

Resuming reads ``train_state.safetensors`` only: it is one file, written
atomically, so weights, moments and data position always belong to the same
step. ``model.safetensors`` is exported from it afterwards; a kill between the
two writes leaves an inference file one checkpoint behind, never a mismatched
pair. ``--resume`` continues bit-identically: same weights, moments, step and
generator state give the same next batch and the same update.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ..checkpoint import save_model
from ..config import ModelConfig
from ..data import WindowSampler, doc_start_id, doc_starts, expand_paths, text_sha256s, token_ids
from ..files import make_folder, one_or_many
from ..limits import expect, parse_json
from ..nn import Transformer
from ..optim import AdamW
from ..optional import available, install_hint, require
from ..timeline import SAMPLE_PROMPT, Timeline, load_timeline, sample_text
from ..tokenizers import Tokenizer, tokenizer_from_json
from .config import DTYPES, TrainConfig
from .evaluate import EvalResult, evaluate, text_bytes
from .folder import read_state, write_loss_csv, write_loss_png, write_state
from .step import GradientThreads, blas_threads, train_step

__all__ = ["Trainer"]


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


PROGRESS = "training's progress bar (--no-progress trains without it)"


class _NoBar:
    """What the loop calls on its progress bar, doing nothing: a run without one needs no tqdm."""

    def write(self, *args, **kwargs):
        pass

    def set_postfix(self, *args, **kwargs):
        pass

    def update(self, n=1):
        pass

    def close(self):
        pass


class Trainer:
    """A training run in a folder: build it fresh or resume it, then :meth:`run`.

    ``Trainer(config, model_config, train_files, out_dir, ...)`` starts a new
    run; :meth:`Trainer.resume` continues the one saved in a folder. ``init``
    (a state dict, name -> array, e.g. ``dict(model.named_parameters())`` of a
    loaded model) starts the weights from it instead of a random initialisation
    (fine-tuning; give the model's ``tokenizer`` too); ``init_from`` is what the
    files record as its source.
    """

    def __init__(self, config: TrainConfig, model_config: ModelConfig, train_files, out_dir,
                 valid_files=(), tokenizer=None, cache_dir=None, command: str = "", progress: bool = True,
                 init=None, init_from: str = ""):
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig, got {type(config).__name__}")
        if not isinstance(model_config, ModelConfig):
            raise TypeError(f"model_config must be a ModelConfig, got {type(model_config).__name__}")
        if config.seq_len > model_config.max_seq_len:
            raise ValueError(f"seq_len={config.seq_len} exceeds the model's max_seq_len={model_config.max_seq_len}")
        out = make_folder(out_dir)
        # a path or a list of them; folders give their *.txt files (as on the command line)
        train_files = [f.resolve() for f in expand_paths(train_files)]
        valid_files = list(one_or_many(valid_files))
        valid_files = [f.resolve() for f in expand_paths(valid_files)] if valid_files else []
        for files, what in ((train_files, "training"), (valid_files, "held-out")):
            if files and all(f.is_file() and f.stat().st_size == 0 for f in files):
                names = ", ".join(repr(str(f)) for f in files[:3]) + (" ..." if len(files) > 3 else "")
                raise ValueError(f"the {what} text is empty: {names} {'has' if len(files) == 1 else 'have'} no bytes")
        hashes = text_sha256s(train_files), text_sha256s(valid_files)
        if tokenizer is None:
            tokenizer = Tokenizer.train(train_files, vocab_size=model_config.vocab_size)
        init_seq, data_seq = np.random.SeedSequence(config.seed).spawn(2)
        self._build(config, model_config, out, cache_dir, progress, (train_files, valid_files), hashes, tokenizer,
                    command, np.random.default_rng(init_seq), np.random.default_rng(data_seq))
        if init is not None:
            self.model.load_state_dict({k: getattr(v, "data", v) for k, v in dict(init).items()})
        self.init_from = str(init_from)
        self.timeline = (Timeline.for_model(self.model, tokenizer, config.steps, config.timeline_points)
                         if config.timeline_points else None)

    def _build(self, config, model_config, out: Path, cache_dir, progress: bool, files, hashes, tokenizer,
               command: str, init, data_rng) -> None:
        """What a new run and a resumed one share: the model (initialised from ``init``), optimiser,
        token ids and batch sampler (drawing from ``data_rng``), at step 0 with no history."""
        if tokenizer.vocab_size != model_config.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size "
                             f"is {model_config.vocab_size}")
        self.config, self.model_config = config, model_config
        self.out = Path(out)
        self.cache_dir = Path(cache_dir) if cache_dir else self.out / "cache"
        self.progress = progress
        self.train_files, self.valid_files = files
        self.train_hashes, self.valid_hashes = hashes
        self.tokenizer = tokenizer
        self.model = Transformer(model_config, seed=init, dtype=DTYPES[config.dtype])
        self.optimizer = AdamW(self.model.named_parameters(), lr=config.lr, betas=(config.beta1, config.beta2),
                               eps=config.eps, weight_decay=config.weight_decay)
        self.train_ids = token_ids(self.train_files, tokenizer, self.cache_dir, self.train_hashes)
        self.valid_ids = (token_ids(self.valid_files, tokenizer, self.cache_dir, self.valid_hashes)
                          if self.valid_files else None)
        if self.valid_ids is not None and len(self.valid_ids) < 2:
            raise ValueError(f"the held-out text is {len(self.valid_ids)} token long; evaluation needs at least 2 "
                             f"(one to read, one to predict): give more --valid text")
        if self.valid_ids is not None and not text_bytes(tokenizer, self.valid_ids)[1:].any():
            raise ValueError("the held-out text holds no document to score (no text, or only separators: "
                             "<|endoftext|> lines, <s>, </s>); give --valid text with at least one story")
        starts = None
        if config.doc_start_fraction > 0:
            start_id = doc_start_id(tokenizer)
            if start_id is None:
                raise ValueError("doc_start_fraction > 0 needs a tokenizer with a document-start token "
                                 "(<|endoftext|> or <s>); this one has neither")
            starts = doc_starts(self.train_ids, start_id, tokenizer)
        self.sampler = WindowSampler(self.train_ids, config.seq_len, config.batch_size, data_rng,
                                     config.repeat_fraction, config.repeat_tokens, starts, config.doc_start_fraction)
        self.step = 0
        self.elapsed = 0.0
        self.history: list[dict] = []
        self.command = command
        self.last_eval: EvalResult | None = None
        self.timeline = None
        self.init_from = ""

    # -- resume -------------------------------------------------------------------
    @classmethod
    def resume(cls, out_dir, cache_dir=None, progress: bool = True) -> "Trainer":
        """Rebuild the run saved in ``out_dir/train_state.safetensors`` exactly as it was saved."""
        meta, tensors = read_state(out_dir)
        where = str(Path(out_dir) / "train_state.safetensors")
        record = lambda key, kind: _record(meta, key, kind, where)  # noqa: E731
        try:
            config = TrainConfig.from_dict(record("train_config", dict))
            model_config = ModelConfig.from_json(record("model_config", str))
        except ValueError as e:
            raise ValueError(e if str(e).startswith("cannot resume") else f"cannot resume: {where}: {e}") from None
        data = record("data", dict)
        for kind in ("train", "valid"):
            pairs = expect(data.get(kind), list, f"cannot resume: {where}: record 'data'[{kind!r}]")
            if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs):
                raise ValueError(f"cannot resume: {where}: record 'data'[{kind!r}] must list [file, SHA-256] pairs")
            for file, digest in pairs:
                if not Path(file).is_file():
                    raise ValueError(f"cannot resume: {kind} file {file!r} is gone")
        files = [Path(f) for f, _ in data["train"]], [Path(f) for f, _ in data["valid"]]
        hashes = text_sha256s(files[0]), text_sha256s(files[1])
        for kind, saved, now in (("train", data["train"], hashes[0]), ("valid", data["valid"], hashes[1])):
            for (file, then), digest in zip(saved, now):
                if then != digest:
                    raise ValueError(f"cannot resume: {kind} file {file!r} changed since the run started "
                                     f"(SHA-256 {digest[:12]}..., was {then[:12]}...)")
        self = cls.__new__(cls)
        self._build(config, model_config, Path(out_dir), cache_dir, progress, files, hashes,
                    tokenizer_from_json(record("tokenizer", str)), meta.get("command", ""), 0,
                    np.random.default_rng(0))
        self.init_from = meta.get("init_from", "")
        try:
            self.model.load_state_dict({k[len("param/"):]: v for k, v in tensors.items() if k.startswith("param/")})
            self.optimizer.load_state_dict({
                "t": record("optimizer_t", int),
                "m": {k[len("adam_m/"):]: v for k, v in tensors.items() if k.startswith("adam_m/")},
                "v": {k[len("adam_v/"):]: v for k, v in tensors.items() if k.startswith("adam_v/")},
            })
            self.sampler.set_state(record("sampler", dict))
        except ValueError as e:
            raise ValueError(f"cannot resume: {where}: {e}") from None
        self.step = record("step", int)
        self.elapsed = float(record("elapsed_s", (int, float)))
        self.history = record("history", list)
        if not all(isinstance(row, dict) for row in self.history):
            raise ValueError(f"cannot resume: {where}: record 'history' must be a list of objects")
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
        c = self.config
        stop = c.steps if until is None else min(int(until), c.steps)
        if self.step >= stop:
            self.log(f"nothing to do: the run is at step {self.step} of {c.steps}")
            return
        tty = sys.stderr.isatty()
        bar = _NoBar()
        if self.progress:
            bar = require("tqdm", PROGRESS).tqdm(total=c.steps, initial=self.step, desc="train", unit="step",
                                                 mininterval=0.5 if tty else 60.0, dynamic_ncols=tty,
                                                 ascii=not tty, file=sys.stderr)
        started, first_step = time.perf_counter(), self.step
        threads = GradientThreads(self.model, c.workers) if c.workers > 1 else None
        scope = contextlib.ExitStack()
        if threads is not None:
            scope.callback(threads.close)
            scope.enter_context(blas_threads(1))                             # the workers are the parallelism
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
            self.log(f"stopped at step {self.step} of {c.steps}; continue with --resume")

    def log(self, text: str) -> None:
        """Print ``text`` on stderr unless the run is quiet."""
        if self.progress:
            print(text, file=sys.stderr)

    def sample(self) -> str:
        """A short continuation of the fixed sample prompt, with a fixed seed (the run's RNG is not touched)."""
        return sample_text(self.model, self.tokenizer)

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
        lr = c.lr_at(self.step - 1) if self.step else None          # the step that led here (none before step 1)
        tl.record(self.model, self.tokenizer, self.step, self.tokens_seen, lr,
                  None if last is None else last["loss"], valid)
        self.elapsed += time.perf_counter() - t0
        return tl.rows[-1]["sample"]

    # -- saving -------------------------------------------------------------------
    def save(self) -> None:
        """Write the training state, then the inference file, tokenizer and loss curve (all atomic)."""
        c = self.config
        meta = {
            "step": str(self.step),
            "optimizer_t": str(self.optimizer.t), "train_config": c.to_json(),
            "model_config": self.model_config.to_json(), "tokenizer": self.tokenizer.to_json(),
            "sampler": json.dumps(self.sampler.state()), "elapsed_s": repr(self.elapsed),
            "data": json.dumps({"train": [[str(f), h] for f, h in zip(self.train_files, self.train_hashes)],
                                "valid": [[str(f), h] for f, h in zip(self.valid_files, self.valid_hashes)]}),
            "history": json.dumps(self.history), "command": self.command, "init_from": self.init_from,
        }
        tensors = {}
        for name, p in self.model.named_parameters():
            tensors["param/" + name] = np.ascontiguousarray(p.data)
            tensors["adam_m/" + name] = np.ascontiguousarray(self.optimizer.m[name])
            tensors["adam_v/" + name] = np.ascontiguousarray(self.optimizer.v[name])
        write_state(self.out / "train_state.safetensors", tensors, meta)
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
        if self.init_from:
            meta["init_from"] = self.init_from
        if self.history:
            meta["train_loss"] = repr(self.history[-1]["loss"])
        if self.last_eval is not None:
            meta["valid_loss"] = repr(self.last_eval.loss)
            meta["valid_bits_per_byte"] = repr(self.last_eval.bits_per_byte)
            meta["valid_tokens"] = str(self.last_eval.tokens)
        return meta

    def write_curve(self) -> None:
        """``loss.csv`` (one row per step) and ``loss.png`` (train and held-out loss against step; drawn
        when matplotlib is installed, which the core install lacks)."""
        write_loss_csv(self.history, self.out / "loss.csv")
        if available("matplotlib"):
            write_loss_png(self.history, self.out / "loss.png")
        elif not getattr(self, "_said_no_plot", False):
            self._said_no_plot = True
            self.log(f"loss.png is not drawn: it needs matplotlib ({install_hint('app')}); loss.csv has the curve")


def _record(meta: dict[str, str], key: str, kind, where: str):
    """The training state's record ``key``: JSON (:func:`glassllm.limits.parse_json`) of type ``kind``
    (``str``: the text itself); a missing or damaged record is one ``ValueError`` line."""
    what = f"cannot resume: {where}: record {key!r}"
    if key not in meta:
        raise ValueError(f"{what} is missing; the file is damaged (start a run without --resume)")
    value = meta[key] if kind is str else parse_json(meta[key], what)
    return expect(value, kind, what)
