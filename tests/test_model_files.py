"""Model files opened without copies: memory-mapped tensors, no initial weights drawn, writes a tensor at a time.

Peak memory is read in a fresh interpreter (``VmHWM`` of ``/proc/self/status``): a memory-mapped load
adds about the file's size (its pages, read once to check them), a copying load twice that.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from glassllm.checkpoint import load_model, save_model
from glassllm.config import ModelConfig
from glassllm.files import read_safetensors, write_safetensors
from glassllm.nn import Transformer
from glassllm.tokenizer import Tokenizer

TOKENIZER = Tokenizer.train(["ab ab abc abd"], vocab_size=260)
SMALL = ModelConfig(vocab_size=TOKENIZER.vocab_size, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
                    max_seq_len=32)


def test_written_file_reads_back_through_safetensors(tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(0)
    tensors = {"b.w": rng.standard_normal((3, 5)).astype(np.float32), "a": rng.standard_normal(7),
               "z": rng.standard_normal(3).astype(np.float32), "h": np.ones(3, np.float16),
               "empty": np.zeros((0, 3), np.float32), "strided": rng.standard_normal((4, 6))[:, ::2]}
    meta = {"format": "x", "note": "é\n"}
    write_safetensors(tmp_path / "x.safetensors", tensors, meta)
    back = safetensors.load_file(tmp_path / "x.safetensors")
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k
    from safetensors import safe_open

    with safe_open(str(tmp_path / "x.safetensors"), framework="numpy") as f:
        assert f.metadata() == meta
    ours = read_safetensors(tmp_path / "x.safetensors")
    assert all(np.array_equal(ours[k], tensors[k]) for k in tensors)


def test_mapped_load_equals_a_copying_load_and_never_writes_the_file(tmp_path):
    path = tmp_path / "m.safetensors"
    model = Transformer(SMALL, seed=3)
    save_model(path, model, TOKENIZER)
    before = path.read_bytes()
    mapped, _, _ = load_model(path)
    copied, _, _ = load_model(path, mmap=False)
    ids = np.array([[1, 5, 9, 200, 7]]) % SMALL.vocab_size
    assert np.array_equal(mapped(ids).data, model(ids).data)
    assert np.array_equal(copied(ids).data, model(ids).data)
    assert all(isinstance(p.data.base, np.ndarray) or p.data.base is not None for p in mapped.parameters())
    for p in mapped.parameters():                           # training writes the process's pages only
        p.data *= 2
    assert path.read_bytes() == before
    assert np.array_equal(load_model(path)[0](ids).data, model(ids).data)


def test_tied_arrays_are_not_shared_by_two_parameters():
    model = Transformer(SMALL, init=False)
    state = Transformer(SMALL, seed=1).state_dict()
    state["output.weight"] = state["tok_embeddings.weight"]       # a tied head, one array for both
    model.load_state_dict(state, copy=False)
    assert np.array_equal(model.output.weight.data, model.tok_embeddings.weight.data)
    assert not np.shares_memory(model.output.weight.data, model.tok_embeddings.weight.data)
    model.output.weight.data += 1
    assert not np.array_equal(model.output.weight.data, model.tok_embeddings.weight.data)


def test_a_model_built_without_initialisation_draws_nothing():
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    Transformer(SMALL, seed=rng, init=False)
    assert rng.bit_generator.state == state
    Transformer(SMALL, seed=rng)
    assert rng.bit_generator.state != state


_PEAK = """
import json, sys
import numpy as np
from glassllm.checkpoint import load_model

def kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

before = kb("VmHWM")
model, _, _ = load_model(sys.argv[1], mmap=sys.argv[2] == "mmap")
print(json.dumps({"peak_kb": kb("VmHWM") - before, "anon_kb": kb("RssAnon")}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_mapped_load_allocates_no_second_copy(tmp_path):
    """Peak RSS added by loading a 40 MB model file: about the file (its pages) when mapped, and at
    least one more copy when read into memory of its own (the contrast shows the measure can tell)."""
    config = ModelConfig(vocab_size=TOKENIZER.vocab_size, dim=512, n_layers=6, n_heads=4, n_kv_heads=2,
                         ffn_dim=1024, max_seq_len=64)
    path = tmp_path / "m.safetensors"
    save_model(path, Transformer(config, seed=0), TOKENIZER)
    size_kb = path.stat().st_size / 1024

    def peak(how):
        run = subprocess.run([sys.executable, "-c", _PEAK, str(path), how], capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout)["peak_kb"]

    mapped, copied = peak("mmap"), peak("copy")
    assert mapped < 1.25 * size_kb, (mapped, size_kb)
    assert copied > 1.8 * size_kb, (copied, size_kb)
