"""The PyTorch twin's trainer on 1 and on 2 processes (torchrun, gloo, CPU), side by side.

Each configuration trains the default model shape (or ``--dim``/``--layers``) for
``--steps`` steps of the same *global* batch, ``--repeats`` times, alternating
1 and 2 processes so that drifting machine load hits both alike. The time of a
step comes from the run's own history (``train_state.safetensors``), with the
first two steps (warm-up) left out; the median over steps and repeats is
reported as milliseconds per step and tokens per second, with the ratio
2-process / 1-process step time (< 1 means DDP is faster). Torch threads: one
per process on 2 processes, ``--threads`` on 1 process (default 1: one core
against two, the scaling DDP buys). Results go to JSON.

Run from the repository root::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.bench_ddp
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "tinystories" / "train.txt"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(nproc: int, threads: int, args: list[str], out: Path) -> list[float]:
    """One training run; returns the per-step wall times after warm-up (seconds)."""
    from safetensors import safe_open

    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "GLOO_SOCKET_IFNAME": "lo"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--nnodes", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           "-m", "glassllm.torch.train_ddp", *args, "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"training on {nproc} process(es) failed:\n{done.stderr[-2000:]}")
    with safe_open(str(out / "train_state.safetensors"), framework="numpy") as f:
        history = json.loads(f.metadata()["history"])
    times = np.diff([0.0] + [row["elapsed_s"] for row in history])
    return times[2:].tolist()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch", type=int, default=16, help="global batch (windows)")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the 1-process run")
    p.add_argument("--json", default=str(ROOT / "bench" / "results" / "ddp.json"))
    a = p.parse_args()

    from glassllm.tokenizer import Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if SHARED.exists():
            text = SHARED.read_text(encoding="utf-8")[:2_000_000]
        else:
            rng = np.random.default_rng(0)
            words = "once upon a time there was little girl named lily she liked to play in the park".split()
            text = "\n<|endoftext|>\n".join(" ".join(rng.choice(words, 80)) for _ in range(3000))
        (tmp / "data.txt").write_text(text, encoding="utf-8")
        Tokenizer.train([tmp / "data.txt"], vocab_size=1024).save(tmp / "tok.json")
        args = ["--data", str(tmp / "data.txt"), "--tokenizer", str(tmp / "tok.json"),
                "--cache-dir", str(tmp / "cache"), "--no-progress", "--steps", str(a.steps),
                "--batch-size", str(a.batch), "--seq-len", str(a.seq), "--dim", str(a.dim),
                "--n-layers", str(a.layers), "--checkpoint-every", "0"]
        times = {1: [], 2: []}
        for r in range(a.repeats):
            for nproc in ((1, 2) if r % 2 == 0 else (2, 1)):
                threads = a.threads if nproc == 1 else 1
                times[nproc] += _run(nproc, threads, args, tmp / f"run{nproc}_{r}")

    tokens = a.batch * a.seq
    result = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
              "model": {"dim": a.dim, "n_layers": a.layers}, "global_batch": [a.batch, a.seq],
              "steps_timed": {str(k): len(v) for k, v in times.items()}}
    for nproc, ts in times.items():
        med = statistics.median(ts)
        result[f"{nproc}proc"] = {"ms_per_step": round(med * 1e3, 1), "tokens_per_s": round(tokens / med)}
        print(f"{nproc} process(es): {med * 1e3:8.1f} ms/step  {tokens / med:10,.0f} tokens/s")
    ratio = statistics.median(times[2]) / statistics.median(times[1])
    result["ratio_2proc_over_1proc"] = round(ratio, 3)
    print(f"step time, 2 processes / 1 process: {ratio:.2f}")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
