"""A lazy trace (``trace(..., lazy=True)``) computes a block's snapshots when read; they equal a full trace's
bit for bit.

Every name of every block, values and gradients, on small random models (grouped-query, multi-query and
multi-head attention), with and without an intervention, and after the kept blocks were evicted.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from glassllm.nn import Transformer
from glassllm.trace import LazyTrace, trace
from glassllm.trace.interventions import Edit, MaskOff, Patch, Steer, ZeroAblate
from tests.support.glassllm_testing import CONFIGS, randomize


def _close(a, b, what):
    """Bit for bit: every pass of a lazy trace runs the code of a full trace's, on the same graph."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, what
    np.testing.assert_array_equal(a, b, err_msg=what)


@pytest.mark.parametrize("name", ["gqa3", "mqa", "mha", "gqa3 tied"])
@pytest.mark.parametrize("interventions", [(), (ZeroAblate(1, 0),), (MaskOff(layers=[0]),)])
def test_every_snapshot_and_gradient_equals_a_full_trace(name, interventions):
    config = CONFIGS[name.split()[0]]
    if name.endswith("tied"):                                           # the head is the embedding matrix
        config = dataclasses.replace(config, tie_embeddings=True)
    model = randomize(Transformer(config, seed=1, dtype=np.float64), np.random.default_rng(2))
    rng = np.random.default_rng(3)
    n = 11
    ids = rng.integers(0, config.vocab_size, n)
    targets = np.full(n, -100)
    targets[-1] = 4
    full = trace(model, ids, targets=targets, interventions=list(interventions))
    # keep_bytes=0: only the block just read is kept, so reading in this order recomputes every block
    lazy = LazyTrace(model, ids, targets, list(interventions), keep_bytes=0)
    assert lazy.loss == pytest.approx(full.loss, rel=1e-12)
    names = full.names()
    assert set(names) == set(lazy.names())
    for k in names + names[::-1]:
        _close(lazy.get(k), full.get(k), k)
        if not k.endswith("attn.mask"):
            _close(lazy.grad(k), full.grad(k), "grad " + k)
    held = sum(full.get(k).nbytes + (0 if k.endswith("mask") else full.grad(k).nbytes) for k in names)
    assert lazy.nbytes < held


def test_values_only_and_float32():
    config = CONFIGS["gqa3"]
    model = randomize(Transformer(config, seed=4), np.random.default_rng(5))
    ids = np.arange(9) % config.vocab_size
    full, lazy = trace(model, ids), trace(model, ids, lazy=True)
    for k in full.names():
        a, b = lazy.get(k), full.get(k)
        assert a.dtype == b.dtype == (np.bool_ if k.endswith("mask") else np.float32)
        np.testing.assert_array_equal(a, b, err_msg=k)
    with pytest.raises(ValueError, match="made without a loss"):
        lazy.grad("layers.0.attn.q")


def test_kept_blocks_stay_within_their_bytes():
    config = CONFIGS["gqa3"]
    model = Transformer(config, seed=0, dtype=np.float64)
    ids = np.arange(20) % config.vocab_size
    full = trace(model, ids, targets=ids)
    block = sum(full.get(k).nbytes + (0 if k.endswith("mask") else full.grad(k).nbytes)
                for k in full.names() if k.startswith("layers.0."))   # one block's snapshots and gradients
    keep = int(1.5 * block)
    lazy = LazyTrace(model, ids, ids, keep_bytes=keep)
    fixed = lazy.nbytes                          # no block computed yet: one graph's forward and backward
    assert lazy.reserved_bytes == fixed + keep
    for i in [0, 1, 2, 0, 2]:
        lazy.get(f"layers.{i}.mlp.act")
        assert fixed + block <= lazy.nbytes <= fixed + keep
    assert lazy.nbytes < fixed + 2 * block


def test_a_small_model_reserves_what_all_its_blocks_hold_not_the_whole_bound():
    # A cache sizes a lazy trace by reserved_bytes: a bound far above the model's blocks must not count.
    config = CONFIGS["gqa3"]
    model = Transformer(config, seed=0, dtype=np.float64)
    ids = np.arange(20) % config.vocab_size
    lazy = LazyTrace(model, ids, ids, keep_bytes=1 << 30)
    reserved = lazy.reserved_bytes
    assert reserved < 1 << 30
    for k in lazy.names():                        # every block computed and kept
        lazy.get(k)
        if not k.endswith("mask"):
            lazy.grad(k)
    assert lazy.nbytes <= reserved <= 3 * lazy.nbytes


