"""Memory of training: peak RSS of a training step at batch 16 x 256, glassllm beside PyTorch.

Each measurement runs in a *fresh* Python process that builds the default
model, its AdamW and one batch, then takes ``--steps`` full training steps
(forward, cross-entropy, backward, clipping to norm 1.0, AdamW) -- exactly
what ``glassllm train`` and ``bench/bench_train.py`` time:

- ``glassllm``: :func:`glassllm.train.train_step`; this process never imports torch;
- ``torch_sdpa`` / ``torch_eager``: the tests' independent PyTorch LLaMA
  (``tests/torch_reference.py``; fused or spelled-out attention) with
  ``torch.optim.AdamW`` (two parameter groups) and ``clip_grad_norm_``.

Reported per implementation (medians over ``--runs`` fresh processes, run in
alternation): the process's peak resident set (``VmHWM``) over the whole run,
its resident set once everything is built (``VmRSS`` before the first step,
mostly the imported libraries), and what the steps add on top of that. The
target compares the peaks: glassllm's must not exceed PyTorch's.

Run from the repository root::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.bench_memory
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from bench.benchlib import environment, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("glassllm", "torch_sdpa", "torch_eager")


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise OSError(f"{field} not in /proc/self/status")


def child(name: str, batch: int, seq: int, steps: int) -> dict:
    """Build, then train ``steps`` steps in this process; memory figures in MiB."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    if name == "glassllm":
        from glassllm.config import ModelConfig
        from glassllm.heap import keep_freed_memory
        from glassllm.nn import Transformer
        from glassllm.optim import AdamW
        from glassllm.train import TrainConfig, train_step

        keep_freed_memory()                    # as glassllm train does

        tc = TrainConfig(batch_size=batch, seq_len=seq)
        config = ModelConfig()
        model = Transformer(config, seed=0, dtype=np.float32)
        opt = AdamW(model.named_parameters(), lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps,
                    weight_decay=tc.weight_decay)
        x = rng.integers(0, config.vocab_size, (batch, seq))
        y = rng.integers(0, config.vocab_size, (batch, seq))

        def step():
            return train_step(model, opt, [(x, y)], tc.lr, tc.grad_clip)[0]
    else:
        import torch

        from tests.support.torch_reference import TorchLlama

        torch.set_num_threads(1)
        config = dict(vocab_size=1024, dim=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=352,
                      max_seq_len=512, norm_eps=1e-5, rope_theta=10000.0)
        twin = TorchLlama(config, dtype=torch.float32, attention="sdpa" if name == "torch_sdpa" else "explicit")
        params = dict(twin.named_parameters())
        opt = torch.optim.AdamW(
            [{"params": [p for p in params.values() if p.ndim >= 2], "weight_decay": 0.1},
             {"params": [p for p in params.values() if p.ndim < 2], "weight_decay": 0.0}],
            lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
        x = rng.integers(0, 1024, (batch, seq))
        y = rng.integers(0, 1024, (batch, seq))

        def step():
            opt.zero_grad(set_to_none=True)
            loss = twin.loss(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
            opt.step()
            return loss.item()
    built = _status_mib("VmRSS")
    with threadpool_limits(limits=1):
        for _ in range(steps):
            loss = step()
    peak = _status_mib("VmHWM")
    return {"peak_rss_mib": peak, "rss_built_mib": built, "steps_add_mib": peak - built, "last_loss": float(loss)}


def in_fresh_process(name: str, batch: int, seq: int, steps: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, str(batch), str(seq), str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        name, batch, seq, steps = sys.argv[2], *map(int, sys.argv[3:6])
        print(json.dumps(child(name, batch, seq, steps)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="training steps per process")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per implementation")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "bench_memory.json"))
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    if min(args.batch, args.seq, args.steps, args.runs) < 1 or not set(variants) <= set(VARIANTS):
        parser.error(f"--batch/--seq/--steps/--runs must be positive; --variants a subset of {VARIANTS}")


    load_before = os.getloadavg()
    print(f"peak RSS of training (AdamW, clip 1.0), default config, batch {args.batch} x {args.seq}, float32, "
          f"{args.steps} steps per fresh process, {args.runs} processes each, load average {load_before[0]:.2f}")
    runs = {name: [] for name in variants}
    for _ in range(args.runs):
        for name in variants:
            runs[name].append(in_fresh_process(name, args.batch, args.seq, args.steps))
    med = {name: {key: statistics.median(r[key] for r in rs) for key in ("peak_rss_mib", "rss_built_mib",
                                                                        "steps_add_mib")}
           for name, rs in runs.items()}
    print(f"\n  {'':12s} {'peak RSS':>10s} {'built':>10s} {'steps add':>10s}   (MiB, medians)")
    for name, m in med.items():
        print(f"  {name:12s} {m['peak_rss_mib']:10.1f} {m['rss_built_mib']:10.1f} {m['steps_add_mib']:10.1f}")
    ratios = {name: med["glassllm"]["peak_rss_mib"] / med[name]["peak_rss_mib"]
              for name in med if name != "glassllm" and "glassllm" in med}
    for name, r in ratios.items():
        print(f"  peak RSS glassllm / {name}: {r:.2f}  (target <= 1: {'met' if r <= 1 else 'MISSED'})")
    report = {
        "benchmark": "training memory (peak RSS)",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "batch": args.batch, "seq": args.seq, "steps": args.steps, "runs": args.runs, "dtype": "float32",
        "median_mib": med, "all": runs, "peak_ratio_glassllm_over": ratios,
        "met": {name: r <= 1.0 for name, r in ratios.items()},
        "environment": environment(load_before),
    }
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
