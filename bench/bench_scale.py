#!/usr/bin/env python3
"""Engineer scale: glassllm on random-weight Llamas of real small models' shapes, beside transformers and
TransformerLens on the same weights.

Shapes (``--shapes``): ``135m`` (SmolLM2-135M: width 576, 30 layers, 9/3 heads, vocabulary 49,152, MLP 1536,
tied head), ``360m`` (SmolLM2-360M: 960, 32 layers, 15/5, MLP 2560, tied) and ``1b`` (TinyLlama-1.1B: 2048,
22 layers, 32/4, vocabulary 32,000, MLP 5632, untied). Each model is built with ``transformers`` (random
initialisation, seed 0, no download) and saved as a Hugging Face folder with a byte-level ``tokenizer.json``
of the model's vocabulary in SmolLM2's layout (``Digits`` then ``ByteLevel``; its merges are byte pairs).

Measured, 1 BLAS thread (``--threads``), medians of ``--repeats``:

- load: a glassllm model file and the folder with ``LlamaForCausalLM.from_pretrained``, each in a fresh
  process (wall time; peak RSS above the interpreter's, as a multiple of the file size);
- import: ``glassllm import FOLDER OUT`` in a fresh process (wall time, peak RSS over the folder's size);
- forward of 64 and 256 tokens (untraced; at 256, glassllm's also with every layer's reference code, the
  code a trace runs, to show what a trace adds to it), a full trace of 256 tokens (every snapshot; transformers with
  every hidden state and attention, TransformerLens ``run_with_cache``), gradients of 256 tokens (the
  loss back-propagated; glassllm's full trace and its lazy trace), 64 greedy tokens;
- decoding alone, in a fresh process: 64 greedy tokens and the peak RSS they add above the loaded model;
- the inspector, in a fresh process: the first view of a 32- and a 256-token prompt and the switches
  after it (another layer, a gradient of another layer, the head grid and its gradients, the logit lens), and
  its peak RSS;
- the offline export of a 32-token prompt: its default bound, and with two layers chosen (``--no-export``
  leaves it out).

Run by ``bench/run --scale`` (minutes, not part of the default run), or alone::

    nice -n 5 python -m bench.bench_scale --shapes 135m --out bench/results/scale.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

SHAPES = {
    "135m": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                 intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0),
    "360m": dict(hidden_size=960, num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
                 intermediate_size=2560, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,   # a smoke test
                 intermediate_size=128, vocab_size=1024, tie_word_embeddings=True, rope_theta=10000.0),
    "1b": dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
               intermediate_size=5632, vocab_size=32000, tie_word_embeddings=False, rope_theta=10000.0),
}
TEXT = ("Once upon a time, in 1987, a small robot named Pip counted 42 stars over the harbour. "
        "  It said:\n\t\"Café au lait, s'il vous plaît!\" — and then 3.14159 more things happened.\n") * 40

# Targets of the 135M shape (1 thread, this machine).
TARGETS = {
    "load_s": 1.0, "load_rss_x_file": 1.2, "import_rss_x_file": 1.5,
    "inspector_256_first_s": 5.0, "inspector_256_switch_max_s": 1.5, "inspector_256_peak_gb": 3.0,
    "export_32_s": 60.0, "export_32_mb": 50.0,
}


# ----------------------------------------------------------------------------
# Building the folder
# ----------------------------------------------------------------------------

def build_folder(shape: str, folder: Path) -> None:
    """A random-weight Llama of ``shape`` saved by transformers, with a byte-level tokenizer.json."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = SHAPES[shape]
    config = LlamaConfig(max_position_embeddings=2048, rms_norm_eps=1e-5, hidden_act="silu",
                         attention_bias=False, mlp_bias=False, bos_token_id=None, eos_token_id=spec["vocab_size"] - 1,
                         **spec)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder, safe_serialization=True)

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    alphabet.sort(key=lambda c: _byte_of(c))
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = []
    n_merges = spec["vocab_size"] - 256 - 1
    for a in alphabet:
        for b in alphabet:
            if len(merges) == n_merges:
                break
            merges.append((a, b))
            vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(folder / "tokenizer.json"))