def test_lazy_refuses_what_it_cannot_follow():
    model = Transformer(CONFIGS["mqa"], seed=0)
    with pytest.raises(ValueError, match="records every name of one row"):
        trace(model, [1, 2], names="logits", lazy=True)
    with pytest.raises(ValueError, match="one row of tokens"):
        trace(model, [[1, 2], [3, 4]], lazy=True)


@pytest.mark.parametrize("graph", [False, True])
def test_a_loss_added_after_the_forward_gives_the_same_gradients(graph):
    """The inspector's way: one forward, the target read from its own last logits, then the backward
    (``graph=True``: on the forward's own graph, without a second forward)."""
    config = CONFIGS["gqa3"]
    model = randomize(Transformer(config, seed=6, dtype=np.float64), np.random.default_rng(7))
    ids = np.arange(3, 13) % config.vocab_size
    lazy = LazyTrace(model, ids, graph=graph)
    lazy.get("layers.1.attn.softmax")                    # a block read before the loss: recomputed after it
    targets = np.full(len(ids), -100)
    targets[-1] = int(np.argmax(lazy.last_logits))
    lazy.backward(targets)
    full = trace(model, ids, targets=targets)
    assert lazy.loss == full.loss
    for k in ("layers.1.attn.softmax", "layers.0.mlp.act", "embed", "logits", "norm.rms", "probs",
              "layers.1.resid_post", "layers.0.resid_pre"):
        _close(lazy.grad(k), full.grad(k), k)
        _close(lazy.get(k), full.get(k), k)
    with pytest.raises(ValueError, match="one backward per trace"):
        lazy.backward(targets)


def test_across_gives_every_blocks_snapshot():
    config = CONFIGS["gqa3"]
    model = randomize(Transformer(config, seed=8), np.random.default_rng(9))
    ids = np.arange(1, 12) % config.vocab_size
    full = trace(model, ids, interventions=[ZeroAblate(0, 1)])
    every = LazyTrace(model, ids, interventions=[ZeroAblate(0, 1)]).across("attn.softmax", "attn.mask")
    assert sorted(every) == sorted(f"layers.{i}.attn.{k}" for i in range(config.n_layers) for k in ("softmax", "mask"))
    for k, v in every.items():
        _close(v, full.get(k), k)
    kept = LazyTrace(model, ids, interventions=[ZeroAblate(0, 1)], graph=True)   # kept from its forward
    before = kept.nbytes
    again = kept.across("attn.softmax", "attn.mask")
    assert kept.nbytes == before and sorted(again) == sorted(every)
    for k, v in again.items():
        _close(v, full.get(k), k)
    with pytest.raises(ValueError, match="not a snapshot"):
        LazyTrace(model, ids).across("attn.nope")


def test_across_runs_each_block_only_as_far_as_its_names_under_every_intervention(monkeypatch):
    """Each block stops once it has recorded the names asked for: the attention weights under an intervention
    on the same layer's scores and one on an earlier head equal a full trace's, and a name past the attention
    (which needs the whole block) too; nothing after the softmax is computed for the grid's names."""
    import glassllm.nn as nn
    from glassllm.trace.interventions import Temperature

    config = CONFIGS["gqa3"]
    model = randomize(Transformer(config, seed=8), np.random.default_rng(9))
    ids = np.arange(2, 13) % config.vocab_size
    ivs = [ZeroAblate(0, 1), Temperature(0.5, layers=[1]), MaskOff(config.n_layers - 1)]
    full = trace(model, ids, interventions=ivs)
    lazy = LazyTrace(model, ids, interventions=ivs)
    for names in (("attn.softmax", "attn.mask"), ("attn.scores",), ("mlp.act", "attn.softmax")):
        got = lazy.across(*names)
        assert sorted(got) == sorted(f"layers.{i}.{k}" for i in range(config.n_layers) for k in names)
        for k, v in got.items():
            _close(v, full.get(k), k)
    seen = []
    snap = nn.Module.snap

    def spy(module, local, t):
        seen.append((type(module).__name__, local))
        return snap(module, local, t)
    lazy = LazyTrace(model, ids)
    monkeypatch.setattr(nn.Module, "snap", spy)
    lazy.across("attn.softmax")
    assert seen.count(("Attention", "softmax")) == config.n_layers
    assert not {("Attention", "mix"), ("Attention", "head_out"), ("Attention", "out"), ("Block", "resid_mid")} & set(seen)


