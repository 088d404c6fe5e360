"""Train the PyTorch twin on one or many processes with DistributedDataParallel.

Run it with ``torchrun`` (or plain ``python -m`` for one process)::

    torchrun --nproc_per_node 2 -m glassllm.torch.train_ddp --data stories.txt --out runs/big \\
        --dim 256 --n-layers 8 --n-heads 8 --n-kv-heads 4 --steps 5000 --batch-size 64

The options are exactly ``glassllm train``'s (one per field of
:class:`glassllm.train.TrainConfig` and of :class:`~glassllm.config.ModelConfig`),
and so are the numbers behind them: the same seeded initialisation
(``SeedSequence(seed)`` spawns the init and the data generators), the same
data pipeline (:func:`glassllm.data.token_ids` and
:class:`glassllm.data.WindowSampler`), the same AdamW with weight decay on
matrices only, warm-up + cosine schedule and clipping (PyTorch's ``AdamW``,
``LambdaLR`` and ``clip_grad_norm_`` compute what :mod:`glassllm.optim`
computes), and the same run folder: ``train_state.safetensors`` (weights, AdamW
moments, sampler state; ``glassllm train --resume`` can continue it, and so can
``--resume`` here), ``model.safetensors`` (the model file the glass box opens)
and ``tokenizer.json``.

How the work is split. ``--batch-size`` is the *global* batch: every process
draws the same windows from the same seeded sampler and keeps its own
``batch-size / world-size`` rows; DDP averages the gradients over processes, so
with equal shards the step is the mean over the whole batch -- the same update
as one process taking the whole batch, up to float rounding. Backend: gloo on
CPUs, NCCL when every process has a GPU (``--backend`` overrides). Only rank 0
writes files.

Held-out evaluation is left to ``glassllm eval --model OUT/model.safetensors``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from ..optional import MissingExtra, require

try:
    require("torch", "glassllm.torch.train_ddp")
except MissingExtra as e:
    if __name__ == "__main__":                   # python -m glassllm.torch.train_ddp (torchrun -m): a command
        print(f"glassllm.torch.train_ddp: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    raise

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ..checkpoint import save_model  # noqa: E402
from ..commands.train import add_config_options, given_options  # noqa: E402
from ..config import ModelConfig  # noqa: E402
from ..data import WindowSampler, resolve_sources, text_sha256s, token_ids  # noqa: E402
from ..nn import Transformer as GlassTransformer  # noqa: E402
from ..optim import lr_lambda  # noqa: E402
from ..train import TrainConfig  # noqa: E402
from ..train.folder import read_state, write_state  # noqa: E402
from .model import Transformer, from_glassllm, to_glassllm  # noqa: E402

__all__ = ["run", "main"]

_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_NP_DTYPES = {"float32": np.float32, "float64": np.float64}


# ----------------------------------------------------------------------------
# Processes
# ----------------------------------------------------------------------------

class _World:
    """Rank, size and device of this process; a process group when torchrun started several."""

    def __init__(self, backend: str = "auto"):
        self.size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() > local else "gloo"
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"--backend {backend!r} is not one of 'auto', 'gloo', 'nccl'")
        self.device = torch.device(f"cuda:{local}") if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(self.device)
        self.distributed = self.size > 1
        if self.distributed and not dist.is_initialized():
            dist.init_process_group(backend=backend)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def share(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def mean(self, value: float) -> float:
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t) / self.size

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


# ----------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------

def _optimizer(twin: Transformer, c: TrainConfig):
    """AdamW with decay on matrices only (glassllm.optim.decay_mask's rule) and the glassllm schedule."""
    decay = [p for p in twin.parameters() if p.ndim >= 2]
    keep = [p for p in twin.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                             {"params": keep, "weight_decay": 0.0}],
                            lr=c.lr, betas=(c.beta1, c.beta2), eps=c.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(c.lr, c.warmup, c.steps, c.min_lr))
    return opt, sched


