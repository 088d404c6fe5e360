"""Every fast path equals the slow path it replaces: values and gradients.

The speed work added fused forms of things the teaching path spells out --
stacked GEMMs (``ops.linear_stacked(x, (wq, wk, wv))``), ``swiglu``, RoPE as one complex
multiply, attention straight from the packed projections with RoPE inside
(``ops.flash.self_attention``), a softmax shift taken from a score bound instead
of a running maximum, in-place cross-entropy and embedding gradients -- and
the model's kernels use them whenever no tracer looks inside (tests/test_kernels.py
compares each kernel with the layer it replaces, and each operation of
:mod:`glassllm.ops` with the formula it replaces). Each is compared here
with an independent form on the same inputs: float64 to 1e-12, float32 to
1e-5 (relative to the largest entry). The last tests prove the memory claim:
a training step at context 2,048 never holds a T x T buffer for a head.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from tests.support.glassllm_testing import TeachingTracer, randomize
from glassllm import autograd as ag
from glassllm import kernels, ops
from glassllm.autograd import Tensor
from glassllm.config import ModelConfig
from glassllm.kernels import FLASH_MIN_QUERIES, flash
from glassllm.nn import Transformer, causal_mask

TOL = {np.float64: 1e-12, np.float32: 1e-5}


def assert_close(got, want, dtype, what=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, expected {dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert np.all(np.isfinite(got)), f"{what}: not finite"
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max())
    assert err <= TOL[dtype] * scale, f"{what}: max error {err:.3g} > {TOL[dtype]:.0e} x {scale:.3g}"


def grads_of(fn, arrays, cotangent):
    """Value of fn(*tensors) and the gradients of <cotangent, value> w.r.t. each input."""
    ts = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = fn(*ts)
    out.backward(cotangent)
    return [out.data] + [t.grad for t in ts]


def rope_tables(positions, half, dtype):
    angles = np.asarray(positions, dtype=np.float64)[..., None] * 10000.0 ** (-np.arange(half) / half)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


DTYPES = [np.float64, np.float32]


# ----------------------------------------------------------------------------
# Stacked GEMMs, SwiGLU, RoPE, sigmoid
# ----------------------------------------------------------------------------

def test_stacked_linear_names_bad_shapes():
    x = Tensor(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="linear: weights"):
        ops.linear_stacked(x, (Tensor(np.zeros((3, 4))), Tensor(np.zeros((3, 5)))))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keepdims", [False, True])
def test_sums_and_means_equal_float64_reductions(dtype, keepdims):
    # Contiguous, strided and transposed inputs; float16 keeps NumPy's own mean.
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((3, 5, 40)) * 10).astype(dtype)
    for a, what in ((x, "contiguous"), (x[:, :, ::2], "strided"), (x.transpose(2, 0, 1), "transposed")):
        assert_close(ag.sum(Tensor(a), axis=-1, keepdims=keepdims).data,
                     a.astype(np.float64).sum(axis=-1, keepdims=keepdims), dtype, f"sum, {what}")
        assert_close(ag.mean(Tensor(a), axis=2, keepdims=keepdims).data,
                     a.astype(np.float64).mean(axis=2, keepdims=keepdims), dtype, f"mean, {what}")
    t = Tensor(x, requires_grad=True)
    cot = rng.standard_normal((3, 5, 1) if keepdims else (3, 5)).astype(dtype)
    ag.mean(t, axis=-1, keepdims=keepdims).backward(cot)
    assert_close(t.grad, np.broadcast_to(cot.reshape(3, 5, 1) / 40, x.shape), dtype, "mean gradient")
    half = x.astype(np.float16)  # float16 keeps NumPy's own (float32-accumulating) mean
    np.testing.assert_array_equal(ag.mean(Tensor(half), axis=-1).data, half.mean(axis=-1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_equals_silu_times_up(dtype):
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((3, 4, 10)) * 4).astype(dtype)
    g = rng.standard_normal((3, 4, 5)).astype(dtype)
    fused = grads_of(kernels.swiglu, [a], g)
    spelled = grads_of(lambda t: ag.silu(t[..., :5]) * t[..., 5:], [a], g)
    for name, got, want in zip(("out", "da"), fused, spelled):
        assert_close(got, want, dtype, name)


def test_swiglu_needs_an_even_last_axis():
    with pytest.raises(ValueError, match="even"):
        kernels.swiglu(Tensor(np.zeros((2, 5))))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_complex_multiply_equals_pair_formula(dtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 7, 8)).astype(dtype)
    g = rng.standard_normal(x.shape).astype(dtype)
    cos, sin = rope_tables(np.arange(5, 12), 4, dtype)                 # (n, D/2)

    def by_pairs(t):  # the textbook form: (x0 c - x1 s, x0 s + x1 c), pair by pair
        x0, x1 = t[..., 0::2], t[..., 1::2]
        return ag.concatenate([(x0 * cos - x1 * sin)[..., None], (x0 * sin + x1 * cos)[..., None]], -1).reshape(t.shape)

    fused = grads_of(lambda t: ag.rope(t, cos, sin), [x], g)
    spelled = grads_of(by_pairs, [x], g)
    for name, got, want in zip(("out", "dx"), fused, spelled):
        assert_close(got, want, dtype, name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_as_matrices_equals_the_pair_formula(dtype):
    # The decoder's form: one (D, D) matrix per position, x @ R[p]. Rebuilt in the new dtype after a cast.
    from glassllm.nn import Rotary

    rotary = Rotary(8, 16, 10000.0, np.float32)
    rotary.matrices()
    rotary.cast(dtype)
    R = rotary.matrices()                                               # (16, 8, 8)
    assert R.shape == (16, 8, 8) and R.dtype == dtype and not R.flags.writeable
    x = np.random.default_rng(3).standard_normal((16, 8)).astype(dtype)  # one row per position
    cos, sin = rope_tables(np.arange(16), 4, dtype)                     # (16, D/2)
    x0, x1 = x[:, 0::2], x[:, 1::2]
    want = np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).reshape(x.shape)
    assert_close(np.einsum("pd,pde->pe", x, R), want, dtype, "x @ R[p]")


def test_rope_rejects_an_odd_head_size():
    with pytest.raises(ValueError, match="even"):
        ag.rope(Tensor(np.zeros((1, 2, 3))), np.ones((2, 1)), np.zeros((2, 1)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_keeps_relative_precision_in_both_tails(dtype):
    # Reference in extended precision: 1 / (1 + e^-x) with e^-x exact enough.
    x = np.array([-80.0, -40.0, -17.0, -5.0, -1e-3, 0.0, 1e-3, 5.0, 17.0, 40.0], dtype=dtype)
    want = 1.0 / (1.0 + np.exp(-x.astype(np.longdouble)))
    got = ag.sigmoid(Tensor(x)).data
    rel = np.abs(got.astype(np.longdouble) - want) / want
    assert got.dtype == dtype
    assert float(rel.max()) <= 4 * np.finfo(dtype).eps


# ----------------------------------------------------------------------------
# Cross-entropy and embedding gradients (computed in place)
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_gradient_is_softmax_minus_onehot(dtype):
    rng = np.random.default_rng(3)
    z = (rng.standard_normal((2, 5, 7)) * 3).astype(dtype)
    t = rng.integers(0, 7, (2, 5))
    t[0, 2] = t[1, 4] = -100
    logits = Tensor(z.copy(), requires_grad=True)
    loss = ag.cross_entropy(logits, t)
    loss.backward(np.asarray(0.5, dtype=dtype))
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.eye(7)[np.where(t < 0, 0, t)]
    keep = (t != -100)[..., None]
    want = 0.5 * (p - onehot) * keep / keep.sum()
    assert_close(logits.grad, want.astype(dtype), dtype, "dlogits")
    nll = -np.log(np.take_along_axis(p, np.where(t < 0, 0, t)[..., None], -1))[..., 0]
    assert_close(loss.data, np.asarray((nll * keep[..., 0]).sum() / keep.sum(), dtype=dtype), dtype, "loss")


@pytest.mark.parametrize("V, id_dtype", [(6, np.int64), (1024, np.uint16), (256, np.uint8)])
def test_embedding_gradient_accumulates_repeated_ids(V, id_dtype):
    """Also for the small unsigned ids token files hold: id * C must not wrap around (1000 * 128 > 65535)."""
    rng = np.random.default_rng(4)
    C = 128 if V > 6 else 3
    w = Tensor(rng.standard_normal((V, C)), requires_grad=True)
    ids = np.array([[V - 1, 1, V - 1], [0, V - 1, 1]], dtype=id_dtype)
    g = rng.standard_normal((2, 3, C))
    ag.embedding(w, ids).backward(g)
    want = np.zeros((V, C))
    for i, row in zip(ids.reshape(-1), g.reshape(-1, C)):
        want[i] += row
    np.testing.assert_allclose(w.grad, want, rtol=0, atol=1e-15)


# ----------------------------------------------------------------------------
# Attention: packed self-attention, the score bound and its fallback
# ----------------------------------------------------------------------------

def _packed_inputs(rng, B, n, H, G, D, dtype, spread=1.0):
    qkv = (rng.standard_normal((B, n, (H + 2 * G) * D)) * spread).astype(dtype)
    g = rng.standard_normal((B, n, H * D)).astype(dtype)
    return qkv, g


def _spelled_self_attention(qkv, H, G, cos, sin, pad):
    """split -> rope -> dense masked softmax attention -> heads side by side, all separate ops."""
    B, n, width = qkv.shape
    D = width // (H + 2 * G)
    parts = qkv.reshape(B, n, H + 2 * G, D)
    q = parts[:, :, :H].transpose(0, 2, 1, 3)                                   # (B, H, n, D)
    k = parts[:, :, H:H + G].transpose(0, 2, 1, 3)                              # (B, G, n, D)
    v = parts[:, :, H + G:].transpose(0, 2, 1, 3)                               # (B, G, n, D)
    q, k = ag.rope(q, cos, sin), ag.rope(k, cos, sin)
    mask = np.broadcast_to(causal_mask(n, n), (B, n, n))
    if pad is not None:
        mask = mask | (np.arange(n)[None, None, :] < pad[:, None, None])
    mix = kernels.attention(q, k, v, mask[:, None], 1.0 / np.sqrt(D))                # (B, H, n, D)
    return mix.transpose(0, 2, 1, 3).reshape(B, n, H * D)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,n,H,G,D,pad,blocks", [
    (2, 37, 4, 2, 8, None, (8, 16)),          # ragged blocks, several key blocks (online)
    (2, 37, 4, 2, 8, None, (8, 64)),          # one key block per query block: tiles kept for the backward
    (1, 64, 2, 1, 4, None, (64, 1024)),       # one tile
    (3, 29, 6, 3, 8, [0, 5, 40], (8, 8)),     # left padding; row 2 has no legal key
    (2, 50, 2, 2, 6, None, (7, 5)),           # H = G, odd blocks
])
def test_self_attention_equals_spelled_out(dtype, B, n, H, G, D, pad, blocks):
    rng = np.random.default_rng(n + B)
    qkv, g = _packed_inputs(rng, B, n, H, G, D, dtype)
    pad = None if pad is None else np.array(pad)
    if pad is None:
        cos, sin = rope_tables(np.arange(n), D // 2, dtype)                     # (n, D/2)
    else:
        positions = np.maximum(np.arange(n)[None, :] - pad[:, None], 0)
        cos, sin = (t[:, None] for t in rope_tables(positions, D // 2, dtype))  # (B, 1, n, D/2)
    fused = grads_of(lambda t: flash.self_attention(t, H, G, cos, sin, pad, *blocks), [qkv], g)
    spelled = grads_of(lambda t: _spelled_self_attention(t, H, G, cos, sin, pad), [qkv], g)
    for name, got, want in zip(("out", "dqkv"), fused, spelled):
        assert_close(got, want, dtype, name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_score_bound_and_running_max_give_the_same_attention(dtype, monkeypatch):
    """The bound shift (default), the running max (forced) and a mix of both per block all agree."""
    rng = np.random.default_rng(7)
    B, n, H, G, D = 2, 48, 4, 2, 8
    cos, sin = rope_tables(np.arange(n), D // 2, dtype)
    qkv, g = _packed_inputs(rng, B, n, H, G, D, dtype)
    # Large activations in some rows push their bound far above their scores: those
    # query blocks must fall back to the running maximum while the others do not.
    qkv[0, 20:30] *= 12.0
    spelled = grads_of(lambda t: _spelled_self_attention(t, H, G, cos, sin, None), [qkv], g)

    seen = []
    real_forward = flash._forward

    def spy(*args):
        gap = args[10]
        seen.append(bool(np.all(gap < flash.MAX_GAP[np.dtype(dtype).type])))
        return real_forward(*args)

    monkeypatch.setattr(flash, "_forward", spy)
    for gaps in ({np.float32: 70.0, np.float64: 600.0}, {np.float32: -1.0, np.float64: -1.0}):
        monkeypatch.setattr(flash, "MAX_GAP", gaps)
        got = grads_of(lambda t: flash.self_attention(t, H, G, cos, sin, None, 8, 16), [qkv], g)
        for name, a, b in zip(("out", "dqkv"), got, spelled):
            assert_close(a, b, dtype, f"{name} with MAX_GAP {gaps[np.dtype(dtype).type]}")
    if dtype == np.float32:
        assert seen == [False, False]   # with the default gap, some rows still needed the fallback


@pytest.mark.parametrize("dtype", DTYPES)
def test_kept_tiles_and_recomputed_tiles_give_the_same_gradients(dtype, monkeypatch):
    rng = np.random.default_rng(9)
    B, n, H, G, D = 3, 40, 4, 2, 8
    cos, sin = rope_tables(np.arange(n), D // 2, dtype)
    qkv, g = _packed_inputs(rng, B, n, H, G, D, dtype)
    assert flash._keeps_tiles(B, G, H // G, n, n, 0, 16, 64, 4)
    assert not flash._keeps_tiles(B, G, H // G, n, n, 0, 16, 32, 4)   # two key blocks: recompute
    kept = grads_of(lambda t: flash.self_attention(t, H, G, cos, sin, None, 16, 64), [qkv], g)
    monkeypatch.setattr(flash, "KEEP_BYTES", 0)
    assert not flash._keeps_tiles(B, G, H // G, n, n, 0, 16, 64, 4)
    recomputed = grads_of(lambda t: flash.self_attention(t, H, G, cos, sin, None, 16, 64), [qkv], g)
    for name, a, b in zip(("out", "dqkv"), kept, recomputed):
        assert_close(a, b, dtype, name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_flash_attention_after_a_cache_equals_dense(dtype):
    """Queries at start > 0 (a prompt continued): the bound uses each query's own key at start + i."""
    rng = np.random.default_rng(8)
    B, H, G, n, start, D = 2, 4, 2, 19, 13, 8
    m = start + n
    arrays = [rng.standard_normal(s).astype(dtype) for s in ((B, H, n, D), (B, G, m, D), (B, G, m, D))]
    g = rng.standard_normal((B, H, n, D)).astype(dtype)
    mask = np.broadcast_to(causal_mask(n, m, start), (B, n, m))[:, None]
    tiled = grads_of(lambda q, k, v: flash.flash_attention(q, k, v, 0.4, start, None, 4, 8), arrays, g)
    dense = grads_of(lambda q, k, v: kernels.attention(q, k, v, mask, 0.4), arrays, g)
    for name, got, want in zip(("out", "dq", "dk", "dv"), tiled, dense):
        assert_close(got, want, dtype, name)