@pytest.mark.parametrize("targets", [False, True])
def test_the_first_forward_leaves_out_the_vocabulary_softmax_until_it_is_read(monkeypatch, targets):
    """``probs`` (n, V) feeds nothing downstream: the lazy trace's first forward, which runs every layer's
    reference code, does not compute it; reading it runs the final norm and head again, and it equals a full
    trace's, bit for bit (with a loss, its gradient too: zero, as the loss is taken from the logits)."""
    import glassllm.autograd as ag

    config = CONFIGS["gqa3"]
    model = randomize(Transformer(config, seed=10, dtype=np.float64), np.random.default_rng(11))
    ids = np.arange(3, 12) % config.vocab_size
    kw = {"targets": np.roll(ids, -1)} if targets else {}
    full = trace(model, ids, **kw)
    widths = []
    softmax = ag.softmax

    def spy(x, axis=-1):
        widths.append(x.shape[-1])
        return softmax(x, axis=axis)
    monkeypatch.setattr(ag, "softmax", spy)
    lazy = trace(model, ids, lazy=True, **kw)
    assert config.vocab_size not in widths                             # attention rows only (width n)
    _close(lazy.get("probs"), full.get("probs"), "probs")
    assert widths.count(config.vocab_size) == 1                         # computed once, when read
    if targets:
        _close(lazy.grad("probs"), full.grad("probs"), "grad probs")


def _block_input_changes(model, ids):
    """Interventions on a block's input (and output): each is made once, and a gradient stops where the
    change cuts the graph."""
    C = model.config.dim
    v = np.linspace(-1.0, 1.0, C)
    source = trace(model, ids[::-1].copy(), names=["layers.1.resid_pre"]).get("layers.1.resid_pre")
    return {
        "steer": [Steer("layers.1.resid_pre", v, 0.5)],
        "edit": [Edit("layers.1.resid_pre", lambda x: x * 0.5)],        # a new tensor: no gradient flows back
        "patch": [Patch("blocks.1.hook_resid_pre", source, positions=[1, 3])],
        "two": [Steer("layers.0.resid_pre", v, -0.25), Steer("layers.1.resid_post", v, 1.0),
                Edit("layers.2.resid_pre", lambda x: x + 1.0)],
    }


@pytest.mark.parametrize("change", ["steer", "edit", "patch", "two"])
@pytest.mark.parametrize("graph", [True, False])
def test_an_intervention_on_a_blocks_input_is_made_once(change, graph):
    config = CONFIGS["gqa3"]
    model = randomize(Transformer(config, seed=8, dtype=np.float64), np.random.default_rng(9))
    ids = np.arange(2, 12) % config.vocab_size
    targets = (ids * 7 + 3) % config.vocab_size
    interventions = _block_input_changes(model, ids)[change]
    full = trace(model, ids, targets=targets, interventions=interventions)
    if graph:                                           # one forward and one backward on one graph
        lazy = LazyTrace(model, ids, targets, interventions, keep_bytes=0)
    else:                                               # the backward a block at a time
        lazy = LazyTrace(model, ids, None, interventions, keep_bytes=0).backward(targets)
    assert lazy.loss == full.loss
    names = full.names()
    for k in names:
        _close(lazy.get(k), full.get(k), k)
        if not k.endswith("attn.mask"):
            _close(lazy.grad(k), full.grad(k), "grad " + k)
    if change == "edit":
        assert not full.grad("layers.0.resid_post").any() and not lazy.grad("layers.0.attn.q").any()
    values = trace(model, ids, interventions=interventions)
    across = LazyTrace(model, ids, None, interventions).across("attn.softmax", "attn_norm.in")
    for k, a in across.items():
        _close(a, values.get(k), "across " + k)