def _save_state(out: Path, twin: Transformer, opt, step: int, c: TrainConfig, mc: ModelConfig, tokenizer,
                sampler: WindowSampler, files, hashes, history, elapsed: float, command: str) -> None:
    """``train_state.safetensors`` in glassllm.train's format, then ``model.safetensors`` and the tokenizer."""
    tensors = {}
    for name, p in twin.named_parameters():
        state = opt.state.get(p, {})
        zeros = torch.zeros_like(p)
        tensors["param/" + name] = p.detach().cpu().numpy()
        tensors["adam_m/" + name] = state.get("exp_avg", zeros).detach().cpu().numpy()
        tensors["adam_v/" + name] = state.get("exp_avg_sq", zeros).detach().cpu().numpy()
    meta = {
        "step": str(step), "optimizer_t": str(step),
        "train_config": c.to_json(), "model_config": mc.to_json(), "tokenizer": tokenizer.to_json(),
        "sampler": json.dumps(sampler.state()), "elapsed_s": repr(elapsed),
        "data": json.dumps({"train": [[str(f), h] for f, h in zip(files, hashes)], "valid": []}),
        "history": json.dumps(history), "command": command,
    }
    write_state(out / "train_state.safetensors", tensors, meta)
    model_meta = {"step": str(step), "steps": str(c.steps), "seed": str(c.seed), "train_config": c.to_json(),
                  "tokens_seen": str(step * c.tokens_per_step), "wall_time_s": f"{elapsed:.1f}",
                  "trainer": "glassllm.torch.train_ddp", "command": command,
                  "train_data_sha256": json.dumps({str(Path(f).resolve()): h for f, h in zip(files, hashes)})}
    if history:
        model_meta["train_loss"] = repr(history[-1]["loss"])
    save_model(out / "model.safetensors", to_glassllm(twin, _NP_DTYPES[c.dtype]), tokenizer, model_meta)
    if not (out / "tokenizer.json").exists():
        tokenizer.save(out / "tokenizer.json")


def _load_state(out: Path):
    """Read ``train_state.safetensors``: (tensors, metadata)."""
    meta, tensors = read_state(out)
    return tensors, meta


