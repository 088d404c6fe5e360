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


TIED = ModelConfig(**{**SMALL.to_dict(), "tie_embeddings": True})


def test_a_tied_model_is_written_and_read_back_tied(tmp_path):
    """A tied head is stored once: no output.weight in the file, and the loaded head is the embedding."""
    model = Transformer(TIED, seed=3)
    assert model.output.weight is model.tok_embeddings.weight
    assert sorted(model.state_dict()) == sorted(TIED.param_shapes())
    assert model.num_params() == TIED.n_params == SMALL.n_params - SMALL.vocab_size * SMALL.dim
    path = tmp_path / "tied.safetensors"
    save_model(path, model, TOKENIZER)
    untied = tmp_path / "untied.safetensors"
    save_model(untied, Transformer(SMALL, seed=3), TOKENIZER)
    assert path.stat().st_size < untied.stat().st_size - SMALL.vocab_size * SMALL.dim * 4 + 1
    stored = read_safetensors(path)
    assert "output.weight" not in stored and "tok_embeddings.weight" in stored
    for mmap in (True, False):
        loaded, _, meta = load_model(path, mmap=mmap)
        assert json.loads(meta["config"])["tie_embeddings"] is True and loaded.config == TIED
        assert loaded.output.weight is loaded.tok_embeddings.weight
        ids = np.array([[1, 5, 9, 200]])
        assert np.array_equal(loaded(ids).data, model(ids).data)


def test_an_untied_file_reads_as_before_and_is_written_byte_for_byte_as_before(tmp_path):
    """Files without the field (every file written before it) load untied; writing an untied model
    again gives the same bytes: the bundled model, loaded and saved, is the file it came from."""
    from glassllm.checkpoint import bundled_model_path, read_header

    path = bundled_model_path()
    header, meta = read_header(path)
    assert "tie_embeddings" not in json.loads(meta["config"]) and "output.weight" in header
    model, tok, meta = load_model(path)
    assert model.config.tie_embeddings is False and model.output.weight is not model.tok_embeddings.weight
    again = tmp_path / "again.safetensors"
    save_model(again, model, tok, {k: v for k, v in meta.items() if k not in ("format", "version", "config",
                                                                             "tokenizer")})
    assert again.read_bytes() == path.read_bytes()


def _with_config(path, out, edit, drop=()):
    """The model file ``path`` written to ``out`` with its config edited and tensors ``drop`` left out."""
    from glassllm.checkpoint import read_header

    _, meta = read_header(path)
    state = {k: v for k, v in read_safetensors(path).items() if k not in drop}
    write_safetensors(out, state, {**meta, "config": json.dumps({**json.loads(meta["config"]), **edit})})
    return out


@pytest.mark.parametrize("edit, drop, words", [
    ({"tie_embeddings": "yes"}, (), "tie_embeddings must be true or false, got 'yes'"),
    ({"tie_embeddings": 1}, (), "tie_embeddings must be true or false, got 1"),
    ({"tie_embeddings": True}, (), "unexpected tensor 'output.weight'"),      # a tied config beside a head
    ({}, ("output.weight",), "missing tensor 'output.weight'"),              # an untied config without one
    ({"tie_embeddings": True}, ("tok_embeddings.weight",), "unexpected tensor 'output.weight'"),  # head only
    ({"tie_embeddings": True}, ("tok_embeddings.weight", "output.weight"), "missing tensor 'tok_embeddings.weight'"),
])
def test_a_file_whose_head_does_not_match_its_config_is_refused_in_one_line(tmp_path, edit, drop, words):
    source = tmp_path / "m.safetensors"
    save_model(source, Transformer(SMALL, seed=0), TOKENIZER)
    bad = _with_config(source, tmp_path / "bad.safetensors", edit, drop)
    with pytest.raises(ValueError) as e:
        load_model(bad)
    assert words in str(e.value) and "bad.safetensors" in str(e.value) and "\n" not in str(e.value)


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