def test_a_lazy_trace_is_a_mapping_of_every_name():
    config = CONFIGS["mqa"]
    model = Transformer(config, seed=0)
    ids = np.arange(6) % config.vocab_size
    full, lazy = trace(model, ids), trace(model, ids, lazy=True)
    assert len(lazy) == len(full) and list(lazy) == list(full) and set(lazy.keys()) == set(full.keys())
    assert "layers.1.attn.q" in lazy and ("attn.softmax", 0) in lazy and "blocks.0.attn.hook_pattern" in lazy
    assert "attn.nope" not in lazy
    _close(lazy["layers.1.attn.q"], full["layers.1.attn.q"], "q")
    _close(lazy["pattern", -1], full["pattern", -1], "pattern")
    _close(lazy["logits"], full["logits"], "logits")
    with pytest.raises(KeyError, match="attn.nope"):
        lazy["attn.nope", 0]


def test_a_lazy_trace_longer_than_the_context_is_refused_in_one_line():
    model = Transformer(CONFIGS["mqa"], seed=0)
    n = model.config.max_seq_len + 1
    ids = np.arange(n) % model.config.vocab_size
    for targets in (None, ids):
        with pytest.raises(ValueError, match=f"sequence of {n} positions .* exceeds the context length "
                                             f"{n - 1}$"):
            trace(model, ids, targets=targets, lazy=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("keep_bytes, loss, grid_bytes", [(1 << 30, True, None), (1 << 30, False, None),
                                                         (5_000, True, None), (0, True, None), (0, True, 1 << 30),
                                                         (1 << 30, True, 0)])
def test_what_a_lazy_trace_reserves_is_known_before_it_runs(dtype, keep_bytes, loss, grid_bytes):
    """LazyTrace.bytes_for, from the config alone, is the reserved_bytes of the trace once made (a cache
    sizes itself by it), with and without the attention weights kept for across(), on their own bound or
    the kept blocks'."""
    config = CONFIGS["gqa3"]
    model = Transformer(config, seed=0, dtype=dtype)
    ids = np.arange(14) % config.vocab_size
    lazy = LazyTrace(model, ids, ids if loss else None, keep_bytes=keep_bytes, graph=loss, grid_bytes=grid_bytes)
    want = LazyTrace.bytes_for(config, len(ids), itemsize=np.dtype(dtype).itemsize, keep_bytes=keep_bytes,
                               loss=loss, graph=loss, grid_bytes=grid_bytes)
    assert lazy.reserved_bytes == want
    grid = keep_bytes if grid_bytes is None else grid_bytes
    assert bool(lazy._across) == (loss and grid == 1 << 30)             # both regimes of across() are covered


@pytest.mark.parametrize("keep_bytes", [1 << 30, 0])
def test_the_gradients_of_every_blocks_attention_weights_equal_a_full_traces(keep_bytes, monkeypatch):
    """With room, the one-graph backward keeps them (no block runs again to read them); without, each block
    runs again: the same numbers either way."""
    config = CONFIGS["gqa3"]
    model = randomize(Transformer(config, seed=10, dtype=np.float64), np.random.default_rng(11))
    ids = np.arange(4, 15) % config.vocab_size
    targets = (ids * 5 + 1) % config.vocab_size
    full = trace(model, ids, targets=targets, interventions=[ZeroAblate(0, 1)])
    lazy = LazyTrace(model, ids, targets, [ZeroAblate(0, 1)], keep_bytes=keep_bytes)
    assert LazyTrace.grid_kept(config, len(ids), keep_bytes) == (keep_bytes > 0)
    runs = []
    monkeypatch.setattr(LazyTrace, "_segment", lambda self, seg, real=LazyTrace._segment: runs.append(seg) or
                        real(self, seg))
    got = lazy.across("attn.softmax", grads=True)
    assert list(got) == [f"layers.{i}.attn.softmax" for i in range(config.n_layers)]
    for k, g in got.items():
        _close(g, full.grad(k), "grad " + k)
    assert runs == ([] if keep_bytes else [f"layers.{i}" for i in range(config.n_layers)])
