"""Hugging Face interop: glassllm -> transformers and back, checked against transformers itself.

The model under test is the bundled TinyStories model when the package ships it,
and otherwise a small model trained here on generated stories (tokenizer and
weights both learned in the test). The import tests build random
``LlamaForCausalLM`` models of a shape unlike ours with ``from_config``.
Tests that need ``transformers``/``torch`` skip without them; the error tests
need neither.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from glassllm import autograd as ag
from glassllm import checkpoint, cli, hf
from glassllm.hf import tokenizer_to_hf
from glassllm.config import ModelConfig
from glassllm.nn import Transformer
from glassllm.optim import AdamW
from glassllm.tokenizer import Tokenizer
from tests.support.glassllm_testing import randomize

SHARED_VALID = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinystories" / "valid.txt"


# ----------------------------------------------------------------------------
# Data and models made here
# ----------------------------------------------------------------------------

def generated_stories(n: int, seed: int = 0) -> list[str]:
    """Small templated stories with made-up names (enough distinct pairs for a few hundred merges)."""
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "ren", "to", "sa", "bel", "nu", "fi", "dor", "ta", "vin"]
    names = ["".join(rng.choice(syllables, size=rng.integers(2, 4))).capitalize() for _ in range(40)]
    animals = ["cat", "dog", "bird", "fish", "frog", "bear", "rabbit", "duck", "horse", "mouse", "lion", "owl"]
    adjs = ["little", "happy", "big", "red", "kind", "shy", "brave", "tiny"]
    verbs = ["play", "run", "jump", "sing", "swim", "read", "draw", "dance", "climb", "bake", "paint", "laugh"]
    out = []
    for _ in range(n):
        name, animal, adj, verb = rng.choice(names), rng.choice(animals), rng.choice(adjs), rng.choice(verbs)
        out.append(
            f"Once upon a time, there was a {adj} {animal} named {name}. {name} liked to {verb} every day.\n"
            f"One day, {name} saw a {rng.choice(adjs)} {rng.choice(animals)}. \u201cDo you want to {verb} "
            f"with me?\u201d said {name}. They were {rng.choice(['happy', 'sad', 'tired'])} and they {verb} "
            f"all day. It was {rng.integers(2, 99)} o'clock \u2014 time to go home!")
    return out


def train_small_model(seed: int = 0, steps: int = 60):
    """A 2-layer model trained briefly on generated stories: peaked, position-dependent attention."""
    rng = np.random.default_rng(seed)
    text = "\n<|endoftext|>\n".join(generated_stories(400, seed))
    tok = Tokenizer.train([text], vocab_size=400)
    ids = np.asarray(tok.encode(text, allowed_special="all"))
    config = ModelConfig(vocab_size=400, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                         ffn_dim=ModelConfig.llama_ffn_dim(64), max_seq_len=512)
    model = Transformer(config, seed=seed)
    opt = AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.0)
    T = 48
    for _ in range(steps):
        starts = rng.integers(0, len(ids) - T - 1, size=4)
        x = np.stack([ids[s:s + T] for s in starts])                     # (B, T)
        y = np.stack([ids[s + 1:s + T + 1] for s in starts])             # (B, T)
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, tok


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    """The bundled model if present, else a model trained here; returns its path."""
    bundled = checkpoint.bundled_model_path()
    if bundled.exists():
        return bundled
    model, tok = train_small_model()
    path = tmp_path_factory.mktemp("model") / "small.safetensors"
    checkpoint.save_model(path, model, tok)
    return path


@pytest.fixture(scope="module")
def text() -> str:
    """Held-out text: the shared validation stories when present, else freshly generated ones."""
    if SHARED_VALID.exists():
        return SHARED_VALID.read_text(encoding="utf-8")
    return "\n<|endoftext|>\n".join(generated_stories(300, seed=123))


@pytest.fixture(scope="module")
def exported(model_file, tmp_path_factory):
    """``glassllm export FILE --format hf DIR`` through the CLI; returns DIR."""
    out = tmp_path_factory.mktemp("export") / "hf"
    assert cli.main(["export", str(model_file), "--format", "hf", str(out)]) == 0
    return out


def hf_logits(hf_model, ids) -> np.ndarray:
    torch = pytest.importorskip("torch")
    with torch.no_grad():
        return hf_model(torch.tensor([list(ids)])).logits[0].double().numpy()   # (n, V)


def our_logits(model, ids) -> np.ndarray:
    with ag.no_grad():
        return model(np.asarray([list(ids)])).data[0].astype(np.float64)        # (n, V)


# ----------------------------------------------------------------------------
# The RoPE permutation, against a hand-written rotate-half
# ----------------------------------------------------------------------------

def test_permutation_turns_interleaved_rope_into_rotate_half():
    """Rotating interleaved pairs of W x equals HF's rotate-half on (permuted W) x, at any position."""
    rng = np.random.default_rng(0)
    H, D, C, theta = 3, 8, 12, 10000.0
    w = rng.normal(size=(H * D, C))
    x = rng.normal(size=C)
    pos = 37
    inv = theta ** (-np.arange(0, D, 2) / D)                              # (D/2,)
    cos, sin = np.cos(pos * inv), np.sin(pos * inv)
    ours = ag.rope(ag.Tensor((w @ x).reshape(H, 1, D)), cos, sin).data[:, 0]  # (H, D)
    # Hugging Face: q * cat(cos, cos) + rotate_half(q) * cat(sin, sin)
    q = (hf.interleaved_to_halves(w, H) @ x).reshape(H, D)                # (H, D)
    half = np.concatenate([-q[:, D // 2:], q[:, :D // 2]], axis=1)
    theirs = q * np.concatenate([cos, cos]) + half * np.concatenate([sin, sin])
    np.testing.assert_allclose(hf.interleaved_to_halves(ours.reshape(H * D, 1), H)[:, 0],
                               theirs.reshape(-1), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(hf.halves_to_interleaved(hf.interleaved_to_halves(w, H), H), w)


# ----------------------------------------------------------------------------
# 1. Round trip through Hugging Face
# ----------------------------------------------------------------------------

def test_export_writes_a_folder_transformers_reads(exported, model_file):
    transformers = pytest.importorskip("transformers")
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= names
    model, tok, _ = checkpoint.load_model(model_file)
    cfg = transformers.AutoConfig.from_pretrained(exported)
    c = model.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.intermediate_size) == (
        c.vocab_size, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.ffn_dim)
    gen = transformers.GenerationConfig.from_pretrained(exported)
    assert gen.eos_token_id == tok.eot_id


def test_logits_agree_with_transformers_over_300_tokens(exported, model_file, text):
    transformers = pytest.importorskip("transformers")
    model, tok, _ = checkpoint.load_model(model_file, dtype=np.float32)
    ids = tok.encode(text[:20000])[:300]
    assert len(ids) == 300
    theirs = transformers.LlamaForCausalLM.from_pretrained(exported, dtype="float32").eval()
    ref = hf_logits(theirs, ids)
    np.testing.assert_allclose(our_logits(model, ids), ref, rtol=0, atol=1e-4)

    # The comparison would catch a RoPE layout mistake: without the permutation,
    # position 0 still agrees (angle 0) and later positions do not.
    torch = pytest.importorskip("torch")
    state = {k: v.clone() for k, v in theirs.state_dict().items()}
    with torch.no_grad():
        for i in range(model.config.n_layers):
            for proj, heads in (("q_proj", model.config.n_heads), ("k_proj", model.config.n_kv_heads)):
                key = f"model.layers.{i}.self_attn.{proj}.weight"
                w = hf.halves_to_interleaved(state[key].numpy(), heads)   # undo the export's permutation
                theirs.get_submodule(f"model.layers.{i}.self_attn.{proj}").weight.copy_(torch.from_numpy(w))
    wrong = hf_logits(theirs, ids)
    err = np.abs(wrong - ref).max(axis=-1)                                 # (n,)
    assert err[0] < 1e-4
    assert err[20:].max() > 1e-2


def test_head_ablation_agrees_with_transformers(exported, model_file):
    """Lesson 11's ablation, checked independently: ZeroAblate(layer, head) gives the losses of
    LlamaForCausalLM with that head's input columns of o_proj set to zero."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from glassllm.trace import Tracer, ZeroAblate

    model, _, _ = checkpoint.load_model(model_file, dtype=np.float32)
    c = model.config
    layer, head = min(1, c.n_layers - 1), min(3, c.n_heads - 1)        # lesson 11's strongest induction head
    first = np.random.default_rng(0).integers(256, min(1023, c.vocab_size), size=(8, 40))
    rows = np.concatenate([first, first], axis=1)                       # (8, 80): each sequence twice

    def second_copy(logits):                                            # (8, 79, V) -> mean loss on the 2nd copy
        logp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
        return -np.take_along_axis(logp, rows[:, 1:, None], axis=-1)[:, 40:, 0].mean()

    with ag.no_grad(), Tracer(model, names="logits", interventions=[ZeroAblate(layer, head)]):
        ours = second_copy(model(rows[:, :-1]).data.astype(np.float64))
    with ag.no_grad():
        intact = second_copy(model(rows[:, :-1]).data.astype(np.float64))
    theirs_model = transformers.LlamaForCausalLM.from_pretrained(exported, dtype="float32").eval()
    D = c.head_dim
    with torch.no_grad():
        theirs_model.model.layers[layer].self_attn.o_proj.weight[:, head * D:(head + 1) * D] = 0
        theirs = second_copy(theirs_model(torch.tensor(rows[:, :-1])).logits.double().numpy())
    assert ours == pytest.approx(theirs, abs=1e-4)
    if model_file == checkpoint.bundled_model_path():                    # the lesson's claim, by Transformers
        assert theirs - intact > 0.3


def test_autotokenizer_gives_our_ids(exported, model_file, text):
    transformers = pytest.importorskip("transformers")
    _, tok, _ = checkpoint.load_model(model_file)
    auto = transformers.AutoTokenizer.from_pretrained(exported)
    ours = tok.encode(text, allowed_special="all")
    theirs = auto(text, add_special_tokens=True)["input_ids"]
    assert theirs == ours
    assert auto.eos_token_id == tok.eot_id
    sample = ours[:2000]
    assert auto.decode(sample) == tok.decode(sample)


def test_greedy_generation_matches_transformers(exported, model_file, text):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    model, tok, _ = checkpoint.load_model(model_file, dtype=np.float32)
    prompt = tok.encode(text[:2000])[:16]
    # Ours: greedy decoding through the KV cache, one token at a time.
    ours = []
    with ag.no_grad():
        cache = model.new_cache(1)
        logits = model(np.asarray([prompt]), cache).data[0, -1]
        for _ in range(100):
            nxt = int(np.argmax(logits))
            ours.append(nxt)
            logits = model(np.asarray([[nxt]]), cache).data[0, -1]
    theirs_model = transformers.LlamaForCausalLM.from_pretrained(exported, dtype="float32").eval()
    # generate() stops at the end-of-text token; greedy decoding past it is the same
    # computation restarted on everything so far, which is what the loop does.
    config = transformers.GenerationConfig(do_sample=False, eos_token_id=tok.eot_id, pad_token_id=tok.eot_id)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: extra threads only spin, for seconds on a busy machine
    try:
        seq = torch.tensor([prompt])
        with torch.no_grad():
            while seq.shape[1] < len(prompt) + 100:
                config.max_new_tokens = len(prompt) + 100 - seq.shape[1]
                seq = theirs_model.generate(seq, generation_config=config, attention_mask=torch.ones_like(seq))
    finally:
        torch.set_num_threads(threads)
    assert seq[0, len(prompt):].tolist() == ours


# ----------------------------------------------------------------------------
# 2. Import: a random Llama of another shape
# ----------------------------------------------------------------------------

def _random_llama(torch, transformers, vocab: int = 500, tied: bool = False, seed: int = 0):
    """A LlamaForCausalLM unlike ours: width 96, 3 layers, 6 query heads sharing 2 K/V heads."""
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=96, intermediate_size=200, num_hidden_layers=3,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=5000.0, tie_word_embeddings=tied,
        bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # weights large enough for sharp, position-dependent attention
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
    return model


def _save_hf(model, tok: Tokenizer, folder: Path) -> Path:
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_to_hf(tok)), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def tok500():
    return Tokenizer.train(["\n".join(generated_stories(300, seed=7))], vocab_size=500)


def test_import_random_llama_of_another_shape(tmp_path, tok500):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    theirs = _random_llama(torch, transformers)
    folder = _save_hf(theirs, tok500, tmp_path / "hf")
    out = tmp_path / "imported.safetensors"
    assert cli.main(["import-hf", str(folder), str(out)]) == 0

    model, tok, _ = checkpoint.load_model(out)
    c = model.config
    assert (c.vocab_size, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.ffn_dim, c.rope_theta) == (
        500, 96, 3, 6, 2, 200, 5000.0)
    assert tok.to_json() == tok500.to_json()
    ids = tok.encode(" ".join(generated_stories(30, seed=9)))[:200]
    ref = hf_logits(theirs, ids)
    np.testing.assert_allclose(our_logits(model, ids), ref, rtol=0, atol=1e-4 * max(1.0, np.abs(ref).max() / 10))

    # The imported file works in the glass box: greedy generation equals transformers', and it traces.
    generate = pytest.importorskip("glassllm.generate")
    ours_ids = [t.id for t in generate.generate(model, None, ids[:12], max_new_tokens=20, temperature=0.0)]
    with torch.no_grad():
        seq = theirs.generate(torch.tensor([ids[:12]]), max_new_tokens=20, min_new_tokens=20, do_sample=False,
                              eos_token_id=None, pad_token_id=0, attention_mask=torch.ones(1, 12))
    assert seq[0, 12:].tolist() == ours_ids
    trace = pytest.importorskip("glassllm.trace")
    t = trace.trace(model, ids[:12], names=["layers.2.attn.softmax", "logits"])
    assert t.get("layers.2.attn.softmax").shape == (6, 12, 12)
    np.testing.assert_allclose(t.get("logits"), ref[:12], rtol=0, atol=1e-4 * max(1.0, np.abs(ref).max() / 10))

    # Import then export gives back the same tensors.
    back = tmp_path / "back"
    assert cli.main(["export", str(out), "--format", "hf", str(back)]) == 0
    exported = hf.read_safetensors_dir(back)
    original = {k: v.numpy() for k, v in theirs.state_dict().items()}
    assert set(exported) == set(original)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)


def test_a_tied_head_is_imported_tied_and_equals_transformers_in_logits_and_gradients(tmp_path, tok500, capsys):
    """tie_word_embeddings: the model file holds the embedding once (no output.weight), the model uses one
    parameter twice, and its gradient is the sum of both uses: transformers' gradient of its tied matrix."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    theirs = _random_llama(torch, transformers, tied=True, seed=1)
    folder = _save_hf(theirs, tok500, tmp_path / "hf")
    out = tmp_path / "m.safetensors"
    assert cli.main(["import", str(folder), str(out)]) == 0
    assert "output head tied to the embedding (stored once)" in capsys.readouterr().out
    header, meta = checkpoint.read_header(out)
    assert "output.weight" not in header and "tok_embeddings.weight" in header
    assert json.loads(meta["config"])["tie_embeddings"] is True
    untied = sum(np.prod(s) for s in ModelConfig(**{**json.loads(meta["config"]), "tie_embeddings": False})
                 .param_shapes().values())
    assert sum(np.prod(i["shape"]) for i in header.values()) == untied - 500 * 96    # the embedding, once

    model, _, _ = checkpoint.load_model(out, dtype=np.float64)
    assert model.config.tie_embeddings and model.output.weight is model.tok_embeddings.weight
    assert "output.weight" not in model.state_dict()
    assert model.num_params() == model.config.n_params == sum(p.numel() for p in theirs.parameters())
    ids = tok500.encode(generated_stories(2, seed=3)[0])[:65]
    theirs = theirs.double()          # (its RoPE angles stay float32, transformers' choice: 1e-6 apart)
    ref_logits = hf_logits(theirs, ids)
    np.testing.assert_allclose(our_logits(model, ids), ref_logits, rtol=0, atol=1e-5 * np.abs(ref_logits).max())

    # Gradients of the mean next-token loss, parameter for parameter (our names mapped to theirs).
    loss = model.loss(np.array([ids[:-1]]), np.array([ids[1:]]))
    loss.backward()
    ref = torch.nn.functional.cross_entropy(theirs(torch.tensor([ids[:-1]])).logits[0], torch.tensor(ids[1:]))
    ref.backward()
    np.testing.assert_allclose(loss.data, ref.item(), rtol=1e-6)
    ours = hf.to_hf_state({name: p.grad for name, p in model.named_parameters()}, model.config)
    their_grads = {name: p.grad.numpy() for name, p in theirs.named_parameters()}
    assert set(ours) == set(their_grads) and "lm_head.weight" not in ours
    for name, g in their_grads.items():
        np.testing.assert_allclose(ours[name], g, rtol=0, atol=1e-5 * np.abs(g).max(), err_msg=name)
    # The shared matrix's gradient is the sum of its two uses: untie a copy and add its two gradients.
    untied = copy.deepcopy(theirs)
    untied.lm_head.weight = torch.nn.Parameter(untied.model.embed_tokens.weight.detach().clone())
    untied.zero_grad()
    torch.nn.functional.cross_entropy(untied(torch.tensor([ids[:-1]])).logits[0], torch.tensor(ids[1:])).backward()
    as_input, as_head = untied.model.embed_tokens.weight.grad.numpy(), untied.lm_head.weight.grad.numpy()
    assert np.abs(as_input).max() > 0 and np.abs(as_head).max() > 0
    np.testing.assert_allclose(their_grads["model.embed_tokens.weight"], as_input + as_head, rtol=0, atol=1e-14)


def test_a_tied_model_exports_tied_and_comes_back_the_same(tmp_path, tok500):
    """Export writes tie_word_embeddings true and no lm_head; transformers loads it to the same logits,
    and importing it again gives the same model file tensors."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    theirs = _random_llama(torch, transformers, tied=True, seed=2)
    folder = _save_hf(theirs, tok500, tmp_path / "hf")
    first = tmp_path / "first.safetensors"
    hf.import_hf(folder, first)
    back = tmp_path / "back"
    assert cli.main(["export", str(first), "--format", "hf", str(back)]) == 0
    assert json.loads((back / "config.json").read_text())["tie_word_embeddings"] is True
    exported = hf.read_safetensors_dir(back)
    assert "lm_head.weight" not in exported
    original = {k: v.numpy() for k, v in theirs.state_dict().items() if k != "lm_head.weight"}
    assert set(exported) == set(original)
    for key, value in original.items():
        np.testing.assert_array_equal(exported[key], value, err_msg=key)
    reloaded = transformers.LlamaForCausalLM.from_pretrained(back).eval()
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight
    ids = tok500.encode(generated_stories(1, seed=5)[0])[:48]
    np.testing.assert_array_equal(hf_logits(reloaded, ids), hf_logits(theirs, ids))
    second = tmp_path / "second.safetensors"
    hf.import_hf(back, second)
    a, b = checkpoint.load_model(first)[0].state_dict(), checkpoint.load_model(second)[0].state_dict()
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_tied_checkpoint_whose_lm_head_differs_is_refused(tmp_path, tok500):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    theirs = _random_llama(torch, transformers, seed=6)                 # untied: lm_head differs
    folder = _save_hf(theirs, tok500, tmp_path / "hf")
    doc = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**doc, "tie_word_embeddings": True}))
    with pytest.raises(ValueError, match="tie_word_embeddings.*lm_head.weight equal to"):
        hf.import_hf(folder, tmp_path / "m.safetensors")
    assert not (tmp_path / "m.safetensors").exists()


def test_import_reads_bfloat16_weights(tmp_path, tok500):
    """Checkpoints are often saved in bfloat16: widened exactly to float32 on import."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    theirs = _random_llama(torch, transformers, seed=4).to(torch.bfloat16)
    folder = _save_hf(theirs, tok500, tmp_path / "hf")
    assert json.loads((folder / "config.json").read_text()).get("dtype") == "bfloat16"
    model, _, _ = hf.import_hf(folder, tmp_path / "m.safetensors")
    # The reference: a float32 model holding the bfloat16 values (casting the bfloat16 model back
    # would also round its RoPE frequency buffer, which is not part of the checkpoint).
    ref_model = _random_llama(torch, transformers, seed=4)
    ref_model.load_state_dict({k: v.float() for k, v in theirs.state_dict().items()})
    theirs = ref_model
    np.testing.assert_array_equal(model.tok_embeddings.weight.data, theirs.model.embed_tokens.weight.detach().numpy())
    ids = tok500.encode(generated_stories(1, seed=8)[0])[:64]
    np.testing.assert_allclose(our_logits(model, ids), hf_logits(theirs, ids), rtol=0, atol=2e-4)


def test_import_renumbers_a_vocabulary_in_another_order(tmp_path, tok500):
    """A tokenizer.json whose ids are shuffled: the tokens and the embedding rows are renumbered together."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    theirs = _random_llama(torch, transformers, seed=2)
    V = tok500.vocab_size
    sigma = np.random.default_rng(5).permutation(V)                     # our id -> their id
    doc = tokenizer_to_hf(tok500)
    doc["model"]["vocab"] = {s: int(sigma[i]) for s, i in doc["model"]["vocab"].items()}
    for t in doc["added_tokens"]:
        t["id"] = int(sigma[t["id"]])
    folder = tmp_path / "hf"
    theirs.save_pretrained(folder, safe_serialization=True)
    (folder / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")

    model, tok, perm = hf.import_hf(folder, tmp_path / "m.safetensors")
    np.testing.assert_array_equal(perm, sigma)
    text = " ".join(generated_stories(20, seed=4))
    ids = tok.encode(text)[:150]
    assert ids == tok500.encode(text)[:150]
    # The tokenizers library reads the shuffled file and gives their ids for the same tokens.
    tokenizers = pytest.importorskip("tokenizers")
    their_ids = tokenizers.Tokenizer.from_str(json.dumps(doc)).encode(text).ids[:150]
    assert their_ids == sigma[ids].tolist()
    ref = hf_logits(theirs, their_ids)[:, sigma]                          # columns in our id order
    np.testing.assert_allclose(our_logits(model, ids), ref, rtol=0, atol=2e-4)


# ----------------------------------------------------------------------------
# 4. Bad inputs: one clear line, exit code 2
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_folder(tmp_path_factory, tok500):
    """A valid HF folder written by our own export (needs neither torch nor transformers)."""
    c = ModelConfig(vocab_size=500, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
    base = tmp_path_factory.mktemp("good")
    checkpoint.save_model(base / "m.safetensors", Transformer(c, seed=0), tok500)
    return hf.export_hf(base / "m.safetensors", base / "hf")


def _copy(folder: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "case"
    shutil.copytree(folder, dst)
    return dst


def _edit_json(path: Path, **changes) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


def test_good_folder_imports_without_transformers(good_folder, tmp_path):
    model, tok, perm = hf.import_hf(good_folder, tmp_path / "m.safetensors")
    np.testing.assert_array_equal(perm, np.arange(500))
    again, _, _ = checkpoint.load_model(tmp_path / "m.safetensors")
    np.testing.assert_array_equal(again.layers[0].attention.wq.weight.data, model.layers[0].attention.wq.weight.data)


def _config_case(**changes):
    return lambda d: _edit_json(d / "config.json", **changes)


def _remove(name):
    return lambda d: (d / name).unlink()


def _add_bias(d: Path):
    from safetensors.numpy import load_file, save_file
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(32, np.float32)
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})


def _pickled_only(d: Path):
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"not read")


def _smaller_vocab(d: Path):
    _edit_json(d / "config.json", vocab_size=600)


def _wordpiece(d: Path):
    doc = json.loads((d / "tokenizer.json").read_text())
    doc["model"]["type"] = "WordPiece"
    (d / "tokenizer.json").write_text(json.dumps(doc))


def _tokenizer_case(edit):
    def mutate(d: Path):
        doc = json.loads((d / "tokenizer.json").read_text())
        edit(doc)
        (d / "tokenizer.json").write_text(json.dumps(doc))
    return mutate


def _first_vocab_id(value):
    def edit(doc):
        token = next(iter(doc["model"]["vocab"]))
        doc["model"]["vocab"][token] = value
    return edit


@pytest.mark.parametrize("mutate, needle", [
    (_remove("config.json"), "no config.json"),
    (_config_case(model_type="gpt2", architectures=["GPT2LMHeadModel"]), "model_type='gpt2'"),
    (_remove("tokenizer.json"), "no tokenizer.json"),
    (_smaller_vocab, "vocab_size=600"),
    (_config_case(attention_bias=True), "attention_bias=True"),
    (_config_case(mlp_bias=True), "mlp_bias=True"),
    (_config_case(head_dim=16), "head_dim=16"),
    (_config_case(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_scaling="),
    (_config_case(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}),
     "rope_parameters.rope_type='llama3'"),
    (_config_case(hidden_act="gelu"), "hidden_act='gelu'"),
    (_add_bias, "'model.layers.0.self_attn.q_proj.bias'"),
    (_pickled_only, "pickled"),
    (_remove("model.safetensors"), "no model.safetensors"),
    (_wordpiece, "model.type='WordPiece'"),
    (_config_case(tie_word_embeddings="false"), "tie_word_embeddings='false'"),
    (_config_case(num_key_value_heads=0), "n_kv_heads must be >= 1, got 0"),
    (_tokenizer_case(lambda doc: doc.update(decoder=["ByteLevel"])), "decoder='list'"),
    (_tokenizer_case(lambda doc: doc.update(post_processor="ByteLevel")), "post_processor='str'"),
    (_tokenizer_case(lambda doc: doc.update(added_tokens={"id": 5})), "added_tokens='dict'"),
    (_tokenizer_case(_first_vocab_id("x")), "='x' is not supported; expected an int id"),
    (_config_case(hidden_size="32"), "hidden_size='32' is not supported; expected an int >= 1"),
    (_config_case(num_attention_heads=4.0), "num_attention_heads=4.0 is not supported; expected an int >= 1"),
    (_config_case(rope_parameters="default"), "rope_parameters='default' is not supported; expected an object"),
], ids=["no-config", "not-llama", "no-tokenizer", "vocab-mismatch", "attention-bias", "mlp-bias",
        "head-dim", "rope-scaling", "rope-type", "activation", "bias-tensor", "pickle", "no-weights",
        "wordpiece", "tied-as-text", "no-kv-heads", "decoder-list", "post-processor-str", "added-dict",
        "vocab-id-str", "width-as-text", "heads-as-float", "rope-parameters-str"])
def test_bad_folders_get_one_clear_line(good_folder, tmp_path, capsys, mutate, needle):
    case = _copy(good_folder, tmp_path)
    mutate(case)
    with pytest.raises(ValueError, match=None) as info:
        hf.import_hf(case, tmp_path / "out.safetensors")
    assert needle in str(info.value)
    assert "\n" not in str(info.value)
    assert cli.main(["import-hf", str(case), str(tmp_path / "out.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("glassllm import-hf: error:") and needle in err and "\n" not in err
    assert not (tmp_path / "out.safetensors").exists()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_export_then_import_keeps_every_bit_and_the_precision(tmp_path, tok500, dtype, capsys):
    """A float64 model comes back float64 (it used to be narrowed to float32 without a word)."""
    c = ModelConfig(vocab_size=500, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
    model = randomize(Transformer(c, seed=0, dtype=dtype), np.random.default_rng(9))
    checkpoint.save_model(tmp_path / "m.safetensors", model, tok500)
    assert cli.main(["export", str(tmp_path / "m.safetensors"), str(tmp_path / "hf")]) == 0
    assert cli.main(["import-hf", str(tmp_path / "hf"), str(tmp_path / "back.safetensors")]) == 0
    assert f"{np.dtype(dtype).name} parameters" in capsys.readouterr().out
    back, _, _ = checkpoint.load_model(tmp_path / "back.safetensors")
    assert back.dtype == dtype
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[key], value, err_msg=key)
    narrowed, _, _ = hf.import_hf(tmp_path / "hf", tmp_path / "narrow.safetensors", dtype=np.float32)
    assert narrowed.dtype == np.float32                                 # asked for, it narrows


def test_integer_norm_eps_and_theta_are_written_as_floats_transformers_accepts(tmp_path, tok500):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    c = ModelConfig(vocab_size=500, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64,
                    norm_eps=1, rope_theta=10000)
    checkpoint.save_model(tmp_path / "m.safetensors", Transformer(c, seed=0), tok500)
    folder = hf.export_hf(tmp_path / "m.safetensors", tmp_path / "hf")
    doc = json.loads((folder / "config.json").read_text())
    assert isinstance(doc["rms_norm_eps"], float) and isinstance(doc["rope_theta"], float)
    theirs = transformers.LlamaForCausalLM.from_pretrained(folder)
    assert theirs.config.rms_norm_eps == 1.0


def test_import_of_a_file_not_a_folder(tmp_path, capsys):
    f = tmp_path / "x.txt"
    f.write_text("hello")
    assert cli.main(["import-hf", str(f), str(tmp_path / "o.safetensors")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_export_of_a_non_model_file(tmp_path, capsys):
    f = tmp_path / "x.safetensors"
    f.write_bytes(b"\x00" * 16)
    assert cli.main(["export", str(f), "--format", "hf", str(tmp_path / "o")]) == 2
    assert "not a glassllm model file" in capsys.readouterr().err


def test_the_word_bundled_names_the_bundled_model_wherever_a_model_file_is_taken(exported, tmp_path, capsys):
    bundled = checkpoint.bundled_model_path()
    if not bundled.exists():
        pytest.skip("this installation has no bundled model")
    out = tmp_path / "hf"
    assert cli.main(["export", "bundled", "--format", "hf", str(out)]) == 0
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (out / name).read_bytes() == (exported / name).read_bytes(), name
    capsys.readouterr()
    args = ["generate", "Once upon a time", "--max-new-tokens", "5", "--seed", "0"]
    assert cli.main(args) == 0
    default = capsys.readouterr().out
    assert cli.main(args + ["--model", "bundled"]) == 0
    assert capsys.readouterr().out == default


def test_import_hf_says_it_reads_folders_only(capsys):
    """import-hf, the older name, reads Hugging Face folders alone: its help offers nothing else."""
    with pytest.raises(SystemExit):
        cli.main(["import-hf", "--help"])
    older = capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["import", "--help"])
    newer = capsys.readouterr().out
    assert "--tokenizer" in newer and "--tokenizer" not in older
    assert "a Hugging Face Llama folder (glassllm import also reads .gguf" in " ".join(older.split())


def test_a_byte_level_tokenizer_saved_by_transformers_imports(good_folder, tmp_path):
    """transformers saves a byte-level tokenizer with a post-processor that adds nothing (TemplateProcessing of
    the text alone): it imports, and encodes as the tokenizers library does; a template adding a token does not."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    case = _copy(good_folder, tmp_path)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(case / "tokenizer.json"))
    fast.save_pretrained(case)
    doc = json.loads((case / "tokenizer.json").read_text())
    if (doc.get("post_processor") or {}).get("type") != "TemplateProcessing":
        pytest.skip(f"this transformers saves post_processor={doc.get('post_processor')!r}")
    _, tok, perm = hf.import_hf(case, tmp_path / "m.safetensors")
    text = " ".join(generated_stories(5, seed=6)) + " 12 345  \n\n  end"
    theirs = tokenizers.Tokenizer.from_str(json.dumps(doc)).encode(text).ids
    assert perm[tok.encode(text)].tolist() == theirs
    doc["post_processor"]["single"].insert(0, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}})
    (case / "tokenizer.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"post_processor.single=.* is not supported; expected \[\$A\] alone"):
        hf.import_hf(case, tmp_path / "m2.safetensors")