def _byte_of(c: str) -> int:
    from glassllm.hf import _bytes_to_unicode

    return {v: k for k, v in _bytes_to_unicode().items()}[c]


def _tensor_names(path: Path) -> set[str]:
    """The tensor names in a safetensors file's header."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return set(json.loads(f.read(n))) - {"__metadata__"}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


# ----------------------------------------------------------------------------
# Phases, each in a fresh process: one JSON line on stdout
# ----------------------------------------------------------------------------

def _status_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _phase(argv: list[str], timeout: float = 3600) -> dict:
    run = subprocess.run([sys.executable, "-m", "bench.bench_scale", "--phase", *argv], capture_output=True,
                         text=True, timeout=timeout, cwd=HERE.parent,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    if run.returncode != 0:
        raise RuntimeError(f"phase {argv[0]} failed: {run.stderr.strip().splitlines()[-1:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def phase_load(path: str) -> dict:
    from glassllm.checkpoint import load_model

    base = _status_kb("VmHWM")
    t0 = time.perf_counter()
    model, _, _ = load_model(path)
    seconds = time.perf_counter() - t0
    return {"s": seconds, "peak_kb": _status_kb("VmHWM") - base}


def phase_hf_load(folder: str) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(1)
    base = _status_kb("VmHWM")
    t0 = time.perf_counter()
    LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    seconds = time.perf_counter() - t0
    return {"s": seconds, "peak_kb": _status_kb("VmHWM") - base}


def phase_import(folder: str, out: str) -> dict:
    from glassllm.importer import import_model

    base = _status_kb("VmHWM")
    t0 = time.perf_counter()
    import_model(folder, out)
    seconds = time.perf_counter() - t0
    return {"s": seconds, "peak_kb": _status_kb("VmHWM") - base}


def phase_decode(path: str) -> dict:
    """64 greedy tokens after a 64-token prompt on the lean decoder: time, and peak RSS above the loaded model's
    (the KV cache and a step's activations; no second copy of the weights)."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    from glassllm.checkpoint import load_model
    from glassllm.generate import generate
    from glassllm.heap import keep_freed_memory

    threadpool_limits(1)
    keep_freed_memory()
    model, _, _ = load_model(path)
    prompt = np.random.default_rng(0).integers(0, model.config.vocab_size - 1, 64).tolist()
    loaded = _status_kb("VmHWM")
    t0, c0 = time.perf_counter(), time.process_time()
    ids = [t.id for t in generate(model, None, prompt, max_new_tokens=64, temperature=0)]
    return {"s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "tokens": len(ids),
            "peak_gb": _status_kb("VmHWM") * 1024 / 1e9, "above_model_gb": (_status_kb("VmHWM") - loaded) * 1024 / 1e9}


def phase_gemms(path: str, repeats: int) -> dict:
    """The matrix products of one untraced 256-token forward alone (every layer's seven weights and the head),
    NumPy's BLAS beside PyTorch's on the same arrays, 1 thread: the floor under the forward's and the trace's
    ratios to transformers, which no change to glassllm's own code can go below."""
    import numpy as np
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    from bench.benchlib import time_round_robin
    from glassllm.checkpoint import load_model
    from glassllm.heap import keep_freed_memory

    threadpool_limits(1)
    torch.set_num_threads(1)
    keep_freed_memory()
    model, _, _ = load_model(path)
    weights = [np.ascontiguousarray(w.data) for name, w in model.named_parameters() if w.ndim == 2
               and not name.startswith("tok_embeddings")]
    if model.config.tie_embeddings:                     # the head is the embedding, used once more
        weights.append(np.ascontiguousarray(model.tok_embeddings.weight.data))
    rng = np.random.default_rng(0)
    xs = {c: rng.standard_normal((256, c), dtype=np.float32) for c in {w.shape[1] for w in weights}}  # (n, in)
    pairs = [(xs[w.shape[1]], w) for w in weights]
    torch_pairs = [(torch.from_numpy(x), torch.from_numpy(w)) for x, w in pairs]   # the same memory: the mapped file

    def numpy_run():
        for x, w in pairs:
            x @ w.T                                                     # (n, out)

    def torch_run():
        with torch.no_grad():
            for x, w in torch_pairs:
                torch.nn.functional.linear(x, w)                        # (n, out)
    wall, cpu, _ = time_round_robin({"numpy": numpy_run, "torch": torch_run}, repeats)
    blas = next((i["internal_api"] for i in threadpool_info() if i["user_api"] == "blas"), "?")
    return {"products": len(pairs), "numpy_blas": blas,
            "torch_blas": "mkl" if torch.backends.mkl.is_available() else "?",
            **{f"{k}_s": statistics.median(v) for k, v in wall.items()},
            **{f"{k}_cpu_s": statistics.median(v) for k, v in cpu.items()}}


def _prompt(tokenizer, n: int) -> str:
    ids = tokenizer.encode(TEXT)[:n]
    text = tokenizer.decode(ids)
    while len(tokenizer.encode(text)) > n:
        text = text[:-1]
    return text


def phase_inspector(path: str, n: int) -> dict:
    from threadpoolctl import threadpool_limits

    from glassllm.checkpoint import load_model
    from glassllm.inspector import Inspector, Limits
    from glassllm.inspector.schema import HeadsRequest, PromptRequest, SnapshotRequest

    threadpool_limits(1)
    model, tokenizer, meta = load_model(path)
    L = model.config.n_layers
    inspector = Inspector(model, tokenizer, Limits(max_prompt_tokens=512), meta)
    prompt = _prompt(tokenizer, n)
    n_tokens = len(inspector.encode(prompt))
    base = _status_kb("VmHWM")

    cpu = {}

    def timed(fn, req):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(req)
        cpu[len(cpu)] = time.process_time() - c0                # this process's CPU time, in order
        return time.perf_counter() - t0

    first = timed(inspector.snapshot, SnapshotRequest(prompt=prompt, name="attn.softmax", layer=0, head=0))
    switches = {
        "another layer's attention": timed(inspector.snapshot, SnapshotRequest(
            prompt=prompt, name="attn.softmax", layer=L // 2, head=1)),
        "a gradient of another layer": timed(inspector.snapshot, SnapshotRequest(
            prompt=prompt, name="mlp.out", layer=L - 1, grad=True)),   # width C: within --max-cells
        "back to the first layer": timed(inspector.snapshot, SnapshotRequest(
            prompt=prompt, name="attn.q", layer=0, head=2)),
        "a gradient of a middle layer": timed(inspector.snapshot, SnapshotRequest(
            prompt=prompt, name="resid_mid", layer=L // 3, grad=True)),
        "the final norm": timed(inspector.snapshot, SnapshotRequest(prompt=prompt, name="norm.out")),
        "the logit lens": timed(inspector.lens, PromptRequest(prompt=prompt)),
        "the head grid": timed(inspector.heads, HeadsRequest(prompt=prompt)),
        "the head grid's gradients": timed(inspector.heads, HeadsRequest(prompt=prompt, grad=True)),
    }
    switches_cpu = dict(zip(switches, list(cpu.values())[1:]))
    return {"tokens": n_tokens, "first_s": first, "switches_s": switches,
            "switch_max_s": max(switches.values()), "first_cpu_s": cpu[0], "switches_cpu_s": switches_cpu,
            "switch_max_cpu_s": max(switches_cpu.values()), "peak_gb": _status_kb("VmHWM") * 1024 / 1e9,
            "peak_above_model_gb": (_status_kb("VmHWM") - base) * 1024 / 1e9}


def phase_export(path: str, out: str, layers: str | None) -> dict:
    from threadpoolctl import threadpool_limits

    from glassllm.checkpoint import load_model
    from glassllm.inspector import Inspector, Limits
    from glassllm.inspector.export import ExportTooLarge, export_html

    threadpool_limits(1)
    model, tokenizer, meta = load_model(path)
    inspector = Inspector(model, tokenizer, Limits(), meta)
    prompt = _prompt(tokenizer, 32)
    chosen = None if layers is None else [int(i) for i in layers.split(",")]
    t0 = time.perf_counter()
    try:
        stats = export_html(inspector, prompt, out, layers=chosen)
        result = {"s": time.perf_counter() - t0, "mb": stats["bytes"] / 1e6, "refused": None,
                  "views": stats["responses"]}
    except ExportTooLarge as e:
        result = {"s": time.perf_counter() - t0, "mb": None, "refused": str(e)}
    result["peak_gb"] = _status_kb("VmHWM") * 1024 / 1e9
    result["layers"] = layers
    return result


def phase_compute(path: str, folder: str, repeats: int, tl: bool) -> dict:
    """Forward, trace, gradients and decoding of glassllm beside transformers (and TransformerLens)."""
    import numpy as np
    import torch
    from threadpoolctl import threadpool_limits
    from transformers import LlamaForCausalLM

    from bench.benchlib import time_round_robin
    from glassllm import kernels
    from glassllm.autograd import no_grad
    from glassllm.checkpoint import load_model
    from glassllm.generate import generate
    from glassllm.heap import keep_freed_memory
    from glassllm.trace import trace

    threadpool_limits(1)
    torch.set_num_threads(1)
    keep_freed_memory()                                 # as every benchmark and the glassllm commands do
    model, tokenizer, _ = load_model(path)
    hf = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager").eval()
    perm = None
    bridge = None
    if tl:
        try:
            from transformer_lens.model_bridge import TransformerBridge

            bridge = TransformerBridge.boot_transformers(folder, device="cpu", dtype=torch.float32)
            bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
        except Exception as e:                          # TransformerLens cannot boot it: say so, go on
            bridge = None
            print(f"TransformerLens: {type(e).__name__}: {e}", file=sys.stderr)
    rng = np.random.default_rng(0)
    V = model.config.vocab_size
    out = {"agreement": {}}
    ids = {n: rng.integers(0, V - 1, n) for n in (64, 256)}
    hf_ids = {n: torch.tensor(ids[n][None]) for n in ids}   # the synthetic tokenizer keeps Hugging Face's ids
    del perm

    with no_grad():
        ours = model(ids[64][None]).data[0]
    with torch.no_grad():
        theirs = hf(hf_ids[64]).logits[0].numpy()
    out["agreement"]["max_abs_logit_diff_64"] = float(np.max(np.abs(ours - theirs)))

    def fwd_ours(n):
        def run():
            with no_grad():
                return model(ids[n][None]).data
        return run

    def fwd_hf(n):
        def run():
            with torch.no_grad():
                return hf(hf_ids[n]).logits
        return run

    def fwd_reference(n):                               # every layer's reference code, as a trace runs it
        def run():
            with no_grad(), kernels.disabled():
                return model(ids[n][None]).data
        return run

    def fwd_tl(n):
        def run():
            with torch.no_grad():
                return bridge(hf_ids[n])
        return run

    rows = {}

    def measure(label, runs):
        wall, cpu, _ = time_round_robin(runs, repeats)
        rows[label] = {k: statistics.median(v) for k, v in wall.items()}
        rows[label + " (cpu)"] = {k: statistics.median(v) for k, v in cpu.items()}
        print(label, rows[label], file=sys.stderr)

    for n in (64, 256):
        runs = {"glassllm": fwd_ours(n), "transformers": fwd_hf(n)}
        if n == 256:
            runs["glassllm reference"] = fwd_reference(n)
        if bridge is not None:
            runs["TransformerLens"] = fwd_tl(n)
        measure(f"forward {n}", runs)

    targets = ids[256][1:]
    runs = {"glassllm": lambda: trace(model, ids[256]),
            "glassllm lazy": lambda: trace(model, ids[256], lazy=True),
            "transformers": lambda: _hf_full(hf, hf_ids[256])}
    if bridge is not None:
        runs["TransformerLens"] = lambda: _tl_cache(bridge, hf_ids[256])
    measure("trace 256", runs)

    full_targets = np.append(targets, 0)
    runs = {"glassllm": lambda: trace(model, ids[256], targets=full_targets),
            "glassllm lazy": lambda: trace(model, ids[256], targets=full_targets, lazy=True),
            "transformers": lambda: _hf_grad(hf, hf_ids[256])}
    measure("gradients 256", runs)

    prompt64 = ids[64]
    runs = {"glassllm": lambda: [t.id for t in generate(model, None, prompt64, max_new_tokens=64, temperature=0)],
            "transformers": lambda: hf.generate(hf_ids[64], max_new_tokens=64, min_new_tokens=64, do_sample=False,
                                                pad_token_id=0)}
    measure("64 greedy tokens", runs)
    ours_ids = runs["glassllm"]()
    theirs_ids = runs["transformers"]()[0, 64:].tolist()
    out["agreement"]["greedy_ids_equal"] = ours_ids == theirs_ids
    out["rows"] = rows
    return out


def _hf_full(hf, ids):
    import torch

    with torch.no_grad():
        return hf(ids, output_hidden_states=True, output_attentions=True)


def _tl_cache(bridge, ids):
    import torch

    with torch.no_grad():
        return bridge.run_with_cache(ids)


def _hf_grad(hf, ids):
    import torch

    hf.zero_grad(set_to_none=True)
    logits = hf(ids).logits[0]
    loss = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:])
    loss.backward()
    return float(loss)


# ----------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------

def run_shape(shape: str, work: Path, repeats: int, tl: bool, resume: bool = False, export: bool = True) -> dict:
    folder = work / f"hf-{shape}"
    done = work / f"{shape}-phases.json"                 # each phase's result, for --resume
    kept = json.loads(done.read_text()) if resume and done.is_file() else {}

    def phase(argv):
        key = " ".join(argv[:1] + [a for a in argv[1:] if not a.startswith(str(work))])
        if key not in kept:
            kept[key] = _phase(argv)
            done.write_text(json.dumps(kept))
        return kept[key]

    if not (resume and (folder / "tokenizer.json").is_file()):
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        build_folder(shape, folder)
        print(f"[{shape}] built the folder in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    out_file = work / f"{shape}.safetensors"
    src_bytes = folder_bytes(folder)
    imports = [phase(["import", str(folder), str(out_file), str(k)]) for k in range(max(1, repeats // 3))]
    file_bytes = out_file.stat().st_size
    print(f"[{shape}] import {imports}", file=sys.stderr)
    loads = [phase(["load", str(out_file), str(k)]) for k in range(repeats)]
    hf_loads = [phase(["hf_load", str(folder), str(k)]) for k in range(repeats)]
    print(f"[{shape}] load {loads} / transformers {hf_loads}", file=sys.stderr)

    def med(runs, key):
        return statistics.median(r[key] for r in runs)
    result = {
        "shape": SHAPES[shape], "folder_bytes": src_bytes, "file_bytes": file_bytes,
        "file_tied": "output.weight" not in _tensor_names(out_file),
        "import": {"s": med(imports, "s"), "peak_gb": med(imports, "peak_kb") * 1024 / 1e9,
                   "rss_x_folder": med(imports, "peak_kb") * 1024 / src_bytes,
                   "rss_x_file": med(imports, "peak_kb") * 1024 / file_bytes},
        "load": {"s": med(loads, "s"), "peak_gb": med(loads, "peak_kb") * 1024 / 1e9,
                 "rss_x_file": med(loads, "peak_kb") * 1024 / file_bytes},
        "transformers_load": {"s": med(hf_loads, "s"), "peak_gb": med(hf_loads, "peak_kb") * 1024 / 1e9},
    }
    result["compute"] = phase(["compute", str(out_file), str(folder), str(repeats), "1" if tl else "0"])
    result["decode"] = phase(["decode", str(out_file)])
    result["gemms"] = phase(["gemms", str(out_file), str(max(repeats, 5))])
    result["inspector"] = {str(n): phase(["inspector", str(out_file), str(n)]) for n in (32, 256)}
    print(f"[{shape}] inspector {result['inspector']}", file=sys.stderr)
    L = SHAPES[shape]["num_hidden_layers"]
    if not export:
        result["export"] = {}
        return result
    result["export"] = {"default": phase(["export", str(out_file), str(work / "page.html"), "-"]),
                        "two layers": phase(["export", str(out_file), str(work / "page2.html"), f"0,{L - 1}"]),
                        "one layer": phase(["export", str(out_file), str(work / "page1.html"), "0"])}
    print(f"[{shape}] export {result['export']}", file=sys.stderr)
    return result


def targets_table(results: dict) -> list[dict]:
    """The issue's targets for the 135M shape, each with the measured figure and whether it is met."""
    r = results.get("135m")
    if r is None:
        return []
    c = r["compute"]["rows"]
    i256 = r["inspector"]["256"]
    exp = r["export"].get("default")
    two = r["export"].get("one layer")

    def row(what, measured, target, met, unit=""):
        return {"what": what, "measured": measured, "target": target, "met": bool(met), "unit": unit}
    export_met = exp is not None and ((exp["refused"] is not None and "--html-layers" in exp["refused"]) or (
        exp["mb"] is not None and exp["mb"] <= 50 and exp["s"] <= 60))
    rows = [
        row("load", r["load"]["s"], "<= 1 s", r["load"]["s"] <= 1.0, "s"),
        row("load, peak RSS / file", r["load"]["rss_x_file"], "<= 1.2", r["load"]["rss_x_file"] <= 1.2, "x"),
        row("import, peak RSS / file", r["import"]["rss_x_file"], "<= 1.5", r["import"]["rss_x_file"] <= 1.5, "x"),
        row("inspector 256 tokens, first view", i256["first_s"], "<= 5 s", i256["first_s"] <= 5.0, "s"),
        row("inspector 256 tokens, slowest switch", i256["switch_max_s"], "<= 1.5 s", i256["switch_max_s"] <= 1.5, "s"),
        row("inspector 256 tokens, first view (CPU time)", i256["first_cpu_s"], "<= 5 s",
            i256["first_cpu_s"] <= 5.0, "s"),
        row("inspector 256 tokens, slowest switch (CPU time)", i256["switch_max_cpu_s"], "<= 1.5 s",
            i256["switch_max_cpu_s"] <= 1.5, "s"),
        row("inspector 256 tokens, peak RSS", i256["peak_gb"], "<= 3 GB", i256["peak_gb"] <= 3.0, "GB"),
    ]
    if exp is not None:                                  # (--no-export leaves them out)
        rows += [row("export 32 tokens, default", exp["s"], "<= 60 s and <= 50 MB, or refused in one line",
                     export_met, "s"),
                 row("export 32 tokens, one layer", two["mb"], "<= 50 MB", two["mb"] is not None and two["mb"] <= 50,
                     "MB")]
    # Ratios of CPU time (this process's, 1 thread): on a loaded machine the steadier figure.
    for label, key, goal in (("forward 256", "forward 256", 1.0), ("trace 256", "trace 256", 1.0),
                             ("64 greedy tokens", "64 greedy tokens", 1.0), ("gradients 256", "gradients 256", 1.2)):
        cpu = c.get(key + " (cpu)", c[key])
        ratio = cpu["glassllm"] / cpu["transformers"]
        rows.append(row(f"{label}, glassllm / transformers (CPU time)", ratio, f"<= {goal}", ratio <= goal, "x"))
        if "glassllm lazy" in cpu:
            ratio = cpu["glassllm lazy"] / cpu["transformers"]
            rows.append(row(f"{label}, glassllm lazy trace / transformers (CPU time)", ratio, f"<= {goal}",
                            ratio <= goal, "x"))
    return rows


def markdown(results: dict, env: dict) -> str:
    lines = ["Seconds of wall time, median, with this process's CPU time in brackets; peak RSS as measured.", "",
             "| shape | what | glassllm | transformers | TransformerLens | glassllm lazy |", "|---|---|---|---|---|---|"]
    for shape, r in results.items():
        tied = " (head tied: stored once)" if r.get("file_tied") else ""
        lines.append(f"| {shape} | model file; Hugging Face folder (MB) | {r['file_bytes'] / 1e6:.1f}{tied} "
                     f"| {r['folder_bytes'] / 1e6:.1f} | | |")
        lines.append(f"| {shape} | load (s; peak RSS / file) | {r['load']['s']:.2f}; {r['load']['rss_x_file']:.2f}x "
                     f"| {r['transformers_load']['s']:.2f}; {r['transformers_load']['peak_gb']:.2f} GB | | |")
        lines.append(f"| {shape} | import (s; peak RSS / file) | {r['import']['s']:.1f}; "
                     f"{r['import']['rss_x_file']:.2f}x | | | |")
        rows = r["compute"]["rows"]
        for key, row in rows.items():
            if key.endswith("(cpu)"):
                continue
            cpu = rows.get(key + " (cpu)", {})
            cell = lambda k: f"{row[k]:.2f} ({cpu[k]:.2f} CPU)" if k in row and k in cpu else ""  # noqa: E731
            lines.append(f"| {shape} | {key} (s) | {cell('glassllm')} | {cell('transformers')} | "
                         f"{cell('TransformerLens')} | {cell('glassllm lazy')} |")
            if "glassllm reference" in row:
                lines.append(f"| {shape} | {key}, every layer's reference code (the code a trace runs), untraced (s) | "
                             f"{cell('glassllm reference')} | | | |")
        if "gemms" in r:
            g = r["gemms"]
            lines.append(f"| {shape} | the forward 256's {g['products']} matrix products alone, NumPy ({g['numpy_blas']}) "
                         f"beside PyTorch ({g['torch_blas']}) (s) | {g['numpy_s']:.2f} ({g['numpy_cpu_s']:.2f} CPU) | "
                         f"{g['torch_s']:.2f} ({g['torch_cpu_s']:.2f} CPU) | | |")
        if "decode" in r:
            d = r["decode"]
            lines.append(f"| {shape} | 64 greedy tokens, a fresh process: time; peak RSS, and above the loaded model | "
                         f"{d['s']:.2f} ({d['cpu_s']:.2f} CPU); {d['peak_gb']:.2f} GB, {d['above_model_gb']:.2f} GB | "
                         "| | |")
        for n, i in r["inspector"].items():
            lines.append(f"| {shape} | inspector {i['tokens']} tokens: first view; slowest switch (s); peak RSS | "
                         f"{i['first_s']:.2f} ({i['first_cpu_s']:.2f} CPU); {i['switch_max_s']:.2f} "
                         f"({i['switch_max_cpu_s']:.2f} CPU); {i['peak_gb']:.2f} GB | | | |")
            each = ", ".join(f"{k} {v:.2f} ({i['switches_cpu_s'][k]:.2f} CPU)" for k, v in i["switches_s"].items())
            lines.append(f"| {shape} | inspector {i['tokens']} tokens, each switch (s) | {each} | | | |")
        for label, e in r["export"].items():
            what = (f"refused in one line after {e['s']:.1f} s: {e['refused']}" if e["refused"]
                    else f"{e['s']:.1f} s, {e['mb']:.1f} MB")
            lines.append(f"| {shape} | offline export, 32 tokens, {label} | {what} | | | |")
    rows = targets_table(results)
    if rows:
        lines += ["", "Targets (SmolLM2-135M shape, 1 thread):", "", "| target | measured | goal | met |",
                  "|---|---|---|---|"]
        for t in rows:
            m = t["measured"]
            shown = "" if m is None else f"{m:.2f} {t['unit']}"
            lines.append(f"| {t['what']} | {shown} | {t['target']} | {'yes' if t['met'] else 'no'} |")
    g = results.get("135m", {}).get("gemms")
    if g:
        lines += ["", f"At the 135M shape the forward's matrix products alone take "
                      f"{g['numpy_cpu_s'] / g['torch_cpu_s']:.2f}x PyTorch's CPU time (NumPy's {g['numpy_blas']} "
                      f"beside PyTorch's {g['torch_blas']}, the same shapes): the floor under the forward's and the "
                      "trace's ratios to transformers."]
    lines.append("")
    for shape, r in results.items():                  # a shape measured again since keeps its own run's machine
        e = r.get("environment", env)
        cpu = f"{e['processor']}, " if e.get("processor") else ""
        lines.append(f"{shape}: {cpu}{e.get('cpu_count')} cores, load average before/after "
                     f"{_loads(e.get('load_average_before'))} / {_loads(e.get('load_average_after'))} "
                     "(shared with other jobs while measured).")
        for entry, e in r.get("measured_again", {}).items():
            lines.append(f"{shape}, {entry} measured again: load average before/after "
                         f"{_loads(e.get('load_average_before'))} / {_loads(e.get('load_average_after'))}.")
    return "\n".join(lines) + "\n"


def _loads(values) -> str:
    return "?" if values is None else ", ".join(f"{v:.2f}" for v in values)


def _merged(out: Path, measured: dict, entries: list[str], command: str) -> tuple[dict, str, dict]:
    """The report at ``out`` with ``entries`` of each measured shape replaced: (results, command, environment)."""
    old = json.loads(out.read_text(encoding="utf-8"))
    results = old["results"]
    for shape, r in measured.items():
        unknown = [e for e in entries if e not in r]
        if unknown:
            raise SystemExit(f"--update: no entry {unknown[0]!r}; expected some of {', '.join(r)}")
        kept = results.setdefault(shape, r)
        kept.update({e: r[e] for e in entries})
        kept.setdefault("measured_again", {}).update({e: r["environment"] for e in entries})   # its own machine load
    return results, f"{old['command']}; {', '.join(entries)} of {', '.join(measured)} again: {command}", \
        old["environment"]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--phase":
        kind, rest = argv[1], argv[2:]
        fn = {"load": lambda p, k: phase_load(p), "hf_load": lambda f, k: phase_hf_load(f),
              "import": lambda f, o, k: phase_import(f, o),
              "inspector": lambda p, n: phase_inspector(p, int(n)), "decode": phase_decode,
              "gemms": lambda p, r: phase_gemms(p, int(r)),
              "export": lambda p, o, l: phase_export(p, o, None if l == "-" else l),
              "compute": lambda p, f, r, t: phase_compute(p, f, int(r), t == "1")}[kind]
        print(json.dumps(fn(*rest), default=float))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="135m", help="comma-separated: 135m, 360m, 1b (default: 135m)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (default: 3)")
    parser.add_argument("--no-tl", action="store_true", help="leave TransformerLens out")
    parser.add_argument("--no-export", action="store_true", help="leave the offline export out")
    parser.add_argument("--work", default=None,
                        help="folder for the models and each phase's result (default: a temporary one)")
    parser.add_argument("--resume", action="store_true", help="with --work: reuse the phases already measured there")
    parser.add_argument("--out", default=str(HERE / "results" / "scale.json"))
    parser.add_argument("--markdown", default=None, help="also write the table here")
    parser.add_argument("--update", default=None, metavar="ENTRIES",
                        help="comma-separated entries of each measured shape (e.g. file_bytes,import,load) to put "
                             "into the existing --out report, keeping the rest of it; its tables are made again "
                             "from the merged results")
    args = parser.parse_args(argv)
    shapes = args.shapes.split(",")
    bad = [s for s in shapes if s not in SHAPES]
    if bad or args.repeats < 1:
        parser.error(f"--shapes takes {', '.join(SHAPES)}; --repeats >= 1")
    from bench.benchlib import environment, write_report

    load_before = os.getloadavg()
    results = {}
    with (tempfile.TemporaryDirectory() if args.work is None else contextlib.nullcontext(args.work)) as tmp:
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for shape in shapes:
            results[shape] = run_shape(shape, Path(tmp).resolve(), args.repeats, not args.no_tl, args.resume,
                                       not args.no_export)
    env = environment(load_before)
    for r in results.values():
        r["environment"] = env
    table = markdown(results, env)
    from datetime import datetime, timezone

    command = "python -m bench.bench_scale " + " ".join(argv)
    if args.update:
        results, command, env = _merged(Path(args.out), results, args.update.split(","), command)
        table = markdown(results, env)
    report = {"command": command, "environment": env,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "threads": 1, "results": results, "targets": targets_table(results), "markdown": table}
    write_report(args.out, report)
    print(table)
    if args.markdown:
        from glassllm.files import atomic_write

        atomic_write(args.markdown, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
