"""Forward + backward of the default model, glassllm beside PyTorch, in one run.

One training step's worth of work -- logits, cross-entropy, gradients of every
parameter -- at batch 16 x 256 tokens in float32, for:

- ``glassllm``: the NumPy model (its fast path: fused ops, no tracer);
- ``torch_eager``: the tests' independent PyTorch LLaMA (``tests/torch_reference.py``),
  spelled-out attention, same weights;
- ``torch_sdpa``: the same, with ``scaled_dot_product_attention``.

For each thread count (numpy's BLAS via threadpoolctl, torch via
``torch.set_num_threads``) every implementation is warmed up once, then timed
``--repeats`` times in interleaved rounds (the order rotates every round, so
drifting machine load hits everyone alike). Medians are reported, and the
ratio glassllm / torch (> 1 means glassllm is slower). Results go to JSON.

Run from the repository root::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.bench_model
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from bench.benchlib import environment, time_round_robin, write_report  # noqa: E402
from glassllm.heap import keep_freed_memory  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def build(batch: int, seq: int, seed: int):
    """The glassllm model, two PyTorch twins with its weights, and one batch of tokens/targets."""
    import torch

    from glassllm.config import ModelConfig
    from glassllm.nn import Transformer
    from tests.support.torch_reference import TorchLlama

    config = ModelConfig()
    if seq > config.max_seq_len:
        raise ValueError(f"--seq {seq} exceeds the model's context {config.max_seq_len}")
    model = Transformer(config, seed=seed, dtype=np.float32)
    twins = {}
    for name, attention in (("torch_eager", "explicit"), ("torch_sdpa", "sdpa")):
        twin = TorchLlama(config.to_dict(), dtype=torch.float32, attention=attention)
        twin.load_glassllm_state(model.state_dict())
        twins[name] = twin
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab_size, (batch, seq))
    targets = rng.integers(0, config.vocab_size, (batch, seq))
    return config, model, twins, tokens, targets


def make_steps(model, twins, tokens, targets):
    """name -> zero-argument function doing one forward + backward, returning the loss."""
    import torch

    t_tokens = torch.as_tensor(tokens)
    t_targets = torch.as_tensor(targets)

    def glassllm_step():
        model.zero_grad()
        loss = model.loss(tokens, targets)
        loss.backward()
        return loss.item()

    def torch_step(twin):
        def step():
            twin.zero_grad(set_to_none=True)
            logits = twin(t_tokens)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), t_targets.reshape(-1))
            loss.backward()
            return loss.item()
        return step

    return {"glassllm": glassllm_step, **{name: torch_step(twin) for name, twin in twins.items()}}


def main(argv=None) -> int:
    keep_freed_memory()  # freed activations stay mapped for the next step, as in the commands
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per thread count")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "bench_model.json"))
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    if args.batch < 1 or args.seq < 1 or args.repeats < 1 or min(threads) < 1:
        parser.error("--batch, --seq, --repeats and --threads must be positive")

    import torch
    from threadpoolctl import threadpool_limits


    config, model, twins, tokens, targets = build(args.batch, args.seq, args.seed)
    steps = make_steps(model, twins, tokens, targets)
    n_tokens = args.batch * args.seq
    load_before = os.getloadavg()
    print(f"forward+backward, default config ({model.num_params():,} params), batch {args.batch} x {args.seq}, "
          f"float32, {args.repeats} interleaved rounds, load average {load_before[0]:.2f}")

    results = []
    for k in threads:
        torch.set_num_threads(k)
        with threadpool_limits(limits=k):
            times, _, losses = time_round_robin(steps, args.repeats)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        ref_loss = losses["torch_eager"]
        agree = abs(losses["glassllm"] - ref_loss) / abs(ref_loss)
        row = {
            "threads": k,
            "median_s": med,
            "min_s": {name: min(ts) for name, ts in times.items()},
            "all_s": times,
            "tokens_per_s": {name: n_tokens / s for name, s in med.items()},
            "ratio_glassllm_over": {name: med["glassllm"] / med[name] for name in med if name != "glassllm"},
            "loss": losses,
            "loss_rel_diff_vs_torch": agree,
        }
        results.append(row)
        print(f"\n{k} thread{'s' if k > 1 else ''}:")
        for name in med:
            print(f"  {name:12s} median {med[name] * 1e3:8.1f} ms   min {row['min_s'][name] * 1e3:8.1f} ms"
                  f"   {row['tokens_per_s'][name]:9.0f} tokens/s")
        for name, ratio in row["ratio_glassllm_over"].items():
            print(f"  ratio glassllm / {name}: {ratio:.2f}x")
        print(f"  loss glassllm {losses['glassllm']:.6f} vs torch {ref_loss:.6f} (rel diff {agree:.1e})")

    report = {
        "benchmark": "model forward+backward",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config.to_dict(),
        "batch": args.batch, "seq": args.seq, "dtype": "float32", "repeats": args.repeats,
        "results": results,
        "environment": environment(load_before),
    }
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