# ----------------------------------------------------------------------------
# The model: fused paths (no tracer) against the teaching path (tracer)
# ----------------------------------------------------------------------------

def test_model_fast_paths_equal_teaching_path_with_gradients():
    config = ModelConfig(vocab_size=67, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
                         max_seq_len=FLASH_MIN_QUERIES + 16)
    model = randomize(Transformer(config, seed=0, dtype=np.float64), np.random.default_rng(1))
    rng = np.random.default_rng(2)
    n = FLASH_MIN_QUERIES + 5                        # long enough for the packed attention path
    tokens = rng.integers(0, config.vocab_size, (2, n))
    targets = rng.integers(0, config.vocab_size, (2, n))

    def run(tracer):
        model.set_tracer(tracer)
        try:
            model.zero_grad()
            loss = model.loss(tokens, targets)
            loss.backward()
        finally:
            model.set_tracer(None)
        return loss.item(), {name: p.grad.copy() for name, p in model.named_parameters()}

    fast_loss, fast = run(None)
    slow_loss, slow = run(TeachingTracer())
    assert fast_loss == pytest.approx(slow_loss, rel=1e-12)
    for name in slow:
        assert_close(fast[name], slow[name], np.float64, name)


def test_float32_model_step_stays_float32():
    model = Transformer(ModelConfig(vocab_size=50, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64,
                                    max_seq_len=FLASH_MIN_QUERIES), seed=0)
    tokens = np.random.default_rng(0).integers(0, 50, (1, FLASH_MIN_QUERIES))
    loss = model.loss(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    assert loss.dtype == np.float32
    assert all(p.grad.dtype == np.float32 for p in model.parameters())


# ----------------------------------------------------------------------------
# Memory: no T x T buffer per head at context 2,048
# ----------------------------------------------------------------------------

def test_training_step_at_context_2048_holds_no_t_by_t_buffer():
    """tracemalloc sees every NumPy buffer: the step's peak stays below ONE head's T x T scores.

    Dense attention would hold H x T x T probabilities per layer (4 x 16 MiB in
    float32 here) and the teaching path several such arrays. The whole training
    step -- forward, loss, backward -- must peak below 16 MiB, the size of a
    single (T, T) float32 matrix.
    """
    T = 2048
    config = ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=T)
    model = Transformer(config, seed=0)
    tokens = np.random.default_rng(0).integers(0, 64, (1, T + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    model.loss(x[:, :256], y[:, :256]).backward()     # warm caches (RoPE tables, block masks)
    model.zero_grad()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        loss = model.loss(x, y)
        loss.backward()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    one_head_scores = T * T * np.dtype(np.float32).itemsize
    assert np.isfinite(loss.item())
    assert peak - before < one_head_scores, f"peak {(peak - before) / 2**20:.1f} MiB >= one T x T buffer"


@pytest.mark.parametrize("count, mib", [(154, 20), (8, 64)], ids=["3 GiB in 20 MiB blocks", "512 MiB in 64 MiB blocks"])
def test_freed_arrays_are_reused_without_page_faults(count, mib):
    # Glibc hands memory back past its trim threshold (2 GiB at most, finite) and unmaps every block
    # above its mmap threshold (32 MiB at most) when it is freed. A width-512 training step frees
    # ~1.3 GB at the end of its backward, a trace with gradients of a 360M-parameter Llama (256 tokens)
    # 4.7 GB, and a 1.1B-parameter Llama's trace makes a 67 MB attn.head_out in every layer. Two rounds
    # of `count` arrays of `mib` MiB, with NumPy's huge-page advice off so that every 4 KiB page that is
    # new shows as a fault: the second round must not fault.
    code = f"""
import resource
import numpy as np
from glassllm.heap import keep_freed_memory
keep_freed_memory()
(getattr(np, "_core", None) or np.core).multiarray._set_madvise_hugepage(False)

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def round_trip():
    arrays = [np.ones({mib} << 18, dtype=np.float32) for _ in range({count})]   # touched
    del arrays

round_trip()
before = faults()
round_trip()
print(faults() - before)
"""
    env = {k: v for k, v in os.environ.items() if k != "GLASSLLM_SYSTEM_MALLOC"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    pages = (count * mib << 20) // 4096
    assert int(out.stdout) < pages // 100, f"{out.stdout.strip()} page faults re-touching {pages} freed pages"


def test_importing_glassllm_leaves_malloc_alone():
    """The malloc setting is an explicit call (the commands make it), never a side effect of an import."""
    code = ("import glassllm.autograd, glassllm.nn, glassllm.kernels, glassllm.train, glassllm.generate, "
            "glassllm.trace, glassllm.heap; print(glassllm.heap._applied)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"


@pytest.mark.parametrize("command", ["generate", "eval"])
def test_the_commands_that_run_the_model_keep_freed_memory(command, tmp_path, monkeypatch, capsys):
    import glassllm.heap
    from glassllm.cli import main

    calls = []
    monkeypatch.setattr(glassllm.heap, "keep_freed_memory", lambda: calls.append(command) or True)
    missing = str(tmp_path / "missing.safetensors")
    args = {"generate": ["generate", "Tom", "--model", missing],
            "eval": ["eval", "--model", missing, "--data", missing]}[command]
    assert main(args) == 2                                  # the missing file: after the setting was made
    capsys.readouterr()
    assert calls == [command]


def test_keep_freed_memory_is_idempotent_and_can_be_declined():
    from glassllm.heap import keep_freed_memory

    assert keep_freed_memory() == keep_freed_memory()
    code = "from glassllm.heap import keep_freed_memory; print(keep_freed_memory())"
    env = dict(os.environ, GLASSLLM_SYSTEM_MALLOC="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_decoder_builds_rope_matrices_only_for_positions_it_reaches():
    """A model of a 32,768-token context decodes a few tokens without a (32768, D, D) table (2 GB at D=256)."""
    from glassllm.config import ModelConfig
    from glassllm.generate import generate
    from glassllm.nn import Transformer

    c = ModelConfig(vocab_size=64, dim=64, n_layers=1, n_heads=1, n_kv_heads=1, ffn_dim=64, max_seq_len=32768)
    model = Transformer(c, seed=0)
    fast = [t.id for t in generate(model, None, [1, 2, 3], max_new_tokens=70, temperature=0.0)]
    assert len(model.rotary._matrices) <= 256                           # positions reached: 72; built in doublings
    slow = [t.id for t in generate(model, None, [1, 2, 3], max_new_tokens=70, temperature=0.0, fast=False)]
    assert fast == slow
