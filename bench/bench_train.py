"""Training throughput: glassllm's AdamW step beside the same step in PyTorch, in one run.

One optimiser step of the default model on a batch of 16 windows x 256 tokens,
float32, exactly as ``glassllm train`` does it: forward, cross-entropy,
backward, clipping to global norm 1.0, AdamW (decay 0.1 on matrices only) --

- ``glassllm``: :func:`glassllm.train.train_step` with :class:`glassllm.optim.AdamW`;
- ``torch_eager`` / ``torch_sdpa``: the tests' independent PyTorch LLaMA
  (``tests/torch_reference.py``; spelled-out or fused attention) with the same
  weights, ``torch.optim.AdamW`` (two param groups) and ``clip_grad_norm_``;
- with ``--hand`` (1 thread only): ``numpy_hand``, the same step hand-written
  in NumPy with no autograd (:mod:`numpy_step`, plain dense causal attention,
  the masked half included), and ``numpy_hand_tiled``, the same with glassllm's
  tiled attention kernel in place of the dense one. The first is what a
  straightforward hand-written step does; glassllm over the second is what the
  autograd engine and the modules cost.

Every step draws a fresh batch from one seeded :class:`~glassllm.data.WindowSampler`
per implementation over the same random token stream. Per thread count (numpy's
BLAS via threadpoolctl, torch via ``torch.set_num_threads``) each implementation
is warmed up, then timed in ``--repeats`` interleaved rounds whose order rotates
(so drifting load from other processes hits everyone alike). Reported: medians,
tokens/s = tokens per step / median, and glassllm's speed as a fraction of
each PyTorch variant's (``tokens/s glassllm / tokens/s torch``; < 1 means
glassllm is slower). The JSON goes to ``bench/results/bench_train.json``.

Run from the repository root::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.bench_train
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from bench.benchlib import environment, write_report  # noqa: E402
from glassllm.heap import keep_freed_memory  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def model_config(dim: int):
    """The default config, or one of width ``dim`` with heads of 32 (two query heads per K/V head)."""
    from glassllm.config import ModelConfig

    if dim == ModelConfig().dim:
        return ModelConfig()
    return ModelConfig(dim=dim, n_heads=dim // 32, n_kv_heads=max(1, dim // 64),
                       ffn_dim=ModelConfig.llama_ffn_dim(dim))


def build(batch: int, seq: int, seed: int, dim: int = 128, threads: int = 1, hand: bool = False):
    """name -> zero-argument function doing one full training step and returning its loss.

    With ``threads`` > 1, ``glassllm`` shares each batch's rows out among that many
    worker threads with one BLAS thread each (``TrainConfig.workers``, how
    ``glassllm train --workers`` runs), and ``glassllm_blas`` is the one-worker
    step with BLAS allowed ``threads`` threads.
    """
    import torch

    from glassllm.data import WindowSampler
    from glassllm.nn import Transformer
    from glassllm.optim import AdamW
    from threadpoolctl import ThreadpoolController

    from glassllm.train import GradientThreads, TrainConfig, train_step
    from tests.support.torch_reference import TorchLlama

    tc = TrainConfig(batch_size=batch, seq_len=seq)
    config = model_config(dim)
    ids = np.random.default_rng(seed).integers(0, config.vocab_size, size=200_000).astype(np.uint16)
    sampler = lambda: WindowSampler(ids, seq, batch, np.random.default_rng(seed + 1))  # noqa: E731
    blas = ThreadpoolController()

    def glassllm(workers: int):
        """A fresh model, optimiser and batch stream; the step trains them with ``workers`` threads."""
        model = Transformer(config, seed=seed, dtype=np.float32)
        opt = AdamW(model.named_parameters(), lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps,
                    weight_decay=tc.weight_decay)
        batches = sampler()
        if workers == 1:
            return model, lambda: train_step(model, opt, [batches.next_batch()], tc.lr, tc.grad_clip)[0]
        shared = GradientThreads(model, workers)

        def step():
            with blas.limit(limits=1, user_api="blas"):                 # the workers are the parallelism
                return train_step(model, opt, [batches.next_batch()], tc.lr, tc.grad_clip, threads=shared)[0]
        return model, step

    model, step = glassllm(threads)
    steps = {"glassllm": step}
    if threads > 1:
        steps["glassllm_blas"] = glassllm(1)[1]
    for name, attention in (("torch_eager", "explicit"), ("torch_sdpa", "sdpa")):
        twin = TorchLlama(config.to_dict(), dtype=torch.float32, attention=attention)
        twin.load_glassllm_state(model.state_dict())
        params = dict(twin.named_parameters())
        topt = torch.optim.AdamW(
            [{"params": [p for p in params.values() if p.ndim >= 2], "weight_decay": tc.weight_decay},
             {"params": [p for p in params.values() if p.ndim < 2], "weight_decay": 0.0}],
            lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps)
        theirs = sampler()

        def torch_step(twin=twin, topt=topt, theirs=theirs):
            x, y = theirs.next_batch()
            topt.zero_grad(set_to_none=True)
            loss = twin.loss(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(twin.parameters(), tc.grad_clip)
            topt.step()
            return loss.item()

        steps[name] = torch_step
    if hand and threads == 1:
        from bench.numpy_step import NumpyStep

        for name, attention in (("numpy_hand", "dense"), ("numpy_hand_tiled", "tiled")):
            written = NumpyStep(model.state_dict(), config, lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps,
                                weight_decay=tc.weight_decay, grad_clip=tc.grad_clip, attention=attention)
            batches = sampler()
            steps[name] = lambda written=written, batches=batches: written.step(*batches.next_batch())[0]
    return config, model, steps


def time_round_robin(steps: dict, repeats: int, warmup: int = 2) -> tuple[dict, dict]:
    names = list(steps)
    losses = {}
    for name in names:
        for _ in range(warmup):
            losses[name] = steps[name]()
    times = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            losses[name] = steps[name]()
            times[name].append(time.perf_counter() - t0)
    return times, losses


def main(argv=None) -> int:
    keep_freed_memory()  # freed activations stay mapped for the next step, as in the commands
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per thread count")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dim", type=int, default=128,
                        help="model width (default config at 128; otherwise heads of 32, LLaMA's MLP width)")
    parser.add_argument("--hand", action="store_true",
                        help="also time the hand-written NumPy step (bench/numpy_step.py), at 1 thread")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "bench_train.json"))
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    if args.batch < 1 or args.seq < 1 or args.repeats < 1 or min(threads) < 1:
        parser.error("--batch, --seq, --repeats and --threads must be positive")
    if args.dim < 64 or args.dim % 64:
        parser.error("--dim must be a multiple of 64")

    import torch
    from threadpoolctl import threadpool_limits


    n_tokens = args.batch * args.seq
    load_before = os.getloadavg()
    results = []
    for k in threads:
        # Fresh models per thread count, so every count times the same steps of the same run.
        config, model, steps = build(args.batch, args.seq, args.seed, args.dim, threads=k, hand=args.hand)
        if not results:
            print(f"training step (AdamW, clip 1.0), width {config.dim} ({model.num_params():,} params), "
                  f"batch {args.batch} x {args.seq}, float32, {args.repeats} interleaved rounds, "
                  f"load average {load_before[0]:.2f}")
        torch.set_num_threads(k)
        with threadpool_limits(limits=k):
            times, losses = time_round_robin(steps, args.repeats)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        tps = {name: n_tokens / s for name, s in med.items()}
        row = {
            "threads": k, "median_s": med, "min_s": {n: min(ts) for n, ts in times.items()}, "all_s": times,
            "tokens_per_s": tps,
            "speed_glassllm_over": {n: tps["glassllm"] / tps[n] for n in tps if n.startswith(("torch", "numpy"))},
            "last_loss": losses,
        }
        results.append(row)
        print(f"\n{k} thread{'s' if k > 1 else ''}:")
        for name in med:
            print(f"  {name:16s} median {med[name] * 1e3:8.1f} ms   {tps[name]:9.0f} tokens/s")
        for name, ratio in row["speed_glassllm_over"].items():
            print(f"  glassllm tokens/s / {name} tokens/s = {ratio:.2f}")
        print("  losses after the timed steps: " + ", ".join(f"{n} {v:.4f}" for n, v in losses.items()))

    report = {
        "benchmark": "training step (forward, backward, clip, AdamW)",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config.to_dict(), "batch": args.batch, "seq": args.seq, "dtype": "float32",
        "repeats": args.repeats, "results": results,
        "environment": environment(load_before),
    }
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
