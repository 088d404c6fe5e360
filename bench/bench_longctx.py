"""Long context: the tiled attention beside PyTorch's ``scaled_dot_product_attention``, in one run.

Default heads (H = 4 query heads sharing G = 2 key/value heads of D = 32),
float32, 1 thread (numpy's BLAS via threadpoolctl, torch via ``set_num_threads``):

1. **Attention forward at 4,096 tokens** (batch 1, causal): time and the peak
   memory one call adds --

   - ``glassllm_flash``: :func:`glassllm.kernels.flash_attention` on q, k, v;
   - ``glassllm_packed``: :func:`glassllm.kernels.self_attention`, the model's
     path, from the packed projections with RoPE inside;
   - ``torch_sdpa``: ``scaled_dot_product_attention(is_causal=True, enable_gqa=True)``;
   - ``glassllm_dense`` (memory only): the fused dense op, which holds the
     (H, T, T) probabilities -- what the tiles avoid.

2. **Model forward at 4,096 tokens**: the whole default model (``max_seq_len``
   raised to 4,096) under no-grad, glassllm beside the tests' PyTorch LLaMA
   with SDPA (``tests/torch_reference.py``), same weights. Time and peak memory.

3. **Training step at context 2,048** (batch 1, forward + loss + backward):
   time beside PyTorch, and ``tracemalloc``'s peak of every NumPy buffer during
   the step, against the size of ONE head's T x T float32 matrix (16 MiB) and
   of the H x T x T probabilities a dense step keeps per layer.

4. ``--tune``: the block sizes of :mod:`glassllm.kernels.flash` (``BLOCK_Q``,
   ``BLOCK_K``, ``TILE_BYTES``) swept on the 4,096-token forward and on the
   16 x 256 training-shape forward + backward.

Times: every variant warmed up, then ``--repeats`` interleaved rounds (order
rotating), medians and ratios. Memory: each variant in a *fresh* subprocess
that builds its inputs, runs a small warm-up (imports, lazy initialisation),
resets the kernel's high-water mark (``/proc/self/clear_refs``) and reads
``VmHWM - VmRSS`` around the first full-size call -- a second call could reuse
heap the first one freed and show nothing. Results go to JSON.

Run from the repository root::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.bench_longctx
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from bench.benchlib import environment, time_round_robin, write_report  # noqa: E402
from glassllm.heap import keep_freed_memory  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

MIB = 2 ** 20
H, G, D = 4, 2, 32
TARGETS = {"forward_memory_vs_sdpa": 1.0, "forward_time_vs_sdpa": 2.0}


# ----------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------

def attention_inputs(T: int, seed: int = 0):
    """q (1, H, T, D), k, v (1, G, T, D), the packed qkv (1, T, (H+2G)D) and RoPE tables (T, D/2)."""
    rng = np.random.default_rng(seed)
    qkv = rng.standard_normal((1, T, (H + 2 * G) * D)).astype(np.float32)
    parts = qkv.reshape(1, T, H + 2 * G, D)
    q = np.ascontiguousarray(parts[:, :, :H].transpose(0, 2, 1, 3))
    k = np.ascontiguousarray(parts[:, :, H:H + G].transpose(0, 2, 1, 3))
    v = np.ascontiguousarray(parts[:, :, H + G:].transpose(0, 2, 1, 3))
    angles = np.arange(T)[:, None] * 10000.0 ** (-np.arange(0, D, 2) / D)
    return q, k, v, qkv, np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def model_pair(T: int, seed: int = 0, torch_too: bool = True):
    """The default model with context T, its PyTorch twin (SDPA) and one row of T tokens."""
    from glassllm.config import ModelConfig
    from glassllm.nn import Transformer

    config = ModelConfig(max_seq_len=T)
    model = Transformer(config, seed=seed, dtype=np.float32)
    twin = None
    if torch_too:
        import torch

        from tests.support.torch_reference import TorchLlama
        twin = TorchLlama(config.to_dict(), dtype=torch.float32, attention="sdpa")
        twin.load_glassllm_state(model.state_dict())
    tokens = np.random.default_rng(seed).integers(0, config.vocab_size, (1, T + 1))
    return model, twin, tokens


# ----------------------------------------------------------------------------
# The runs (each returns a zero-argument function)
# ----------------------------------------------------------------------------

def attention_runs(T: int, names):
    from glassllm import autograd as ag
    from glassllm.kernels import attention, flash_attention, self_attention

    q, k, v, qkv, cos, sin = attention_inputs(T)
    scale = 1.0 / np.sqrt(D)
    runs = {}
    for name in names:
        if name == "glassllm_flash":
            def run():
                with ag.no_grad():
                    return flash_attention(q, k, v, scale).data
        elif name == "glassllm_packed":
            def run():
                with ag.no_grad():
                    return self_attention(qkv, H, G, cos, sin).data
        elif name == "glassllm_dense":
            from glassllm.nn import causal_mask
            mask = causal_mask(T, T)

            def run():
                with ag.no_grad():
                    return attention(q, k, v, mask, scale).data
        elif name == "torch_sdpa":
            import torch
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))

            def run():
                with torch.no_grad():
                    return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                                            enable_gqa=True)
        else:
            raise ValueError(f"unknown attention variant {name!r}")
        runs[name] = run
    return runs


def model_forward_runs(T: int, names):
    from glassllm import autograd as ag

    model, twin, tokens = model_pair(T, torch_too="torch_sdpa" in names)
    x = tokens[:, :-1]
    runs = {}
    if "glassllm" in names:
        def run_glassllm():
            with ag.no_grad():
                return model(x).data[0, -1]
        runs["glassllm"] = run_glassllm
    if "torch_sdpa" in names:
        import torch
        tx = torch.as_tensor(x)

        def run_torch():
            with torch.no_grad():
                return twin(tx)[0, -1].numpy()
        runs["torch_sdpa"] = run_torch
    return runs


def train_step_runs(T: int, names):
    model, twin, tokens = model_pair(T, torch_too="torch_sdpa" in names)
    x, y = tokens[:, :-1], tokens[:, 1:]
    runs = {}
    if "glassllm" in names:
        def run_glassllm():
            model.zero_grad()
            loss = model.loss(x, y)
            loss.backward()
            return loss.item()
        runs["glassllm"] = run_glassllm
    if "torch_sdpa" in names:
        def run_torch():
            twin.zero_grad(set_to_none=True)
            loss = twin.loss(x, y)
            loss.backward()
            return loss.item()
        runs["torch_sdpa"] = run_torch
    return runs


# ----------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------

def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"{field} not in /proc/self/status")


def peak_added_mib(run) -> dict:
    """Run once; the most resident memory the call added (MiB), from the kernel's high-water mark.

    Free heap memory is first handed back to the system (glibc ``malloc_trim``),
    so that what the call allocates must be faulted in and shows in the mark.
    """
    import ctypes

    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                    # reset VmHWM to the current VmRSS
    before = _status_kib("VmRSS")
    run()
    peak = _status_kib("VmHWM")
    return {"rss_before_mib": before / 1024, "peak_rss_mib": peak / 1024, "added_mib": (peak - before) / 1024}


def child(kind: str, name: str, T: int) -> dict:
    """In a fresh process: warm up at a small size, then measure one full-size call."""
    from threadpoolctl import threadpool_limits

    if name.startswith("torch"):
        import torch
        torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        if kind == "attention":
            attention_runs(64, [name])[name]()
            run = attention_runs(T, [name])[name]
        elif kind == "model_forward":
            model_forward_runs(128, [name])[name]()
            run = model_forward_runs(T, [name])[name]
        elif kind == "train_step":
            train_step_runs(128, [name])[name]()
            run = train_step_runs(T, [name])[name]
        else:
            raise ValueError(f"unknown measurement {kind!r}")
        return peak_added_mib(run)


def in_fresh_process(kind: str, name: str, T: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, name, str(T)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{kind}/{name} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _traced_peak(run) -> float:
    """tracemalloc's peak of NumPy (and Python) allocations during ``run()``, over the start, in bytes."""
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before


