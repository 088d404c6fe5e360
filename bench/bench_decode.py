"""Decoding speed: glassllm beside a PyTorch KV-cache decode loop, same weights, in one run.

Batch 1, a 16-token prompt plus 256 new tokens, greedy, float32, 1 thread
(numpy's BLAS via threadpoolctl, torch via ``torch.set_num_threads``):

- ``glassllm``: :func:`glassllm.generate.generate` end to end (records, probabilities
  and all), on its default path -- the lean NumPy step of :mod:`glassllm.kernels.decode`;
- ``glassllm_sampled``: the same with temperature 0.8 and top-k 40 (the cost of sampling);
- ``glassllm_module``: the same API forced onto the module path (``fast=False``),
  the path a tracer sees;
- ``torch``: a small PyTorch LLaMA decode loop written here -- preallocated KV
  cache, ``scaled_dot_product_attention`` with GQA, ``inference_mode`` -- with
  the same weights.

Tokens/s counts the 256 new tokens over the whole call (prefill included). Each
variant is warmed up, then timed ``--repeats`` times in interleaved rounds;
medians of wall time (the headline) and of this process's CPU time (steadier
when other jobs share the cores) are reported with ratios. Then:

- **growth**: time per token as the cache grows from m = 16 to the full context,
  per step, median over ``--growth-repeats`` runs, with linear and quadratic fits
  (attention reads m keys, so a step should cost a + b*m: linear in m);
- **where the time goes**: the lean step alone, the same GEMMs alone, the module
  step alone, so the per-token cost splits into matrix work, NumPy per-op
  overhead, and the API's own work (softmax for ``prob``, records, sampling).

The model is the bundled one when present, else random weights of a trained-like
scale (so greedy choices are not near-ties and both sides must agree token for
token). Results go to JSON. Run from the repository root::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m bench.bench_decode
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from bench.benchlib import environment, time_round_robin, write_report  # noqa: E402
from glassllm.heap import keep_freed_memory  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------
# The model, and its PyTorch twin
# ----------------------------------------------------------------------------

def load(seed: int):
    from glassllm.checkpoint import bundled_model_path, load_model
    from glassllm.nn import Transformer

    if bundled_model_path().exists():
        model, _, _ = load_model(bundled_model_path(), dtype=np.float32)
        return model, "bundled"
    from tests.support.glassllm_testing import randomize
    model = randomize(Transformer(seed=seed, dtype=np.float32), np.random.default_rng(seed + 1))
    return model, "random (trained-like scale)"


class TorchDecoder:
    """A LLaMA decode loop in PyTorch with a preallocated KV cache (batch 1, float32).

    ``step(ids, start)``: logits (V,) of the last of the n = len(ids) tokens at
    positions start .. start+n-1, writing their keys/values into the cache.
    """

    def __init__(self, model):
        import torch

        c = model.config
        self.c = c
        self.H, self.G, self.D = c.n_heads, c.n_kv_heads, c.head_dim
        sd = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in model.state_dict().items()}
        self.sd = sd
        L = c.n_layers
        self.k = torch.zeros(L, 1, self.G, c.max_seq_len, self.D)          # (L, 1, G, ctx, D)
        self.v = torch.zeros(L, 1, self.G, c.max_seq_len, self.D)
        inv = c.rope_theta ** (-torch.arange(0, self.D, 2, dtype=torch.float64) / self.D)  # (D/2,)
        ang = torch.arange(c.max_seq_len, dtype=torch.float64)[:, None] * inv           # (ctx, D/2)
        self.cos, self.sin = ang.cos().float(), ang.sin().float()

    def _rope(self, x, cos, sin):
        pairs = x.unflatten(-1, (-1, 2))                                    # (1, h, n, D/2, 2)
        x0, x1 = pairs[..., 0], pairs[..., 1]
        return torch_stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos)).flatten(-2)  # (1, h, n, D)

    def step(self, ids, start: int):
        import torch
        import torch.nn.functional as F

        c, sd, H, G, D = self.c, self.sd, self.H, self.G, self.D
        n = len(ids)
        m = start + n
        cos, sin = self.cos[start:m], self.sin[start:m]                     # (n, D/2)
        x = sd["tok_embeddings.weight"][torch.as_tensor(ids)]               # (n, C)
        for i in range(c.n_layers):
            p = f"layers.{i}."
            h = F.rms_norm(x, (c.dim,), sd[p + "attention_norm.weight"], c.norm_eps)
            q = F.linear(h, sd[p + "attention.wq.weight"]).view(1, n, H, D).transpose(1, 2)  # (1, H, n, D)
            k = F.linear(h, sd[p + "attention.wk.weight"]).view(1, n, G, D).transpose(1, 2)  # (1, G, n, D)
            v = F.linear(h, sd[p + "attention.wv.weight"]).view(1, n, G, D).transpose(1, 2)  # (1, G, n, D)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            self.k[i, :, :, start:m] = k
            self.v[i, :, :, start:m] = v
            out = F.scaled_dot_product_attention(q, self.k[i, :, :, :m], self.v[i, :, :, :m],
                                                 is_causal=n > 1 and start == 0, enable_gqa=True)  # (1, H, n, D)
            x = x + F.linear(out.transpose(1, 2).reshape(n, H * D), sd[p + "attention.wo.weight"])
            h = F.rms_norm(x, (c.dim,), sd[p + "ffn_norm.weight"], c.norm_eps)
            gate = F.linear(h, sd[p + "feed_forward.w1.weight"])
            up = F.linear(h, sd[p + "feed_forward.w3.weight"])
            x = x + F.linear(F.silu(gate) * up, sd[p + "feed_forward.w2.weight"])
        last = F.rms_norm(x[-1], (c.dim,), sd["norm.weight"], c.norm_eps)
        return F.linear(last, sd["output.weight"])                          # (V,)

    def greedy(self, prompt: list[int], new: int, stamps: list | None = None) -> list[int]:
        import torch

        out = []
        with torch.inference_mode():
            logits = self.step(prompt, 0)
            start = len(prompt)
            for s in range(new):
                i = int(logits.argmax())
                out.append(i)
                if stamps is not None:
                    stamps.append((time.perf_counter(), time.process_time()))
                if s + 1 < new:
                    logits = self.step([i], start)
                    start += 1
        return out


def torch_stack(parts):
    import torch
    return torch.stack(parts, dim=-1)


# ----------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------

def glassllm_run(model, prompt, new, stamps=None, **kw):
    from glassllm.generate import generate

    out = []
    for t in generate(model, None, prompt, max_new_tokens=new, **kw):
        out.append(t.id)
        if stamps is not None:
            stamps.append((time.perf_counter(), time.process_time()))
    return out


def growth(step_runs: dict, prompt_len: int, ctx: int, repeats: int, window: int = 16) -> dict:
    """Per-step time for m = prompt_len+1 .. ctx-1 keys, and how it grows with m.

    Each step's time (wall and CPU) is the median over ``repeats`` runs; then
    medians over windows of ``window`` steps damp the spikes of a shared
    machine. Fits on the window medians: a line t = a + b*m, and the slope of
    the first half against the second (a step that grows linearly in m has
    equal slopes; a quadratic one, a later slope about three times the earlier).
    """
    new = ctx - prompt_len
    result = {}
    for name, run in step_runs.items():
        per_run = []
        for _ in range(repeats):
            stamps = [(time.perf_counter(), time.process_time())]
            run(new, stamps)
            per_run.append(np.diff(np.array(stamps), axis=0)[1:])          # (steps, 2); prefill dropped
        dts = np.median(np.array(per_run), axis=0)                         # (new - 1, 2) seconds
        m = np.arange(prompt_len + 1, prompt_len + 1 + len(dts))           # keys each step reads
        k = len(dts) // window
        wm = m[: k * window].reshape(k, window).mean(axis=1)               # (k,) window centres
        result[name] = {"m": wm.tolist()}
        for clock, dt in (("wall", dts[:, 0]), ("cpu", dts[:, 1])):
            wt = np.median(dt[: k * window].reshape(k, window), axis=1) * 1e6  # (k,) us per token
            b, a = np.polyfit(wm, wt, 1)
            fit = a + b * wm
            r2 = 1 - ((wt - fit) ** 2).sum() / max(((wt - wt.mean()) ** 2).sum(), 1e-30)
            half = k // 2
            result[name][clock] = {
                "us_per_token": wt.tolist(),
                "linear_fit_us": {"a": float(a), "b_per_key": float(b), "r2": float(r2)},
                "slope_early_us_per_key": float(np.polyfit(wm[:half], wt[:half], 1)[0]),
                "slope_late_us_per_key": float(np.polyfit(wm[half:], wt[half:], 1)[0]),
                "first_window_us": float(wt[0]), "last_window_us": float(wt[-1]),
            }
    return result


def breakdown(model, prompt, new: int, repeats: int) -> dict:
    """Per-token microseconds (medians of interleaved rounds; wall and CPU) of: generate()
    end to end, the lean step alone, the GEMMs of the lean step alone, the module step alone."""
    from glassllm.autograd import no_grad
    from glassllm.kernels import FastDecoder

    lean = FastDecoder(model)
    tok = np.array([[7]])
    prompt_ids = np.array([prompt])
    mats = [w for layer in lean.layers for w in (*layer.attention_in, layer.wo, *layer.ffn_in, layer.w2)]
    mats.append(lean.head)                                                  # the lean step's matrices
    x_in = {w.shape[0]: np.ones((1, w.shape[0]), dtype=np.float32) for w in mats}

    def timed(fn):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        return (time.perf_counter() - t0) / new, (time.process_time() - c0) / new

    def steps(forward):
        cache = model.new_cache(1)
        with no_grad():
            forward(prompt_ids, cache)

            def loop():
                for _ in range(new):
                    forward(tok, cache)
            return timed(loop)

    def gemms():
        for _ in range(new):
            for w in mats:
                x_in[w.shape[0]] @ w

    parts = {"api": [], "lean_step": [], "lean_gemm": [], "module_step": []}
    for _ in range(repeats):
        parts["api"].append(timed(lambda: glassllm_run(model, prompt, new, temperature=0)))
        parts["lean_step"].append(steps(lean))
        parts["lean_gemm"].append(timed(gemms))
        parts["module_step"].append(steps(lambda t, c: model(t, c)))
    out = {}
    for clock, j in (("wall", 0), ("cpu", 1)):
        us = {k + "_us": statistics.median(v[j] for v in vals) * 1e6 for k, vals in parts.items()}
        us["lean_other_numpy_us"] = us["lean_step_us"] - us["lean_gemm_us"]
        us["api_overhead_us"] = us["api_us"] - us["lean_step_us"]
        out[clock] = us
    return out


def main(argv=None) -> int:
    keep_freed_memory()  # freed activations stay mapped for the next step, as in the commands
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15, help="timed rounds")
    parser.add_argument("--growth-repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "bench_decode.json"))
    args = parser.parse_args(argv)
    if min(args.prompt_len, args.new, args.repeats, args.growth_repeats) < 1:
        parser.error("--prompt-len, --new, --repeats and --growth-repeats must be positive")

    import torch
    from threadpoolctl import threadpool_limits


    model, source = load(args.seed)
    ctx = model.config.max_seq_len
    if args.prompt_len + args.new > ctx:
        parser.error(f"--prompt-len + --new exceeds the context {ctx}")
    prompt = np.random.default_rng(args.seed).integers(0, model.config.vocab_size, args.prompt_len).tolist()
    twin = TorchDecoder(model)
    torch.set_num_threads(1)
    print(f"decode, batch 1, {args.prompt_len}-token prompt + {args.new} new tokens, greedy, float32, 1 thread; "
          f"model: {source} ({model.num_params():,} params); load average {os.getloadavg()[0]:.2f}")

    runs = {
        "glassllm": lambda: glassllm_run(model, prompt, args.new, temperature=0),
        "glassllm_sampled": lambda: glassllm_run(model, prompt, args.new, temperature=0.8, top_k=40, seed=0),
        "glassllm_module": lambda: glassllm_run(model, prompt, args.new, temperature=0, fast=False),
        "torch": lambda: twin.greedy(prompt, args.new),
    }
    with threadpool_limits(limits=1):
        times, cpu, outputs = time_round_robin(runs, args.repeats)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        med_cpu = {name: statistics.median(ts) for name, ts in cpu.items()}
        tps = {name: args.new / s for name, s in med.items()}
        tps_cpu = {name: args.new / s for name, s in med_cpu.items()}
        agree = {name: outputs[name] == outputs["torch"] for name in ("glassllm", "glassllm_module")}
        print()
        for name in med:
            print(f"  {name:17s} wall median {med[name] * 1e3:7.1f} ms  min {min(times[name]) * 1e3:7.1f} ms"
                  f"  {tps[name]:6.0f} tokens/s  |  CPU median {med_cpu[name] * 1e3:7.1f} ms  {tps_cpu[name]:6.0f} tokens/s")
        speedup = med["torch"] / med["glassllm"]
        speedup_cpu = med_cpu["torch"] / med_cpu["glassllm"]
        print(f"  speed glassllm / torch: {speedup:.2f}x wall, {speedup_cpu:.2f}x CPU (target >= 2x: "
              f"{'met' if speedup >= 2 else 'not met'}); {tps['glassllm']:.0f} tokens/s wall, "
              f"{tps_cpu['glassllm']:.0f} CPU (target >= 3000: {'met' if tps['glassllm'] >= 3000 else 'not met'})")
        print(f"  speed glassllm / glassllm_module: {med['glassllm_module'] / med['glassllm']:.2f}x")
        print(f"  greedy tokens equal to torch's: {agree}")

        print(f"\ngrowth: time per token from m = {args.prompt_len + 1} to {ctx - 1} "
              f"(median of {args.growth_repeats} runs)")
        grow = growth({
            "glassllm": lambda new, stamps: glassllm_run(model, prompt, new, stamps, temperature=0),
            "glassllm_module": lambda new, stamps: glassllm_run(model, prompt, new, stamps, temperature=0,
                                                                fast=False),
            "torch": lambda new, stamps: twin.greedy(prompt, new, stamps),
        }, args.prompt_len, ctx, args.growth_repeats)
        for name, g in grow.items():
            for clock in ("wall", "cpu"):
                c, f = g[clock], g[clock]["linear_fit_us"]
                print(f"  {name:16s} {clock:4s} {c['first_window_us']:6.0f} us at m~{g['m'][0]:.0f} -> "
                      f"{c['last_window_us']:6.0f} us at m~{g['m'][-1]:.0f};  fit {f['a']:.0f} + "
                      f"{f['b_per_key']:.3f}*m us (R^2 {f['r2']:.2f});  slope early "
                      f"{c['slope_early_us_per_key']:.3f} vs late {c['slope_late_us_per_key']:.3f} us/key")

        parts = breakdown(model, prompt, args.new, args.repeats)
    print("\nwhere a glassllm token's time goes (us per token, medians of interleaved rounds):")
    for clock, us in parts.items():
        print(f"  {clock:4s} generate() {us['api_us']:5.0f} = lean step {us['lean_step_us']:5.0f} "
              f"(GEMMs {us['lean_gemm_us']:4.0f} + other NumPy ops and Python {us['lean_other_numpy_us']:4.0f}) "
              f"+ the API's own work {us['api_overhead_us']:4.0f} (prob softmax, records);  "
              f"module step {us['module_step_us']:5.0f}")

    report = {
        "benchmark": "decode",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": source, "config": model.config.to_dict(),
        "prompt_len": args.prompt_len, "new_tokens": args.new, "batch": 1, "dtype": "float32", "threads": 1,
        "repeats": args.repeats,
        "median_s": med, "min_s": {k: min(v) for k, v in times.items()}, "all_s": times,
        "median_cpu_s": med_cpu, "all_cpu_s": cpu,
        "tokens_per_s": tps, "tokens_per_cpu_s": tps_cpu,
        "speedup_glassllm_over_torch": speedup, "speedup_glassllm_over_torch_cpu": speedup_cpu,
        "targets": {"speedup_vs_torch": 2.0, "tokens_per_s": 3000.0,
                    "met": {"speedup": speedup >= 2.0, "tokens_per_s": tps["glassllm"] >= 3000.0}},
        "greedy_tokens_equal_torch": agree,
        "growth": grow,
        "breakdown_us": parts,
        "environment": environment(),
    }
    write_report(args.out, report)
    return 0 if math.isfinite(speedup) else 1


if __name__ == "__main__":
    sys.exit(main())
