"""Every registered kernel and every fast array operation against what it replaces, on the same inputs.

One table, ``ROWS``: a row per kernel of :data:`glassllm.kernels.KERNELS` and
per operation of :data:`glassllm.ops.OPS`. A kernel's row builds a layer (or a
model) of a small config with trained-scale weights, and its inputs; the test
runs the layer's call once with exactly that kernel chosen by the dispatcher
and once on the reference ``__call__`` (every kernel switched off), then
compares the outputs and the gradients of a random cotangent with respect to
the inputs and every parameter. An operation's row compares it with the plain
formula it replaces, spelled out with the primitives of
:mod:`glassllm.autograd` or with NumPy (values, and gradients where it is an
op). Float64 to 1e-12, float32 to 1e-5 (relative to the largest entry), as
tinygrad's ``test_ops`` compares each op with PyTorch. Adding a kernel = one
registration + one row here; ``test_every_kernel_has_a_row`` fails until the
row exists, and every row must make at least one comparison.

The other tests: a kernel produces exactly the snapshots it does not declare as
skipped; a traced name always runs the reference; ``kernels.disabled()`` runs
the reference everywhere, with the same results to rounding, for a whole
model's loss and gradients.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from tests.support.glassllm_testing import TeachingTracer, randomize
from glassllm import autograd as ag
from glassllm import kernels, ops
from glassllm.autograd import Tensor, no_grad, rotate
from glassllm.config import ModelConfig
from glassllm.kernels import FLASH_MIN_QUERIES, KERNELS, FastDecoder
from glassllm.kernels.decode import PACK_BYTES
from glassllm.nn import Transformer, causal_mask
from glassllm.positions import positions

CONFIG = ModelConfig(vocab_size=61, dim=48, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=80,
                     max_seq_len=FLASH_MIN_QUERIES + 40, norm_eps=1e-5, rope_theta=500.0)
TOL = {np.float64: 1e-12, np.float32: 1e-5}
DTYPES = [np.float64, np.float32]


def model_of(dtype, seed=0, tied=False) -> Transformer:
    config = dataclasses.replace(CONFIG, tie_embeddings=True) if tied else CONFIG
    model = Transformer(config, seed=seed, dtype=np.float64)
    return randomize(model, np.random.default_rng(seed + 1)).astype(dtype)


def rope_of(model, start, n, pad=None):
    """(cos, sin) as Transformer.__call__ makes them for positions start .. start+n-1."""
    cos, sin = model.rotary.tables(positions(start, start + n, pad))
    return (cos, sin) if pad is None else (cos[:, None], sin[:, None])


def filled_cache(model, batch, start, rng, pad=None):
    """A cache whose first ``start`` positions hold random keys and values (as if a prompt ran)."""
    cache = model.new_cache(batch, pad=pad)
    cache.k[:, :, :, :start] = rng.standard_normal(cache.k[:, :, :, :start].shape)
    cache.v[:, :, :, :start] = rng.standard_normal(cache.v[:, :, :, :start].shape)
    cache.start = start
    return cache


def copy_cache(cache):
    new = type(cache).__new__(type(cache))
    new.__dict__.update(cache.__dict__)
    new.k, new.v = cache.k.copy(), cache.v.copy()
    return new


@dataclass
class Case:
    """A layer, the arrays it is called on, and how to call it.

    ``call(layer, *tensors)`` runs the layer as the model does (``layer.run``: its chosen kernel or
    its reference), with a fresh cache each time, if any;
    ``n``, ``m`` and ``cache`` are what the dispatcher sees for this call.
    """

    layer: object
    arrays: list
    call: Callable
    n: int
    m: int
    cache: object = None


def attention_case(dtype, rng, B, n, start=0, pad=None, cache=False):
    model = model_of(dtype)
    attn = model.layers[1].attention
    pad = None if pad is None else np.array(pad)
    c = filled_cache(model, B, start, rng, pad) if cache else None
    rope = rope_of(model, start, n, pad)
    x = rng.standard_normal((B, n, CONFIG.dim)).astype(dtype)

    def call(layer, x):
        return layer.run(x, rope, None if c is None else copy_cache(c), start, pad)
    return Case(attn, [x], call, n, start + n, c)


def rms_norm_case(dtype, rng):
    model = model_of(dtype)
    x = (3.0 * rng.standard_normal((2, 9, CONFIG.dim))).astype(dtype)
    return Case(model.layers[0].ffn_norm, [x], lambda layer, x: layer.run(x), 9, 9)


def feed_forward_case(dtype, rng):
    model = model_of(dtype)
    x = rng.standard_normal((2, 9, CONFIG.dim)).astype(dtype)
    return Case(model.layers[0].feed_forward, [x], lambda layer, x: layer.run(x), 9, 9)


@dataclass
class OpCase:
    """An array operation and the plain formula it replaces: ``fast(*inputs)`` against ``plain(*inputs)``
    on copies of the same ``arrays``; with ``grads`` the inputs are tensors and the gradients of a
    random cotangent are compared too."""

    fast: Callable
    plain: Callable
    arrays: list
    grads: bool = False


def spelled_attention(q, k, v, mask, scale):
    """Grouped-query attention in the small primitives: expand K/V, scores, mask, softmax, mix."""
    r = q.shape[1] // k.shape[1]
    k, v = ag.repeat_interleave(k, r, axis=1), ag.repeat_interleave(v, r, axis=1)   # (B, H, m, D)
    scores = ag.matmul(q, k.transpose(0, 1, 3, 2)) * scale                          # (B, H, n, m)
    scores = ag.masked_fill(scores, mask, -np.inf)
    return ag.matmul(ag.softmax(scores, axis=-1), v)                                # (B, H, n, D)


def by_pairs(x, cos, sin):
    """RoPE's pair formula, (x0 c - x1 s, x0 s + x1 c) for each pair (x[2i], x[2i+1]), in NumPy."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).reshape(x.shape)