def traced_peak_train_step(T: int) -> dict:
    """No T x T buffer per head in a training step at context T, shown two ways with tracemalloc.

    - a narrow model (C = 32, one layer, V = 64), whose O(T) activations are
      small: the whole step must peak below ONE head's T x T float32 matrix;
    - the default model at T/2 and T: a step's peak must grow linearly, about
      2x -- T x T buffers would add 4x as much for the second.
    """
    from glassllm.config import ModelConfig
    from glassllm.nn import Transformer

    narrow = Transformer(ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64,
                                     max_seq_len=T), seed=0)
    tokens = np.random.default_rng(0).integers(0, 64, (1, T + 1))
    narrow.loss(tokens[:, :128], tokens[:, 1:129]).backward()          # warm caches at a small size

    def narrow_step():
        narrow.zero_grad()
        narrow.loss(tokens[:, :-1], tokens[:, 1:]).backward()

    one_head = T * T * 4
    narrow_peak = _traced_peak(narrow_step)
    peaks = {}
    for t in (T // 2, T):
        run = train_step_runs(t, ["glassllm"])["glassllm"]
        peaks[t] = _traced_peak(run)
    return {"narrow_model_peak_mib": narrow_peak / MIB, "one_head_t_by_t_mib": one_head / MIB,
            "dense_probabilities_per_layer_mib": H * one_head / MIB,
            "default_model_peak_mib": {str(t): p / MIB for t, p in peaks.items()},
            "default_model_growth": peaks[T] / peaks[T // 2],
            "below_one_t_by_t": narrow_peak < one_head}


def tune(repeats: int) -> dict:
    """Block sizes of glassllm.kernels.flash on the two shapes that matter; medians in seconds."""
    from glassllm import autograd as ag
    from glassllm.kernels import flash

    q, k, v, qkv, cos, sin = attention_inputs(4096)
    rng = np.random.default_rng(1)
    qkv_train = ag.Tensor(rng.standard_normal((16, 256, (H + 2 * G) * D)).astype(np.float32), requires_grad=True)
    g_train = rng.standard_normal((16, 256, H * D)).astype(np.float32)
    cos_t, sin_t = cos[:256], sin[:256]
    grid = [(32, 1024, 1 << 20), (64, 256, 1 << 20), (64, 512, 1 << 20), (64, 1024, 1 << 18),
            (64, 1024, 1 << 20), (64, 1024, 1 << 22), (64, 4096, 1 << 20), (128, 1024, 1 << 20),
            (128, 512, 1 << 20), (256, 1024, 1 << 20)]
    saved = flash.TILE_BYTES
    runs = {}
    for bq, bk, tile in grid:
        def fwd4096(bq=bq, bk=bk, tile=tile):
            flash.TILE_BYTES = tile
            with ag.no_grad():
                flash.flash_attention(q, k, v, 1.0 / np.sqrt(D), block_q=bq, block_k=bk)

        def train256(bq=bq, bk=bk, tile=tile):
            flash.TILE_BYTES = tile
            out = flash.self_attention(qkv_train, H, G, cos_t, sin_t, None, bq, bk)
            out.backward(g_train)
        runs[f"fwd4096 bq={bq} bk={bk} tile={tile >> 10}K"] = fwd4096
        runs[f"train16x256 bq={bq} bk={bk} tile={tile >> 10}K"] = train256
    try:
        times = time_round_robin(runs, repeats)[0]
    finally:
        flash.TILE_BYTES = saved
    return {name: statistics.median(ts) for name, ts in times.items()}


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------

def main(argv=None) -> int:
    keep_freed_memory()  # freed activations stay mapped for the next step, as in the commands
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=4096, help="forward length (attention and model)")
    parser.add_argument("--train-seq", type=int, default=2048, help="training-step context")
    parser.add_argument("--repeats", type=int, default=5, help="timed interleaved rounds")
    parser.add_argument("--tune", action="store_true", help="also sweep glassllm.kernels.flash block sizes")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "bench_longctx.json"))
    args = parser.parse_args(argv)
    if args.seq < 64 or args.train_seq < 128 or args.repeats < 1:
        parser.error("--seq >= 64, --train-seq >= 128 and --repeats >= 1 are needed")

    import torch
    from threadpoolctl import threadpool_limits

    from glassllm.kernels import flash

    torch.set_num_threads(1)
    load_before = os.getloadavg()
    print(f"long context: heads H={H} G={G} D={D}, float32, 1 thread, {args.repeats} interleaved rounds, "
          f"load average {load_before[0]:.2f}; flash blocks BLOCK_Q={flash.BLOCK_Q} BLOCK_K={flash.BLOCK_K} "
          f"TILE_BYTES={flash.TILE_BYTES >> 10}K")
    report = {"benchmark": "long context", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "heads": {"H": H, "G": G, "D": D}, "dtype": "float32", "threads": 1, "repeats": args.repeats,
              "blocks": {"BLOCK_Q": flash.BLOCK_Q, "BLOCK_K": flash.BLOCK_K, "TILE_BYTES": flash.TILE_BYTES},
              "targets": TARGETS}

    with threadpool_limits(limits=1):
        # 1. attention forward
        T = args.seq
        runs = attention_runs(T, ["glassllm_flash", "glassllm_packed", "torch_sdpa"])
        ref = runs["torch_sdpa"]().numpy()
        agree = float(np.abs(runs["glassllm_flash"]() - ref).max())
        times = time_round_robin(runs, args.repeats)[0]
        med = {n: statistics.median(ts) for n, ts in times.items()}
        memory = {n: in_fresh_process("attention", n, T)
                  for n in ("glassllm_flash", "glassllm_packed", "torch_sdpa", "glassllm_dense")}
        att = {"seq": T, "median_s": med, "all_s": times,
               "time_ratio_vs_sdpa": {n: med[n] / med["torch_sdpa"] for n in med},
               "memory": memory,
               "memory_ratio_vs_sdpa": {n: memory[n]["added_mib"] / max(memory["torch_sdpa"]["added_mib"], 1e-9)
                                        for n in memory},
               "max_abs_diff_vs_torch": agree}
        report["attention_forward"] = att
        print(f"\n1. attention forward, batch 1 x {T} (max |glassllm - torch| = {agree:.1e}):")
        for n in memory:
            t = f"{med[n] * 1e3:8.1f} ms  {att['time_ratio_vs_sdpa'][n]:5.2f}x sdpa" if n in med else " " * 25
            print(f"  {n:16s} {t}   peak +{memory[n]['added_mib']:7.1f} MiB"
                  f"  ({att['memory_ratio_vs_sdpa'][n]:5.2f}x sdpa)")

        # 2. model forward
        runs = model_forward_runs(T, ["glassllm", "torch_sdpa"])
        agree = float(np.abs(runs["glassllm"]() - runs["torch_sdpa"]()).max())
        times = time_round_robin(runs, args.repeats)[0]
        med = {n: statistics.median(ts) for n, ts in times.items()}
        memory = {n: in_fresh_process("model_forward", n, T) for n in ("glassllm", "torch_sdpa")}
        report["model_forward"] = {
            "seq": T, "median_s": med, "all_s": times, "time_ratio_vs_torch": med["glassllm"] / med["torch_sdpa"],
            "memory": memory,
            "memory_ratio_vs_torch": memory["glassllm"]["added_mib"] / max(memory["torch_sdpa"]["added_mib"], 1e-9),
            "max_abs_logit_diff": agree}
        print(f"\n2. model forward (default config, context {T}), batch 1 x {T}, "
              f"logits agree within {agree:.1e}:")
        for n in med:
            print(f"  {n:16s} {med[n] * 1e3:8.1f} ms   peak +{memory[n]['added_mib']:7.1f} MiB")

        # 3. training step at 2048
        T2 = args.train_seq
        runs = train_step_runs(T2, ["glassllm", "torch_sdpa"])
        times = time_round_robin(runs, args.repeats)[0]
        med = {n: statistics.median(ts) for n, ts in times.items()}
        memory = {n: in_fresh_process("train_step", n, T2) for n in ("glassllm", "torch_sdpa")}
        traced = traced_peak_train_step(T2)
        report["train_step"] = {"seq": T2, "median_s": med, "all_s": times,
                                "time_ratio_vs_torch": med["glassllm"] / med["torch_sdpa"],
                                "memory": memory, "tracemalloc": traced}
        print(f"\n3. training step (forward, loss, backward), batch 1 x {T2}:")
        for n in med:
            print(f"  {n:16s} {med[n] * 1e3:8.1f} ms   peak +{memory[n]['added_mib']:7.1f} MiB")
        grow = traced["default_model_peak_mib"]
        print(f"  tracemalloc, every NumPy buffer: a narrow model's whole step (C=32, 1 layer) peaks at "
              f"+{traced['narrow_model_peak_mib']:.1f} MiB, below one head's T x T float32 "
              f"({traced['one_head_t_by_t_mib']:.0f} MiB; dense attention keeps "
              f"{traced['dense_probabilities_per_layer_mib']:.0f} MiB per layer): {traced['below_one_t_by_t']}")
        print(f"  the default model's step peaks at " + ", ".join(f"+{v:.1f} MiB at T={t}" for t, v in grow.items())
              + f": x{traced['default_model_growth']:.2f} for twice the context (linear = 2)")

        if args.tune:
            print("\n4. block sizes (medians):")
            report["tune_median_s"] = tune(args.repeats)
            for name, s in report["tune_median_s"].items():
                print(f"  {name:40s} {s * 1e3:8.1f} ms")

    # The targets: a 4,096-token forward (the model's, PyTorch's with SDPA the reference)
    # adds no more memory, and the attention takes at most twice SDPA's time.
    att = report["attention_forward"]
    met = {"forward_memory": report["model_forward"]["memory_ratio_vs_torch"] <= TARGETS["forward_memory_vs_sdpa"],
           "forward_time": att["time_ratio_vs_sdpa"]["glassllm_flash"] <= TARGETS["forward_time_vs_sdpa"],
           "no_t_by_t_in_training": report["train_step"]["tracemalloc"]["below_one_t_by_t"]}
    report["met"] = met
    print(f"\ntargets: a {args.seq}-token model forward adds no more memory than PyTorch's with SDPA: "
          f"{'met' if met['forward_memory'] else 'MISSED'}; attention time <= 2x sdpa: "
          f"{'met' if met['forward_time'] else 'MISSED'}; training step at {args.train_seq} "
          f"without a T x T buffer: {'met' if met['no_t_by_t_in_training'] else 'MISSED'}")
    report["environment"] = environment(load_before)
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
