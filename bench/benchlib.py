"""What every benchmark script records about the machine, and how it writes its JSON.

Benchmarks run as modules from the repository root (``python -m bench.bench_x``)
and import it as ``bench.benchlib``; ``bench/run``, a script, imports it from its own folder, and so
this module imports NumPy only where it is used (``bench/run`` works without it).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path


def environment(load_before=None) -> dict:
    """Versions, the processor, CPU count, BLAS thread pools, OPENBLAS_* variables and the load average."""
    import numpy as np
    from threadpoolctl import threadpool_info

    env = {"python": platform.python_version(), "numpy": np.__version__,
           "machine": platform.machine(), "processor": processor(), "cpu_count": os.cpu_count()}
    try:
        import torch
        env["torch"] = torch.__version__
    except ImportError:
        pass
    if load_before is not None:
        env["load_average_before"] = load_before
    env["load_average_after"] = os.getloadavg()
    env["threadpools"] = [{k: v for k, v in info.items() if k != "filepath"} for info in threadpool_info()]
    env["openblas_env"] = {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS")}
    return env


def processor() -> str:
    """The processor's model name (Linux: /proc/cpuinfo), else what :func:`platform.processor` says: ratios
    between two BLAS libraries, such as NumPy's OpenBLAS and PyTorch's MKL, depend on it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_report(path, report: dict) -> None:
    """Write ``report`` as indented JSON, atomically (numpy scalars become floats)."""
    from glassllm.checkpoint import atomic_write

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(report, indent=2, default=float) + "\n")
    print(f"\nwrote {out}")


def time_round_robin(runs: dict, repeats: int) -> tuple[dict, dict, dict]:
    """Warm each run up once, then time ``repeats`` interleaved rounds A B C, B C A, ...

    Returns (wall seconds, CPU seconds of this process, warm-up outputs), each a
    dict keyed like ``runs``. Rotating the order spreads a noisy neighbour over
    every run; on a shared machine the CPU time is the steadier figure.
    """
    names = list(runs)
    outputs = {name: runs[name]() for name in names}  # warm-up (allocations, caches)
    wall = {name: [] for name in names}
    cpu = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            c0, t0 = time.process_time(), time.perf_counter()
            runs[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return wall, cpu, outputs