def normal(rng, dtype, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def attention_op_case(dt, rng, B=2, H=6, G=2, n=5, start=3, pad=None):
    m, D = start + n, 4
    mask = causal_mask(n, m, start, None if pad is None else np.array(pad))             # (n, m) | (B, n, m)
    mask = mask if pad is None else mask[:, None]
    return OpCase(lambda q, k, v: ops.attention(q, k, v, mask, 0.5),
                  lambda q, k, v: spelled_attention(q, k, v, mask, 0.5),
                  [normal(rng, dt, B, H, n, D), normal(rng, dt, B, G, m, D), normal(rng, dt, B, G, m, D)], True)


def flash_op_case(dt, rng, B=2, H=4, G=2, n=21, start=6, pad=None):
    m, D = start + n, 4
    pad = None if pad is None else np.array(pad)
    mask = causal_mask(n, m, start, pad)
    mask = mask if pad is None else mask[:, None]
    return OpCase(lambda q, k, v: ops.flash_attention(q, k, v, 0.4, start, pad, 4, 8),
                  lambda q, k, v: spelled_attention(q, k, v, mask, 0.4),
                  [normal(rng, dt, B, H, n, D), normal(rng, dt, B, G, m, D), normal(rng, dt, B, G, m, D)], True)


def self_attention_op_case(dt, rng, pad=None):
    B, H, G, n, D = 2, 4, 2, 19, 4
    pad = None if pad is None else np.array(pad)
    angles = positions(0, n, pad)[..., None] * 10.0 ** (-np.arange(D // 2) / (D // 2))   # (n|B, n, D/2)
    cos, sin = np.cos(angles).astype(dt), np.sin(angles).astype(dt)
    if pad is not None:
        cos, sin = cos[:, None], sin[:, None]                                           # (B, 1, n, D/2)
    mask = causal_mask(n, n, 0, pad)
    mask = mask if pad is None else mask[:, None]

    def plain(qkv):
        q, k, v = ag.split(qkv, [H * D, G * D, G * D], axis=-1)
        q, k, v = (t.reshape(B, n, -1, D).transpose(0, 2, 1, 3) for t in (q, k, v))     # (B, H|G, n, D)
        mix = spelled_attention(ag.rope(q, cos, sin), ag.rope(k, cos, sin), v, mask, 1.0 / np.sqrt(D))
        return mix.transpose(0, 2, 1, 3).reshape(B, n, H * D)                           # (B, n, H*D)
    return OpCase(lambda qkv: ops.self_attention(qkv, H, G, cos, sin, pad, 8, 8), plain,
                  [normal(rng, dt, B, n, (H + 2 * G) * D)], True)


def rope_table_case(dt, rng, pad=None):
    B, n, H, D = 2, 5, 3, 6
    pos = positions(4, 4 + n, None if pad is None else np.array(pad))                  # (n,) | (B, n)
    angles = pos[..., None] * 10.0 ** (-np.arange(D // 2) / (D // 2))
    cos, sin = np.cos(angles).astype(dt), np.sin(angles).astype(dt)                     # (n|B, n, D/2)
    table = (cos, sin) if pad is None else (cos[:, None], sin[:, None])                 # (B, 1, n, D/2) with pad
    return OpCase(lambda x: rotate(x, ops.rope_table(*table, H, x.dtype)),
                  lambda x: by_pairs(x, cos[..., None, :], sin[..., None, :]),          # x (B, n, H, D)
                  [normal(rng, dt, B, n, H, D)])


def rotation_matrices_case(dt, rng):
    angles = np.arange(16)[:, None] * 10.0 ** (-np.arange(4) / 4)                       # (16, D/2)
    cos, sin = np.cos(angles).astype(dt), np.sin(angles).astype(dt)
    return OpCase(lambda x: np.einsum("pd,pde->pe", x, ops.rotation_matrices(cos, sin)),  # x @ R[p], row by row
                  lambda x: by_pairs(x, cos, sin), [normal(rng, dt, 16, 8)])


def softmax_case(dt, rng, copy):
    s = normal(rng, dt, 2, 3, 5, 7, scale=10.0)
    s[0, 1, 2] = -np.inf                                                                # a row with no legal key
    s[1, 0, :, 3] = -np.inf
    return OpCase(lambda s: ops.softmax_inplace(s, copy=copy), ag.softmax_np, [s])


def row_sums_case(dt, rng, view, axis):
    x = normal(rng, dt, 3, 5, 40, scale=10.0)
    return OpCase(lambda x: ops.row_sums(view(x), axis), lambda x: view(x).sum(axis=axis, keepdims=True), [x])


# name -> its cases (builders: dtype, rng -> Case, DecodeCase or OpCase)
ROWS: dict[str, list[Callable]] = {
    "tiled_self_attention": [
        lambda dt, rng: attention_case(dt, rng, B=2, n=FLASH_MIN_QUERIES + 3),
        lambda dt, rng: attention_case(dt, rng, B=3, n=FLASH_MIN_QUERIES + 1, pad=[0, 7, 200]),  # a dead row
    ],
    "tiled_attention": [
        lambda dt, rng: attention_case(dt, rng, B=2, n=FLASH_MIN_QUERIES, start=11, cache=True),
        lambda dt, rng: attention_case(dt, rng, B=2, n=FLASH_MIN_QUERIES + 2, start=5, pad=[0, 9], cache=True),
    ],
    "fused_attention": [
        lambda dt, rng: attention_case(dt, rng, B=2, n=13),
        lambda dt, rng: attention_case(dt, rng, B=2, n=1, start=17, cache=True),       # a decoding step
        lambda dt, rng: attention_case(dt, rng, B=3, n=6, start=4, pad=[0, 2, 12], cache=True),  # a dead row
    ],
    "fused_rms_norm": [rms_norm_case],
    "fused_feed_forward": [feed_forward_case],
    # The whole decoder's steps, no autograd: values and the cache it writes (test_kernel_equals_its_reference).
    "fast_decode": [
        lambda dt, rng: DecodeCase(model_of(dt), rng.integers(0, CONFIG.vocab_size, (2, 9)), pad=[0, 3], steps=4),
        lambda dt, rng: DecodeCase(model_of(dt), rng.integers(0, CONFIG.vocab_size, (1, 5)), pad=None, steps=3),
        lambda dt, rng: DecodeCase(model_of(dt, tied=True), rng.integers(0, CONFIG.vocab_size, (2, 6)), pad=[2, 0],
                                   steps=3),                                            # a tied head
        # The same, reading the model's own arrays in place (the path of a model past PACK_BYTES).
        lambda dt, rng: DecodeCase(model_of(dt), rng.integers(0, CONFIG.vocab_size, (2, 9)), pad=[0, 3], steps=4,
                                   pack_bytes=0),
        lambda dt, rng: DecodeCase(model_of(dt), rng.integers(0, CONFIG.vocab_size, (3, 5)), pad=None, steps=3,
                                   pack_bytes=0),
        lambda dt, rng: DecodeCase(model_of(dt, tied=True), rng.integers(0, CONFIG.vocab_size, (2, 6)), pad=[2, 0],
                                   steps=3, pack_bytes=0),                              # a tied head, in place
    ],
    # The array operations of glassllm.ops against the plain formulas.
    "attention": [attention_op_case, lambda dt, rng: attention_op_case(dt, rng, B=3, pad=[0, 2, 8])],  # a dead row
    "flash_attention": [flash_op_case, lambda dt, rng: flash_op_case(dt, rng, B=3, pad=[0, 5, 30])],
    "self_attention": [self_attention_op_case, lambda dt, rng: self_attention_op_case(dt, rng, pad=[0, 7])],
    "rms_norm": [lambda dt, rng: OpCase(lambda x, w: ops.rms_norm(x, w, 1e-5),
                                        lambda x, w: x / ag.sqrt(ag.mean(x * x, axis=-1, keepdims=True) + 1e-5) * w,
                                        [normal(rng, dt, 2, 7, 12, scale=3.0), normal(rng, dt, 12)], True)],
    "swiglu": [lambda dt, rng: OpCase(ops.swiglu, lambda a: ag.silu(a[..., :5]) * a[..., 5:],
                                      [normal(rng, dt, 3, 4, 10, scale=4.0)], True)],
    "linear_stacked": [lambda dt, rng: OpCase(
        lambda x, a, b, c: ops.linear_stacked(x, (a, b, c)),
        lambda x, a, b, c: ag.concatenate([ag.linear(x, a), ag.linear(x, b), ag.linear(x, c)], -1),
        [normal(rng, dt, *shape) for shape in ((2, 5, 6), (4, 6), (3, 6), (2, 6))], True),
        lambda dt, rng: OpCase(                         # fewer rows than inputs: each product into its columns
            lambda x, a, b, c: ops.linear_stacked(x, (a, b, c)),
            lambda x, a, b, c: ag.concatenate([ag.linear(x, a), ag.linear(x, b), ag.linear(x, c)], -1),
            [normal(rng, dt, *shape) for shape in ((1, 3, 8), (4, 8), (3, 8), (2, 8))], True)],
    "softmax_inplace": [lambda dt, rng: softmax_case(dt, rng, copy=False),
                        lambda dt, rng: softmax_case(dt, rng, copy=True)],
    "row_sums": [lambda dt, rng: row_sums_case(dt, rng, lambda x: x, -1),                      # the GEMV
                 lambda dt, rng: row_sums_case(dt, rng, lambda x: x[:, :, ::2], -1),           # strided: NumPy's
                 lambda dt, rng: row_sums_case(dt, rng, lambda x: x, 0)],
    "rope_table": [rope_table_case, lambda dt, rng: rope_table_case(dt, rng, pad=[0, 6])],
    "rotation_matrices": [rotation_matrices_case],
}


@dataclass
class DecodeCase:
    """A prefill of ``tokens`` (B, n) with left padding ``pad``, then ``steps - 1`` greedy single-token steps."""

    model: Transformer
    tokens: np.ndarray
    pad: list | None
    steps: int
    pack_bytes: int = PACK_BYTES       # the decoder's bound for packing (0: it reads the model's arrays in place)


def _compare_decoding(case: DecodeCase, dtype):
    """The lean decoder's logits and cache, step by step, against the model's reference forward."""
    model = case.model
    pad = None if case.pad is None else np.array(case.pad)
    batch = case.tokens.shape[0]
    lean_cache, spec_cache = model.new_cache(batch, pad=pad), model.new_cache(batch, pad=pad)
    lean = FastDecoder(model, pack_bytes=case.pack_bytes)
    assert lean.packed == (case.pack_bytes > 0)        # the test model is far below the default bound
    tokens = case.tokens
    for step in range(case.steps):
        got = lean(tokens, lean_cache)
        with kernels.disabled(), no_grad():
            want = model(tokens, spec_cache).data[:, -1]
        assert_close(got, want, dtype, f"fast_decode step {step}")
        assert lean_cache.start == spec_cache.start
        for what in ("k", "v"):                     # the two write the same cache
            assert_close(getattr(lean_cache, what)[:, :, :, :lean_cache.start],
                         getattr(spec_cache, what)[:, :, :, :spec_cache.start], dtype, f"cache {what}, step {step}")
        tokens = want.argmax(axis=-1)[:, None]


def test_the_lean_decoder_reads_the_models_own_weights_without_a_copy():
    """Past its packing bound, every array the decoder multiplies by is a view of a parameter of the model
    (no second copy of the weights), and every parameter is one of them."""
    model = model_of(np.float32)
    lean = FastDecoder(model, pack_bytes=0)
    held = [lean.embed, lean.final_gain, lean.head]
    for layer in lean.layers:
        held += [layer.attention_gain, *layer.attention_in, layer.wo, layer.ffn_gain, *layer.ffn_in, layer.w2]
    params = model.state_dict()
    for a in held:
        owners = [name for name, p in params.items() if np.shares_memory(a, p)]
        assert len(owners) == 1 and a.size == params[owners[0]].size, a.shape
    reached = {name for name, p in params.items() if any(np.shares_memory(a, p) for a in held)}
    assert reached == set(params)
    # The bound counts the blocks' matrices: at exactly their size the decoder packs, one byte less it does not.
    matrices = sum(p.nbytes for name, p in params.items() if name.startswith("layers.") and p.ndim == 2)
    assert FastDecoder(model, pack_bytes=matrices).packed and not FastDecoder(model, pack_bytes=matrices - 1).packed


def _compare_op(case: OpCase, dtype, name):
    """The operation against its plain formula on copies of the same inputs (and, for an op, gradients)."""
    if not case.grads:
        got, want = case.fast(*[a.copy() for a in case.arrays]), case.plain(*[a.copy() for a in case.arrays])
        assert_close(np.asarray(got), np.asarray(want), dtype, name)
        return
    results = []
    for fn in (case.fast, case.plain):
        ts = [Tensor(a.copy(), requires_grad=True) for a in case.arrays]
        out = fn(*ts)
        out.backward(np.random.default_rng(7).standard_normal(out.shape).astype(dtype))
        results.append([out.data] + [t.grad for t in ts])
    for i, (got, want) in enumerate(zip(*results)):
        assert_close(got, want, dtype, f"{name}: {'out' if i == 0 else f'd input {i - 1}'}")


def test_every_kernel_has_a_row():
    assert set(ROWS) == set(KERNELS) | set(ops.OPS), \
        "each registered kernel and each operation of glassllm.ops needs a row in ROWS (and a row, one of them)"
    empty = [name for name, builders in ROWS.items() if not builders]
    assert not empty, f"{empty} have no comparison in ROWS: each kernel needs at least one real case"
    for name, kernel in KERNELS.items():
        assert kernel.reference and kernel.replaces and kernel.doc, f"{name} must say what it replaces and why"


def test_every_kernel_replaces_a_real_layer_and_skips_real_names():
    from glassllm import nn

    for kernel in KERNELS.values():
        cls = kernel.replaces
        assert cls is getattr(nn, cls.__name__) and issubclass(cls, nn.Module)
        assert kernel in kernels.kernels_for(cls)
        if kernel.skips != ("*",):
            assert set(kernel.skips) <= set(cls.SNAPSHOTS), f"{kernel.name} skips names {cls.__name__} lacks"


def _run(case, grads_of, kernel=None):
    """Output and gradients (inputs, then parameters) of <cotangent, layer(...)>, with ``kernel`` chosen
    or (None) on the reference."""
    layer = case.layer
    layer.zero_grad()
    ts = [Tensor(a.copy(), requires_grad=True) for a in case.arrays]
    if kernel is None:
        with kernels.disabled():
            out = case.call(layer, *ts)
    else:
        others = [k for k in KERNELS if k != kernel]
        with kernels.disabled(*others), kernels.chosen(kernels.slots([layer]), n=case.n, m=case.m,
                                                        cache=case.cache) as plan:
            assert plan.get(layer) is KERNELS[kernel], f"the dispatcher did not choose {kernel}"
            out = case.call(layer, *ts)
    out.backward(grads_of(out.shape))
    return [out.data] + [t.grad for t in ts] + [p.grad for p in layer.parameters()]


COMPARED = [0]          # comparisons made by assert_close (each row must make at least one)


def assert_close(got, want, dtype, what):
    COMPARED[0] += 1
    assert got.dtype == want.dtype == dtype, f"{what}: dtype {got.dtype} / {want.dtype}, expected {dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert np.all(np.isfinite(got)), f"{what}: not finite"
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max())
    assert err <= TOL[dtype] * scale, f"{what}: max error {err:.3g} > {TOL[dtype]:.0e} x {scale:.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
@pytest.mark.parametrize("name,index", [(name, i) for name, builders in ROWS.items() for i in range(len(builders))],
                         ids=[f"{name}-{i}" for name, builders in ROWS.items() for i in range(len(builders))])
def test_kernel_equals_its_reference(name, index, dtype):
    rng = np.random.default_rng(100 + index)
    case = ROWS[name][index](dtype, rng)
    before = COMPARED[0]
    if isinstance(case, DecodeCase):
        _compare_decoding(case, dtype)
    elif isinstance(case, OpCase):
        _compare_op(case, dtype, name)
    else:
        _compare_layer(case, dtype, name)
    assert COMPARED[0] > before, f"{name} row {index} compared nothing"


def _compare_layer(case, dtype, name):
    cotangent = np.random.default_rng(7)

    def grads_of(shape):
        return cotangent.standard_normal(shape).astype(dtype)

    fast = _run(case, grads_of, name)
    cotangent = np.random.default_rng(7)
    spec = _run(case, grads_of)
    labels = ["out"] + [f"d input {i}" for i in range(len(case.arrays))] + \
             [f"d {p}" for p, _ in case.layer.named_parameters()]
    for label, got, want in zip(labels, fast, spec):
        assert_close(got, want, dtype, f"{name}: {label}")


def test_each_kernel_produces_every_snapshot_it_does_not_skip():
    """A tracer that wants only the names a kernel keeps sees exactly those, and the kernel still runs."""
    rng = np.random.default_rng(5)
    for name in KERNELS:
        for build in ROWS[name]:
            case = build(np.float64, rng)
            if isinstance(case, DecodeCase):
                continue                            # the lean decoder produces no snapshot at all (skips "*")
            layer, kernel = case.layer, KERNELS[name]
            kept = {layer._prefix + s for s in type(layer).SNAPSHOTS if s not in kernel.skips}
            seen = []

            class Kept(TeachingTracer):
                def wants(self, names):
                    return any(n in kept for n in names)

                def record(self, n, t):
                    seen.append(n)
                    return t

            layer.set_tracer(Kept())
            try:
                with kernels.disabled(*[k for k in KERNELS if k != name]), \
                        kernels.chosen(kernels.slots([layer]), n=case.n, m=case.m, cache=case.cache) as plan:
                    assert plan.get(layer) is kernel
                    case.call(layer, *[Tensor(a) for a in case.arrays])
            finally:
                layer.set_tracer(None)
            assert set(seen) == kept, f"{name} produced {sorted(set(seen))}, expected {sorted(kept)}"


def test_a_traced_name_runs_the_reference():
    model = model_of(np.float64)
    n = FLASH_MIN_QUERIES + 3
    for wanted, expect in [("layers.1.attn.softmax", "tiled_self_attention"), ("layers.0.mlp.act", "fused_feed_forward"),
                           ("layers.0.mlp_norm.rms", "fused_rms_norm")]:
        class One(TeachingTracer):
            def wants(self, names):
                return wanted in names

        model.set_tracer(One())
        try:
            with kernels.chosen(model._kernel_slots, n=n, m=n, cache=None) as plan:
                pass
        finally:
            model.set_tracer(None)
        chosen = {layer._prefix: k.name for layer, k in plan.items()}
        owner = wanted.rsplit(".", 1)[0] + "."
        assert owner not in chosen, f"{owner} ran {chosen.get(owner)} though {wanted} is traced"
        assert expect in chosen.values(), f"untraced layers should still run {expect}"
    with kernels.chosen(model._kernel_slots, n=n, m=n, cache=None) as plan:
        assert len(plan) == len(model._kernel_slots)          # untraced: every replaceable layer
    assert all(layer.kernel is None for layer, _ in model._kernel_slots)   # and back on the reference after


def test_disabled_runs_no_kernel_and_nests():
    model = model_of(np.float64)
    with kernels.disabled():
        with kernels.chosen(model._kernel_slots, n=5, m=5, cache=None) as plan:
            assert plan == {}
        assert not kernels.lean_decoding(model)
    with kernels.disabled("fused_feed_forward"):
        with kernels.disabled("fused_rms_norm"):
            with kernels.chosen(model._kernel_slots, n=5, m=5, cache=None) as plan:
                assert {k.name for k in plan.values()} == {"fused_attention"}
        assert kernels.is_enabled("fused_rms_norm") and not kernels.is_enabled("fused_feed_forward")
    assert all(kernels.is_enabled(k) for k in KERNELS)
    with pytest.raises(ValueError, match="no kernel named 'flash'"):
        with kernels.disabled("flash"):
            pass


@pytest.mark.parametrize("n,cached", [(9, False), (FLASH_MIN_QUERIES + 5, False), (FLASH_MIN_QUERIES + 2, True)])
def test_whole_model_with_kernels_off_gives_the_same_loss_and_gradients(n, cached):
    model = model_of(np.float64)
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, CONFIG.vocab_size, (2, n))
    targets = rng.integers(0, CONFIG.vocab_size, (2, n))
    prefix = rng.integers(0, CONFIG.vocab_size, (2, 7))

    def run():
        model.zero_grad()
        cache = None
        if cached:
            cache = model.new_cache(2)
            with no_grad():
                model(prefix, cache)
        logits = model(tokens, cache)
        loss = ag.cross_entropy(logits, targets)
        loss.backward()
        return loss.item(), {name: p.grad.copy() for name, p in model.named_parameters()}

    fast_loss, fast = run()
    with kernels.disabled():
        spec_loss, spec = run()
    assert fast_loss == pytest.approx(spec_loss, rel=1e-12)
    for name in spec:
        assert_close(fast[name], spec[name], np.float64, name)


# ----------------------------------------------------------------------------
# nn.py is the spec: no path switches in the layers
# ----------------------------------------------------------------------------

def _source(fn):
    import inspect
    return inspect.getsource(fn)


def test_the_layers_have_no_path_switches():
    from glassllm import nn

    for cls in (nn.Attention, nn.RMSNorm, nn.FeedForward, nn.Block, nn.Transformer):
        src = _source(cls.__call__)
        for word in ("FLASH", "tracing", "_tracer", "flash", "fast"):
            assert word not in src, f"{cls.__name__}.__call__ mentions {word!r}"
        if cls is nn.Transformer:
            assert src.count("dispatcher.") == 1 and "kernels." not in src, \
                "the model asks the dispatcher once per forward, and only there"
        else:
            assert "kernel" not in src, f"{cls.__name__}.__call__ mentions a kernel"


def test_attention_follows_the_spec_in_its_order():
    """The seed's walkthrough: X -> Q/K/V -> RoPE -> cache -> GQA expansion -> QK^T/sqrt(d) -> causal mask
    -> softmax -> mix V -> W_O, each step once, in this order."""
    from glassllm import nn

    src = _source(nn.Attention.__call__)
    steps = ["self.wq(x)", "self.wk(x)", "self.wv(x)", "ag.rope(q", "ag.rope(k", "cache.append(",
             "ag.repeat_interleave(k", "ag.matmul(q, k.transpose(0, 1, 3, 2)) / math.sqrt(D)",
             "causal_mask(n, m, start", "ag.masked_fill(scores", "ag.softmax(scores", "ag.matmul(weights, v)",
             "ag.matmul(mix, wo)", "ag.sum(head_out"]
    where = [src.find(step) for step in steps]
    assert -1 not in where, f"missing step: {steps[where.index(-1)]}"
    assert where == sorted(where), f"steps out of the spec's order: {[s for _, s in sorted(zip(where, steps))]}"


def test_doctests():
    import doctest

    from glassllm.kernels import dense, dispatch

    for module in (dispatch, dense):
        assert doctest.testmod(module).failed == 0, module.__name__


# ----------------------------------------------------------------------------
# kernels.plan: which path each layer takes, and the trace's record of the paths taken
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("traced", [False, True, ["layers.1.attn.softmax", "layers.2.mlp_norm.rms"]],
                         ids=["untraced", "traced", "two-names"])
@pytest.mark.parametrize("n", [16, 256])
def test_plan_names_the_path_every_layer_takes_in_a_real_forward(n, traced):
    """The plan for a 16- and a 256-token forward equals the paths a tracer records while the model runs."""
    from glassllm.trace import Tracer

    model = Transformer(seed=0)
    tokens = np.random.default_rng(n).integers(0, model.config.vocab_size, (1, n))
    names = [] if traced is False else (None if traced is True else traced)
    with no_grad(), Tracer(model, names=names) as tracer:
        model(tokens)
    taken = tracer.trace.paths
    plan = kernels.plan(model, n=n, traced=traced)
    assert plan.paths == taken
    assert set(taken) == {layer.prefix[:-1] for layer, _ in model._kernel_slots}      # every replaceable layer
    for row in plan.rows:
        owner = type(next(x for x in model.modules() if x.prefix == row.layer + "."))
        if traced is True or (traced and any(name.startswith(row.layer + ".") for name in traced)):
            assert row.path == "reference" and "traced" in row.because      # a recorded snapshot: the reference
        else:                                       # the first registered kernel that serves these shapes
            serving = [k for k in kernels.kernels_for(owner) if k.applies(n, n, None)]
            assert row.path == serving[0].name and serving[0].serves in row.because
    text = str(plan)
    assert text.splitlines()[0].startswith(f"{n} new queries against {n} keys, no cache")
    for row in plan.rows:                           # every path appears on the printed table
        assert row.path in text


def test_plan_with_a_cache_names_the_decoder_and_follows_disabled():
    model = Transformer(seed=0)
    cache = model.new_cache(1)
    cache.start = 9
    plan = kernels.plan(model, n=1, cache=cache)
    assert plan.heading.startswith("1 new query against 10 keys, a cache")
    assert plan.decoding.path == "fast_decode" and "decoding steps" in str(plan)
    with kernels.disabled("fused_rms_norm", "fast_decode"):
        off = kernels.plan(model, n=1, m=10, cache=True)
    assert all(r.path == "reference" and "switched off" in r.because for r in off.rows if "norm" in r.layer)
    assert off.decoding.path != "fast_decode"
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        kernels.plan(model, n=0)
    with pytest.raises(TypeError, match="traced must be"):
        kernels.plan(model, n=3, traced=3)


def test_a_layer_called_directly_runs_its_reference_and_run_follows_its_kernel():
    model = model_of(np.float64)
    attn, norm = model.layers[0].attention, model.layers[0].attention_norm
    assert attn.kernel is None and norm.kernel is None
    with kernels.chosen(model._kernel_slots, n=5, m=5, cache=None) as plan:
        assert norm.kernel is plan[norm] is KERNELS["fused_rms_norm"]
        x = Tensor(np.random.default_rng(0).standard_normal((1, 5, CONFIG.dim)))
        seen = TeachingTracer()
        norm.set_tracer(seen)
        try:
            norm(x)                                 # the reference: every snapshot, rms included
            ref = list(seen.seen)
            seen.seen.clear()
            norm.run(x)                             # the kernel the dispatcher chose: no rms
        finally:
            norm.set_tracer(None)
    assert any(s.endswith(".rms") for s in ref) and not any(s.endswith(".rms") for s in seen.seen)
