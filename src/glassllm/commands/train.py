"""``glassllm train``: train a model (and its tokenizer) on text files, or resume a run (:mod:`glassllm.train`).

The options map one to one onto the fields of :class:`~glassllm.train.TrainConfig`
and :class:`~glassllm.config.ModelConfig` (``--batch-size`` is ``batch_size``); a
field the config refuses is reported under its option by :mod:`glassllm.cli`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shlex
import shutil
import sys
from pathlib import Path

from ..checks import ParameterError
from ..config import ModelConfig
from ..data import (DEFAULT_TRAIN, DEFAULT_VALID, REPEAT_TOKENS, hub_source, resolve_sources, shipped_source,
                    text_sha256s)
from ..optional import require
from ..tokenizers import Tokenizer
from ..train import DTYPES, RECIPES, Trainer, TrainConfig, blas_threads, lock_run_folder
from ..train.trainer import PROGRESS
from . import model_file

__all__ = ["add_cli", "run", "add_config_options", "given_options"]


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
    "doc_start_fraction": "share of training windows that start where a story starts (at <s>; for glassllm's "
                          "tokenizer at the <|endoftext|> before it or at its first token, half and half) "
                          "instead of at a random offset, so that stories are seen whole from their beginning",
    "short_steps": "sequence-length warm-up: this many first steps train on windows of --short-seq-len tokens "
                   "(0 = off)",
    "short_seq_len": "tokens per window during the warm-up; the batch grows to keep tokens per step the same",
    "short_repeat_fraction": "share of repeated-span windows during the sequence-length warm-up "
                             "(-1 = the same as --repeat-fraction)",
    "timeline_points": "log-spaced steps at which a probe prompt's attention, next-token distribution, "
                       "held-out loss and a sample are kept in timeline.safetensors, besides step 0 (the "
                       "random initialisation; 0 = off)",
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
    "tie_embeddings": "true: the output head is the embedding matrix, one parameter (Hugging Face's "
                      "tie_word_embeddings)",
}


# Fields whose values are names: argparse lists them in --help and refuses others in its own words.
_CHOICES = {"repeat_tokens": REPEAT_TOKENS, "dtype": tuple(DTYPES)}


def _field_type(default):
    return type(default) if not isinstance(default, bool) else _true_or_false


def _true_or_false(text: str) -> bool:
    """A yes/no option's value: ``true`` or ``false`` (argparse reports anything else in one line)."""
    if text not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text == "true"


def add_cli(name: str, parser) -> None:
    """Options of ``glassllm train``."""
    parser.description = ("Train a glassllm model from scratch on text files with AdamW, a warm-up + cosine "
                          "schedule and gradient clipping, or fine-tune a model file (--init-from). The run "
                          "folder gets model.safetensors (the file to generate with), train_state.safetensors "
                          "(for --resume), tokenizer.json, loss.csv and loss.png (drawn with matplotlib, the "
                          "[app] extra).")
    io_ = parser.add_argument_group("data and run folder")
    io_.add_argument("--data", nargs="+", metavar="PATH",
                     help="training text: files, folders (their *.txt), 'glassllm:stories' (4,000 "
                          "TinyStories stories that ship with glassllm), 'tinystories:train' (downloads "
                          "TinyStories from the Hugging Face hub) or hf:OWNER/NAME/FILE; stories separated "
                          "by <|endoftext|> lines (default: glassllm:stories, with --valid "
                          "glassllm:stories-heldout)")
    io_.add_argument("--valid", nargs="+", metavar="PATH", default=None,
                     help="held-out text for loss, perplexity and bits per byte (same forms as --data)")
    io_.add_argument("--out", metavar="DIR", default="runs/train", help="run folder (default: runs/train)")
    io_.add_argument("--resume", action="store_true",
                     help="continue the run saved in --out from its last save (bit-identical); Ctrl-C saves "
                          "the step it stops at, a crash loses the steps since the last checkpoint")
    finetune = RECIPES["finetune"]
    io_.add_argument("--init-from", metavar="MODEL",
                     help="fine-tune: start from this model file ('bundled' for the bundled model; a file of "
                          "glassllm import, or a .gguf, llama2.c .bin or Hugging Face folder, imported on the "
                          "fly), keeping its tokenizer and architecture (--seq-len may exceed its context: "
                          "the context grows to it). Unless --recipe is given, the schedule is the "
                          f"'finetune' recipe: {finetune.steps} steps, a linear warm-up over "
                          f"{finetune.warmup_steps} steps to a peak --lr {finetune.lr:g} (a third of a fresh "
                          f"run's), cosine down to --min-lr {finetune.min_lr:g}; the options below override it")
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
    parser.set_defaults(func=run)


