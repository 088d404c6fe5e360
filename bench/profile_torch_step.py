"""Where PyTorch's training step spends its time: the counterpart of ``bench/profile_step.py``.

The same step as ``bench/bench_train.py``'s ``torch_sdpa`` (the tests' PyTorch
LLaMA with ``scaled_dot_product_attention``, ``torch.optim.AdamW``,
``clip_grad_norm_``), 1 thread, under ``torch.profiler``. Prints the ATen ops
by self CPU time per step, grouped the way ``profile_step.py`` groups
glassllm's: matrix products, attention, and everything else. The profiler adds
its own cost to every op (a few microseconds each), so the per-step total is
above ``bench_train.py``'s timing; the split is what this is for.

This is a development tool, not a comparison: see ``bench/run`` for those.
Run from the repository root::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.profile_torch_step --dim 256
"""

from __future__ import annotations

import argparse
import collections
import sys

import numpy as np

GROUPS = {"aten::mm": "matrix products", "aten::bmm": "matrix products", "aten::addmm": "matrix products"}


def group(name: str) -> str:
    if name in GROUPS:
        return GROUPS[name]
    if "scaled_dot_product" in name:
        return "attention (SDPA kernels)"
    return "everything else"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (after 2 warm-up steps)")
    parser.add_argument("--dim", type=int, default=128,
                        help="model width: the default config at 128, else bench_train's config of that width")
    parser.add_argument("--top", type=int, default=15, help="how many ops to list")
    args = parser.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench_train import model_config
    from glassllm.nn import Transformer
    from tests.support.torch_reference import TorchLlama

    torch.set_num_threads(1)
    config = model_config(args.dim)
    twin = TorchLlama(config.to_dict(), dtype=torch.float32, attention="sdpa")
    twin.load_glassllm_state(Transformer(config, seed=0).state_dict())
    opt = torch.optim.AdamW(twin.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    x = rng.integers(0, config.vocab_size, (args.batch, args.seq))
    y = rng.integers(0, config.vocab_size, (args.batch, args.seq))

    def step():
        opt.zero_grad(set_to_none=True)
        twin.loss(x, y).backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
        opt.step()

    for _ in range(2):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
    events = [(e.key, e.self_cpu_time_total / 1e6 / args.steps) for e in prof.key_averages()]
    total = sum(t for _, t in events)
    groups = collections.Counter()
    for name, t in events:
        groups[group(name)] += t
    print(f"PyTorch training step, width {config.dim}, batch {args.batch} x {args.seq}, 1 thread, "
          f"profiled: {total:.3f} s per step (self CPU time, mean of {args.steps})\n")
    for name, t in groups.most_common():
        print(f"  {name:28s} {t:7.3f} s  {t / total:4.0%}")
    print(f"\n  top ops by self CPU time per step:")
    for name, t in sorted(events, key=lambda e: -e[1])[:args.top]:
        print(f"  {name[:60]:60s} {t:7.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