def run(config: TrainConfig | None, model_config: ModelConfig | None, data, out_dir, tokenizer=None,
        cache_dir=None, until: int | None = None, resume: bool = False, backend: str = "auto",
        progress: bool = True, command: str = "") -> dict:
    """Train (or with ``resume`` continue) a run in ``out_dir``; returns a summary dict on every rank.

    ``data``: files or folders of text. ``config``/``model_config`` are ignored
    when resuming (the saved ones are used). Raises ValueError for bad input.
    """
    from ..tokenizers import Tokenizer

    world = _World(backend)
    try:
        out = Path(out_dir)
        cache = Path(cache_dir) if cache_dir else out / "cache"
        if world.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
        state_tensors = meta = None
        if resume:
            state_tensors, meta = _load_state(out)
            config = TrainConfig.from_dict(json.loads(meta["train_config"]))
            model_config = ModelConfig.from_json(meta["model_config"])
            tokenizer = Tokenizer.from_json(meta["tokenizer"])
            files = [Path(f) for f, _ in json.loads(meta["data"])["train"]]
        else:
            if (out / "train_state.safetensors").exists():
                raise ValueError(f"{str(out)!r} already holds a run; add --resume to continue it or choose another --out")
            files = resolve_sources(data, cache, progress=progress and world.rank == 0) if world.rank == 0 else None
            files = world.share(files)
        if config.seq_len > model_config.max_seq_len:
            raise ValueError(f"seq_len={config.seq_len} exceeds the model's max_seq_len={model_config.max_seq_len}")
        if config.batch_size % world.size or config.window_shape(0)[0] % world.size:
            raise ValueError(f"--batch-size {config.batch_size} (or the warm-up's {config.window_shape(0)[0]} "
                             f"windows) is not divisible by the {world.size} processes")
        hashes = text_sha256s(files)
        if resume:
            for (f, then), now in zip(json.loads(meta["data"])["train"], hashes):
                if then != now:
                    raise ValueError(f"cannot resume: train file {f!r} changed since the run started")

        # Tokenizer and token ids: rank 0 makes them, the others read them.
        if tokenizer is None:
            doc = Tokenizer.train(files, vocab_size=model_config.vocab_size).to_json() if world.rank == 0 else None
            tokenizer = Tokenizer.from_json(world.share(doc))
        if tokenizer.vocab_size != model_config.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size "
                             f"is {model_config.vocab_size}")
        if world.rank == 0:
            token_ids(files, tokenizer, cache, hashes)
        world.barrier()
        ids = token_ids(files, tokenizer, cache, hashes)

        # Model, optimiser and sampler, seeded as glassllm.train seeds them.
        init_seq, data_seq = np.random.SeedSequence(config.seed).spawn(2)
        dtype = _NP_DTYPES[config.dtype]
        glass = GlassTransformer(model_config, seed=np.random.default_rng(init_seq), dtype=dtype)
        twin = from_glassllm(glass, _TORCH_DTYPES[config.dtype]).to(world.device)
        opt, sched = _optimizer(twin, config)
        sampler = WindowSampler(ids, config.seq_len, config.batch_size, np.random.default_rng(data_seq),
                                config.repeat_fraction, config.repeat_tokens)
        step, elapsed, history = 0, 0.0, []
        if resume:
            step = int(meta["step"])
            _restore(twin, opt, sched, state_tensors, step)
            sampler.set_state(json.loads(meta["sampler"]))
            elapsed, history = float(meta["elapsed_s"]), json.loads(meta["history"])
        net = twin
        if world.distributed:
            # The buffers (RoPE tables) are the same on every rank: no need to sync them at each forward.
            # torch 2.13 renamed the switch (broadcast_buffers is deprecated and warns on every rank).
            params = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
            no_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in params
                       else {"broadcast_buffers": False})
            net = torch.nn.parallel.DistributedDataParallel(
                twin, device_ids=[world.device.index] if world.device.type == "cuda" else None, **no_sync)

        # The loop.
        stop = config.steps if until is None else min(int(until), config.steps)
        log_every = max(1, config.steps // 20)
        while step < stop:
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            total = 0.0
            B, T = config.window_shape(step)
            rows = B // world.size
            lo = world.rank * rows
            for micro in range(config.grad_accum):
                x, y = sampler.next_batch(T, B)                               # (B, T) each, the global batch
                x = torch.from_numpy(x[lo:lo + rows]).to(world.device)      # (B/world, T)
                y = torch.from_numpy(y[lo:lo + rows]).to(world.device)
                last = micro == config.grad_accum - 1
                ctx = net.no_sync() if world.distributed and not last else _nullcontext()
                with ctx:
                    logits = net(x)                                         # (B/world, T, V)
                    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
                    (loss / config.grad_accum).backward()
                total += float(loss.detach())
            loss_value = world.mean(total / config.grad_accum)
            if not math.isfinite(loss_value):
                raise ValueError(f"step {step + 1}: the loss is {loss_value} (not finite); lower --lr or check the data")
            lr = sched.get_last_lr()[0]
            if config.grad_clip > 0:
                norm = float(torch.nn.utils.clip_grad_norm_(twin.parameters(), config.grad_clip))
            else:
                norm = float(torch.linalg.vector_norm(torch.stack(
                    [torch.linalg.vector_norm(p.grad) for p in twin.parameters() if p.grad is not None])))
            opt.step()
            sched.step()
            step += 1
            elapsed += time.perf_counter() - t0
            history.append({"step": step, "tokens": step * config.tokens_per_step, "lr": lr, "loss": loss_value,
                            "grad_norm": norm, "val_loss": None, "val_bpb": None, "elapsed_s": round(elapsed, 3)})
            if progress and world.rank == 0 and (step % log_every == 0 or step == stop):
                print(f"step {step}/{config.steps}  loss {loss_value:.4f}  lr {lr:.2e}  "
                      f"grad norm {norm:.3f}  {elapsed:.1f} s", file=sys.stderr)
            if world.rank == 0 and (step == stop or (config.checkpoint_every and step % config.checkpoint_every == 0)):
                _save_state(out, twin, opt, step, config, model_config, tokenizer, sampler, files, hashes,
                            history, elapsed, command)
        world.barrier()
        return {"step": step, "loss": history[-1]["loss"] if history else None, "world_size": world.size,
                "out": str(out)}
    finally:
        world.close()


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _restore(twin: Transformer, opt, sched, tensors: dict, step: int) -> None:
    """Put saved weights and AdamW moments (glassllm names) into the twin and its optimiser."""
    with torch.no_grad():
        for name, p in twin.named_parameters():
            for prefix in ("param/", "adam_m/", "adam_v/"):
                if prefix + name not in tensors:
                    raise ValueError(f"cannot resume: the training state has no {prefix + name!r}")
            p.copy_(torch.from_numpy(tensors["param/" + name]))
            if step:
                opt.state[p] = {"step": torch.tensor(float(step)),
                                "exp_avg": torch.from_numpy(tensors["adam_m/" + name]).to(p),
                                "exp_avg_sq": torch.from_numpy(tensors["adam_v/" + name]).to(p)}
    with warnings.catch_warnings():  # fast-forwarding before any optimiser step is what we mean here
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
        for _ in range(step):  # LambdaLR's position is its step count
            sched.step()


# ----------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchrun --nproc_per_node N -m glassllm.torch.train_ddp",
        description="Train glassllm's PyTorch twin with DistributedDataParallel; writes the glass box's "
                    "own run folder (model.safetensors, train_state.safetensors, tokenizer.json).")
    p.add_argument("--data", nargs="+", metavar="PATH", help="training text files or folders (their *.txt)")
    p.add_argument("--out", metavar="DIR", default="runs/ddp", help="run folder (default: runs/ddp)")
    p.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    p.add_argument("--until", type=int, metavar="STEP", help="stop (with a checkpoint) after this step")
    p.add_argument("--tokenizer", metavar="FILE", help="a tokenizer file (default: train one on --data)")
    p.add_argument("--cache-dir", metavar="DIR", help="where token ids are cached (default: OUT/cache)")
    p.add_argument("--backend", default="auto", help="auto (NCCL with GPUs, else gloo), gloo or nccl")
    p.add_argument("--no-progress", action="store_true", help="no log lines")
    # The same options as `glassllm train`, minus its worker threads (here processes, torchrun's, are the
    # parallelism); its evaluation options are accepted, so that one command line serves both, and ignored.
    no_eval = "ignored: the twin does not evaluate (measure its model with glassllm eval)"
    add_config_options(p.add_argument_group("training (TrainConfig)"), TrainConfig, skip=("workers",),
                       ignored={"eval_every": no_eval, "eval_windows": no_eval})
    add_config_options(p.add_argument_group("model (ModelConfig)"), ModelConfig)
    return p


