"""Every registered kernel against the reference it replaces, on the same inputs.

One table, ``ROWS``: a row per kernel of :data:`glassllm.kernels.KERNELS`. Each
row builds a layer (or a model) of a small config with trained-scale weights,
and its inputs; the test runs the layer's call once with exactly that kernel
chosen by the dispatcher and once on the reference ``__call__`` (every kernel
switched off), then compares the outputs and the gradients of a random
cotangent with respect to the inputs and every parameter: float64 to 1e-12,
float32 to 1e-5 (relative to the largest entry), as tinygrad's ``test_ops``
compares each op with PyTorch. Adding a kernel = one registration + one row
here; ``test_every_kernel_has_a_row`` fails until the row exists.

The other tests: a kernel produces exactly the snapshots it does not declare as
skipped; a traced name always runs the reference; ``kernels.disabled()`` runs
the reference everywhere, with the same results to rounding, for a whole
model's loss and gradients.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from glassllm_testing import TeachingTracer, randomize
from glassllm import autograd as ag
from glassllm import kernels
from glassllm.autograd import Tensor, no_grad
from glassllm.config import ModelConfig
from glassllm.kernels import FLASH_MIN_QUERIES, KERNELS, FastDecoder
from glassllm.nn import Transformer

CONFIG = ModelConfig(vocab_size=61, dim=48, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=80,
                     max_seq_len=FLASH_MIN_QUERIES + 40, norm_eps=1e-5, rope_theta=500.0)
TOL = {np.float64: 1e-12, np.float32: 1e-5}
DTYPES = [np.float64, np.float32]


def model_of(dtype, seed=0) -> Transformer:
    model = Transformer(CONFIG, seed=seed, dtype=np.float64)
    return randomize(model, np.random.default_rng(seed + 1)).astype(dtype)


def rope_of(model, start, n, pad=None):
    """(cos, sin) as Transformer.__call__ makes them for positions start .. start+n-1."""
    if pad is None:
        return model.rotary.tables(np.arange(start, start + n))
    positions = np.maximum(np.arange(start, start + n)[None, :] - pad[:, None], 0)
    cos, sin = model.rotary.tables(positions)
    return cos[:, None], sin[:, None]


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


# kernel name -> its cases (builders: dtype, rng -> Case)
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
    ],
}


@dataclass
class DecodeCase:
    """A prefill of ``tokens`` (B, n) with left padding ``pad``, then ``steps - 1`` greedy single-token steps."""

    model: Transformer
    tokens: np.ndarray
    pad: list | None
    steps: int


def _compare_decoding(case: DecodeCase, dtype):
    """The lean decoder's logits and cache, step by step, against the model's reference forward."""
    model = case.model
    pad = None if case.pad is None else np.array(case.pad)
    batch = case.tokens.shape[0]
    lean_cache, spec_cache = model.new_cache(batch, pad=pad), model.new_cache(batch, pad=pad)
    lean = FastDecoder(model)
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


def test_every_kernel_has_a_row():
    assert set(ROWS) == set(KERNELS), "a registered kernel needs a row in ROWS (and a row, a kernel)"
    empty = [name for name, builders in ROWS.items() if not builders]
    assert not empty, f"{empty} have no comparison in ROWS: each kernel needs at least one real case"
    for name, kernel in KERNELS.items():
        assert kernel.reference and kernel.replaces and kernel.doc, f"{name} must say what it replaces and why"


def _replaced_class(kernel):
    module, _, cls = kernel.replaces.rpartition(".")
    return getattr(importlib.import_module(module), cls)


def test_every_kernel_replaces_a_real_layer_and_skips_real_names():
    for kernel in KERNELS.values():
        cls = _replaced_class(kernel)
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


def assert_close(got, want, dtype, what):
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
    if isinstance(case, DecodeCase):
        _compare_decoding(case, dtype)
        return
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
    for name, builders in ROWS.items():
        for build in builders:
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
            assert src.count("kernels.") == 1, "the model asks the dispatcher once per forward, and only there"
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
