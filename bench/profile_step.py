"""Where a training step's time goes: CPU time per autograd op, forward and backward.

One step of the default model at batch 16 x 256 (forward, cross-entropy,
backward, clipping, AdamW), 1 BLAS thread. Every public op of
:mod:`glassllm.autograd` and the fused ops of :mod:`glassllm.kernels`
are wrapped with a timer (``time.thread_time``: this thread's CPU time, so
other jobs on a shared machine count less than in wall time), and so is each
backward closure they record. The step runs ``--steps`` times; the fastest
step's table is printed, with the median step beside it. Also counted: the
minor page faults of the forward and of the backward (``getrusage``).

This is a development tool, not a comparison: see ``bench/run`` for those.
Run from the repository root::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.profile_step
"""

from __future__ import annotations

import argparse
import collections
import functools
import resource
import statistics
import sys
import time

import numpy as np

from glassllm.heap import keep_freed_memory

OPS = ["add", "sub", "mul", "div", "neg", "pow", "matmul", "sum", "mean", "exp", "log", "sqrt", "sigmoid", "silu",
       "softmax", "cross_entropy", "reshape", "transpose", "getitem", "embedding", "concatenate", "split",
       "masked_fill", "linear", "rms_norm", "rope", "attention", "swiglu"]


def instrument():
    """Wrap the ops; returns (forward seconds, backward seconds) counters keyed by op name."""
    from glassllm import autograd as ag
    from glassllm.ops import dense, flash, linear, mlp, norm

    clock = time.thread_time
    fwd, bwd = collections.Counter(), collections.Counter()
    current = [None]
    make = ag.make_op

    def timed_make(data, parents, backward):
        name = current[0]

        def timed_backward(g, _backward=backward, _name=name):
            t0 = clock()
            out = _backward(g)
            bwd[_name] += clock() - t0
            return out
        return make(data, parents, timed_backward)

    ag.make_op = timed_make                   # every op, and every kernel, ends in ag.make_op

    def wrap(module, name):
        f = getattr(module, name)

        @functools.wraps(f)
        def timed(*args, **kwargs):
            outer, current[0] = current[0], name
            t0 = clock()
            try:
                return f(*args, **kwargs)
            finally:
                if outer is None:             # an op inside an op counts in the outer one
                    fwd[name] += clock() - t0
                current[0] = outer
        setattr(module, name, timed)

    for name in OPS:
        if hasattr(ag, name):                 # (older versions lack some ops; profile what is there)
            wrap(ag, name)
    for module, name in ((dense, "attention"), (norm, "rms_norm"), (mlp, "swiglu"), (linear, "linear_stacked"),
                         (flash, "flash_attention"), (flash, "self_attention")):
        wrap(module, name)                    # the kernels' fused ops, where the kernels look them up
    return fwd, bwd


def main(argv=None) -> int:
    keep_freed_memory()  # freed activations stay mapped for the next step, as in the commands
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128,
                        help="model width: the default config at 128, else bench_train's config of that width")
    args = parser.parse_args(argv)

    from threadpoolctl import threadpool_limits

    from bench_train import model_config
    from glassllm.nn import Transformer
    from glassllm.optim import AdamW, clip_grad_norm

    fwd, bwd = instrument()
    config = model_config(args.dim)
    model = Transformer(config, seed=0)
    opt = AdamW(model.named_parameters())
    rng = np.random.default_rng(0)
    x = rng.integers(0, config.vocab_size, (args.batch, args.seq))
    y = rng.integers(0, config.vocab_size, (args.batch, args.seq))

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    steps = []
    with threadpool_limits(limits=1):
        for _ in range(args.steps):
            fwd.clear()
            bwd.clear()
            f0, t0 = faults(), time.thread_time()
            opt.zero_grad()
            loss = model.loss(x, y)
            f1, t1 = faults(), time.thread_time()
            loss.backward()
            f2, t2 = faults(), time.thread_time()
            clip_grad_norm(model.parameters(), 1.0)
            opt.step()
            t3 = time.thread_time()
            steps.append({"total": t3 - t0, "forward": t1 - t0, "backward": t2 - t1, "optimizer": t3 - t2,
                          "faults": (f1 - f0, f2 - f1), "fwd": dict(fwd), "bwd": dict(bwd)})
    best = min(steps, key=lambda s: s["total"])
    print(f"one training step, width {config.dim}, batch {args.batch} x {args.seq}, 1 thread, CPU seconds: fastest of {args.steps} "
          f"{best['total']:.3f} (median {statistics.median(s['total'] for s in steps):.3f}) = forward "
          f"{best['forward']:.3f} + backward {best['backward']:.3f} + clip and AdamW {best['optimizer']:.3f}")
    print(f"minor page faults in that step: forward {best['faults'][0]}, backward {best['faults'][1]} "
          f"(the first step: {steps[0]['faults'][0]}, {steps[0]['faults'][1]})\n")
    names = sorted(set(best["fwd"]) | set(best["bwd"]), key=lambda n: -(best["fwd"].get(n, 0) + best["bwd"].get(n, 0)))
    print(f"  {'op':16s} {'forward':>8s} {'backward':>9s} {'share':>6s}")
    for n in names:
        f, b = best["fwd"].get(n, 0.0), best["bwd"].get(n, 0.0)
        print(f"  {n:16s} {f:8.3f} {b:9.3f} {(f + b) / best['total']:6.0%}")
    rest = best["total"] - sum(best["fwd"].values()) - sum(best["bwd"].values())
    print(f"  {'(engine, optimizer, Python)':16s} {rest:18.3f} {rest / best['total']:6.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