def main(argv=None) -> int:
    """Entry point; bad input is one line on stderr and exit code 2."""
    import shlex

    from ..tokenizers import Tokenizer

    args = build_parser().parse_args(argv)
    try:
        train_opts, model_opts = given_options(args, "train_"), given_options(args, "model_")
        tokenizer = Tokenizer.load(args.tokenizer) if args.tokenizer else None
        config = model_config = None
        if not args.resume:
            if not args.data:
                raise ValueError("--data is required: text files or folders to train on (or --resume)")
            config = TrainConfig(**train_opts)
            if tokenizer is not None:
                if model_opts.get("vocab_size", tokenizer.vocab_size) != tokenizer.vocab_size:
                    raise ValueError(f"--vocab-size {model_opts['vocab_size']} differs from the tokenizer's "
                                     f"{tokenizer.vocab_size} ids")
                model_opts["vocab_size"] = tokenizer.vocab_size
            if "dim" in model_opts and "ffn_dim" not in model_opts:
                model_opts["ffn_dim"] = ModelConfig.llama_ffn_dim(model_opts["dim"])
            model_config = ModelConfig(**model_opts)
        command = shlex.join(["torchrun", "-m", "glassllm.torch.train_ddp", *(sys.argv[1:] if argv is None else argv)])
        summary = run(config, model_config, args.data, args.out, tokenizer, args.cache_dir, args.until,
                      args.resume, args.backend, not args.no_progress, command)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"glassllm.torch.train_ddp: error: {e}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0 and not args.no_progress:
        print(f"done: step {summary['step']} on {summary['world_size']} process(es) -> {summary['out']}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