def add_config_options(group, cls, skip=(), ignored=None) -> None:
    """One option per field of TrainConfig or ModelConfig (``--batch-size`` ...), described and with its default.

    Values land in ``args.train_<field>`` or ``args.model_<field>`` (None when not given: see :func:`given_options`).
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
                           metavar="{" + ",".join(choices) + "}" if choices else
                           "{true,false}" if isinstance(field.default, bool) else field.name.upper(),
                           help=text if "default:" in text else f"{text} (default: {field.default})")


def given_options(args, prefix: str) -> dict:
    """The config fields set on the command line (``prefix`` ``train_`` or ``model_``): field -> value."""
    return {k[len(prefix):]: v for k, v in vars(args).items() if k.startswith(prefix) and v is not None}


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


def run(args) -> int:
    train_opts, model_opts = given_options(args, "train_"), given_options(args, "model_")
    init_from = getattr(args, "init_from", None)
    if init_from is not None and args.recipe is None and not args.resume:
        args.recipe = "finetune"          # the fine-tuning schedule, under the options given
    typed = set(train_opts)               # what the command line itself set (the rest comes from --recipe)
    if args.recipe:                       # the recipe's values, as if given, under the explicit ones
        base, plain = RECIPES[args.recipe].to_dict(), TrainConfig().to_dict()
        train_opts = {**{k: v for k, v in base.items() if v != plain[k]}, **train_opts}
    progress = not (args.no_progress or args.quiet)
    if progress:
        require("tqdm", PROGRESS)         # before any work: the bar is the last thing the loop needs
    if args.until is not None and args.until < 1:
        raise ValueError(f"--until must be a step >= 1, got {args.until}")
    if args.resume:
        if init_from is not None:
            raise ValueError(f"--init-from {init_from} starts a new run; a resumed run continues from the "
                             f"weights saved in {str(args.out)!r}")
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
        trainer.log(f"resuming {args.out} at step {trainer.step} of {trainer.config.steps}")
    else:
        default_data(args)
        recipe_set = set()
        if args.recipe:
            base, plain = RECIPES[args.recipe].to_dict(), TrainConfig().to_dict()
            recipe_set = {k for k in base if base[k] != plain[k] and k not in typed}
        try:
            config = TrainConfig(**train_opts)
        except ParameterError as e:                                      # say where a recipe's value came from
            if e.param not in recipe_set:
                raise
            raise type(e)(e.param, f"(set by --recipe {args.recipe}) {e.problem}", owner=e.owner,
                          refs=e.refs) from None
        for note in _odd_settings(config, typed):                        # allowed, but rarely meant
            print(f"glassllm train: note: {note}", file=sys.stderr)
        init = None
        if init_from is not None:
            init, tokenizer, model_opts = _init_model(init_from, args, config, model_opts)
        else:
            tokenizer = _tokenizer_file(args.tokenizer) if args.tokenizer else None
        if tokenizer is not None and init is None:
            if "vocab_size" in model_opts and model_opts["vocab_size"] != tokenizer.vocab_size:
                raise ValueError(f"--vocab-size {model_opts['vocab_size']} differs from the tokenizer's "
                                 f"{tokenizer.vocab_size} ids")
            model_opts.setdefault("vocab_size", tokenizer.vocab_size)
        if "dim" in model_opts and "ffn_dim" not in model_opts:
            model_opts["ffn_dim"] = ModelConfig.llama_ffn_dim(model_opts["dim"])
        model_config = ModelConfig(**model_opts)
        fresh = not Path(args.out).exists()
        lock = lock_run_folder(args.out)                               # held until this process ends
        with removed_on_failure(args.out if fresh else None):
            trainer = _new_trainer(args, config, model_config, tokenizer, progress, init)
        trainer.log(f"training {trainer.model.num_params():,} parameters on {len(trainer.train_ids):,} tokens "
                     f"for {config.steps} steps of {config.tokens_per_step:,} tokens -> {args.out}")
    with blas_threads(args.threads):
        trainer.run(args.until)
    if trainer.step == trainer.config.steps and progress:
        line = f"done: {trainer.step} steps, {trainer.tokens_seen:,} tokens, {trainer.elapsed:.0f} s"
        if trainer.last_eval is not None:
            line += f"; held-out {trainer.last_eval.line()}"
        print(line, file=sys.stderr)
    if lock is not None:
        lock.close()
    return 0


def _tokenizer_file(path) -> Tokenizer:
    """``--tokenizer FILE``: a tokenizer file; a model file is refused, naming what takes one."""
    from ..files import read_head, starts_like_safetensors

    if Path(path).is_file() and starts_like_safetensors(read_head(path, 9)):
        raise ValueError(f"--tokenizer {str(path)!r} is a model file; expected a tokenizer file (glassllm tokenize "
                         "--train ... --out tok.json). To go on from a model, fine-tune it: --init-from")
    return Tokenizer.load(path)


def _init_model(spec: str, args, config: TrainConfig, model_opts: dict):
    """``(weights, tokenizer, model options)`` of ``--init-from spec``: its parameters, its tokenizer, and its
    architecture (its context grown to ``--seq-len`` if that is longer)."""
    from .. import checkpoint
    from ..interop.importer import load_source

    if args.tokenizer:
        raise ValueError(f"--tokenizer {args.tokenizer} cannot be used with --init-from: the model keeps its "
                         "own tokenizer")
    changed = sorted(k for k in model_opts if k != "max_seq_len")
    if changed:
        flag = "--" + changed[0].replace("_", "-")
        raise ValueError(f"{flag} cannot change the architecture of --init-from {spec}: fine-tuning keeps it "
                         "(only --max-seq-len, the context, may grow)")
    path = model_file(spec)
    if not path.exists():
        raise ValueError(f"--init-from {spec!r} does not exist; expected a model file, 'bundled', a .gguf, a "
                         "llama2.c .bin or a Hugging Face folder")
    if checkpoint.is_model_file(path):
        model, tokenizer, _ = checkpoint.load_model(path)
    else:
        model, tokenizer, _, _ = load_source(path)
    context = max(model.config.max_seq_len, config.seq_len, model_opts.get("max_seq_len", 0))
    opts = {**model.config.to_dict(), "max_seq_len": context}
    args.init_label = str(path) if spec != "bundled" else "bundled"
    return {k: p.data for k, p in model.named_parameters()}, tokenizer, opts


def default_data(args) -> None:
    """A new run given no ``--data`` trains on the stories that ship with glassllm (no network needed),
    and holds out the shipped held-out stories unless ``--valid`` is given."""
    if args.data:
        return
    args.data = [DEFAULT_TRAIN]
    if args.valid is None:
        args.valid = [DEFAULT_VALID]


def _new_trainer(args, config, model_config, tokenizer, progress: bool, init=None) -> "Trainer":
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
            if hub_source(spec) is None and shipped_source(spec) is None and not Path(spec).exists():
                raise ValueError(f"{flag} path {str(spec)!r} does not exist")
    train_files = resolve_sources(args.data, cache, progress=progress)
    valid_files = resolve_sources(args.valid, cache, progress=progress) if args.valid else []
    command = shlex.join(args.command_line)
    with blas_threads(args.threads):
        return Trainer(config, model_config, train_files, args.out, valid_files, tokenizer,
                       args.cache_dir, command, progress, init, getattr(args, "init_label", ""))


@contextlib.contextmanager
def removed_on_failure(folder):
    """If the block fails, remove ``folder`` (made for this run; None = keep it): a run refused
    before its first step leaves nothing behind -- at most a lock and a token cache it made."""
    try:
        yield
    except BaseException:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
