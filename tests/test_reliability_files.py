"""Untrusted files: a model file someone sent you cannot make glassllm allocate, unpickle or crash.

- The loader knows every parameter's shape from the config by arithmetic
  (``ModelConfig.param_shapes``); that table equals the shapes a real Transformer has.
- Crafted headers -- a tensor of 10^12 elements, a shape bigger than its
  bytes, a config of width 2^20, a context of 10^9 positions -- are refused
  before any large allocation: tracemalloc (which sees NumPy's buffers, as
  the positive control shows) records a peak of well under a megabyte.
- Nothing in glassllm unpickles: no pickle call in the source, and every
  loader works with ``pickle`` and ``np.load``'s pickle path switched off.

Random byte-level mutations of model, tokenizer and trace files are in
``test_reliability_fuzz.py``; the list of refused files is the inventory's
"bad model or tokenizer file" kind.
"""

from __future__ import annotations

import json
import re
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tests.support.glassllm_testing import CONFIGS
from tests.test_reliability_inventory import CONFIG, get_env, safetensors_bytes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def env():
    return get_env()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_shapes_from_the_config_equal_the_model(name):
    from glassllm.nn import Transformer

    config = CONFIGS[name]
    model = Transformer(config, seed=0)
    assert config.param_shapes() == {k: p.shape for k, p in model.named_parameters()}


def _peak_while(fn) -> tuple[int, Exception | None]:
    """Bytes allocated at the peak (above the start) while ``fn`` runs, and what it raised."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        err = None
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- the caller judges it
            err = e
        return tracemalloc.get_traced_memory()[1] - start, err
    finally:
        tracemalloc.stop()


def _giant_consistent(root: Path) -> Path:
    """A header that agrees with its config everywhere -- 65,536 ids x width 16,384, 4 GiB per
    embedding -- but whose file is a few KB: every tensor points past the end."""
    from glassllm.config import ModelConfig

    good = (root / "tiny.safetensors").read_bytes()
    meta = json.loads(good[8:8 + struct.unpack("<Q", good[:8])[0]])["__metadata__"]
    config = {**CONFIG, "vocab_size": 65536, "dim": 16384, "ffn_dim": 43712}
    header, offset = {}, 0
    for name, shape in ModelConfig(**config).param_shapes().items():
        size = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    path = root / "giant-consistent.safetensors"
    path.write_bytes(safetensors_bytes({"__metadata__": {**meta, "config": json.dumps(config)}, **header},
                                       b"\0" * 4096))
    return path


@pytest.mark.parametrize("name, claim", [
    ("huge-tensor.safetensors", "a 10^12-element tensor (4 TB) at offsets past the end"),
    ("huge-shape.safetensors", "a 10^12-element shape over 38 KB of data"),
    ("huge-config.safetensors", "a config of width 2^20 (shapes of 2^40 elements)"),
    ("huge-context.safetensors", "a context of 10^9 positions (rotary tables of 120 GB)"),
    ("giant-consistent.safetensors", "65,536 x 16,384 embeddings, consistent with the config"),
])
def test_absurd_sizes_are_refused_before_any_large_allocation(env, name, claim):
    from glassllm.checkpoint import load_model

    path = env.root / name if name != "giant-consistent.safetensors" else _giant_consistent(env.root)
    load_model(env.root / "tiny.safetensors")                     # warm up: imports and caches
    control, err = _peak_while(lambda: load_model(env.root / "tiny.safetensors"))
    assert err is None
    weights = sum(p.data.nbytes for p in env.model.parameters())
    assert control >= weights, "tracemalloc must see NumPy's buffers for this test to mean anything"

    peak, err = _peak_while(lambda: load_model(path))
    assert isinstance(err, ValueError) and "\n" not in str(err), f"{claim}: {err!r}"
    assert peak < 1 << 20, f"{claim}: {peak / 1e6:.1f} MB allocated before the refusal"


def test_the_refusal_costs_no_resident_memory(env):
    """The same, seen by the OS: the process's peak RSS does not grow while the crafted files are refused."""
    import resource

    from glassllm.checkpoint import load_model

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss               # KiB on Linux
    for name in ("huge-tensor.safetensors", "huge-shape.safetensors", "huge-config.safetensors",
                 "huge-context.safetensors"):
        for _ in range(20):
            with pytest.raises(ValueError):
                load_model(env.root / name)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < 50 * 1024, f"peak RSS grew by {grown / 1024:.0f} MB"


# ----------------------------------------------------------------------------
# Never pickle
# ----------------------------------------------------------------------------

PICKLE_CALLS = re.compile(r"\bpickle\.|\bcPickle\b|\bUnpickler\b|torch\.load\(|allow_pickle\s*=\s*True|"
                          r"\bjoblib\b|\bdill\b|\bshelve\b|\bmarshal\.load")


def test_no_source_file_unpickles():
    hits = []
    for path in sorted((ROOT / "src" / "glassllm").rglob("*.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if PICKLE_CALLS.search(code):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, hits


def test_every_loader_works_with_pickle_switched_off(env, monkeypatch, tmp_path):
    """Model files, tokenizers, traces, training state and the token cache, with every unpickling path raising."""
    import pickle

    from glassllm.checkpoint import load_model
    from glassllm.config import ModelConfig
    from glassllm.tokenizer import Tokenizer
    from glassllm.trace import load_trace, trace
    from glassllm.train import TrainConfig, Trainer

    trace(env.model, [5, 6, 7], targets=[6, 7, 8]).save(tmp_path / "t.npz")
    config = TrainConfig(steps=2, batch_size=2, seq_len=16, warmup_steps=1, checkpoint_every=1, eval_every=0)
    Trainer(config, ModelConfig(**CONFIG), [env.root / "train.txt"], tmp_path / "run", tokenizer=env.tok,
            progress=False).run(until=1)

    def refuse(*a, **k):
        raise AssertionError("something unpickled")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    real_load = np.load
    monkeypatch.setattr(np, "load", lambda *a, **k: real_load(*a, **{**k, "allow_pickle": False}))

    model, tok, _ = load_model(env.root / "tiny.safetensors")
    assert tok.to_json() == env.tok.to_json()
    assert Tokenizer.load(env.root / "tok.json").vocab_size == 300
    assert load_trace(tmp_path / "t.npz").grad("logits").shape == (3, 300)
    resumed = Trainer.resume(tmp_path / "run", progress=False)          # weights, moments, token cache
    resumed.run(until=2)
    assert resumed.step == 2
