"""The PyTorch twin (glassllm.torch) against glassllm itself, and its DDP trainer.

- logits and every parameter gradient equal glassllm's on the same weights (float64);
- its model files are glassllm model files: they load with checkpoint.load_model
  and run through glassllm's forward and tracer;
- its trainer takes the same steps as ``glassllm.train`` (same init, batches, AdamW,
  schedule, clipping), and its training state resumes in ``glassllm.train``;
- two ``torchrun`` processes (gloo, CPU) reach the same weights as one process
  with the same global batch.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from glassllm import autograd as ag  # noqa: E402
from glassllm import checkpoint  # noqa: E402
from glassllm.config import ModelConfig  # noqa: E402
from glassllm.nn import Transformer as GlassTransformer  # noqa: E402
from glassllm.tokenizer import Tokenizer  # noqa: E402
from glassllm.torch import Transformer, from_glassllm, load_model, save_model, to_glassllm  # noqa: E402
from glassllm.torch import train_ddp  # noqa: E402
from glassllm.train import TrainConfig, Trainer  # noqa: E402

CONFIG = ModelConfig(vocab_size=300, dim=48, n_layers=2, n_heads=6, n_kv_heads=2, ffn_dim=96, max_seq_len=64)


def _scaled_glass(config: ModelConfig, seed: int, dtype=np.float64) -> GlassTransformer:
    """glassllm's init with weights 8x larger, so attention is sharp and RoPE matters."""
    model = GlassTransformer(config, seed=seed, dtype=dtype)
    rng = np.random.default_rng(seed + 100)
    for name, p in model.named_parameters():
        if p.data.ndim == 2:
            p.data = p.data * 8
        else:
            p.data = (1 + 0.3 * rng.normal(size=p.shape)).astype(dtype)
    return model


def _stories(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "dog", "sat", "ran", "on", "a", "mat", "big", "red", "sun", "and", "was", "happy",
             "Lily", "Tom", "park", "ball", "tree", "played"]
    return "\n<|endoftext|>\n".join(" ".join(rng.choice(words, size=rng.integers(20, 60))).capitalize() + "."
                                    for _ in range(n)) + "\n<|endoftext|>\n"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A text file and a tokenizer trained on it (vocab 300)."""
    folder = tmp_path_factory.mktemp("corpus")
    path = folder / "stories.txt"
    path.write_text(_stories(300, seed=0), encoding="utf-8")
    tok = Tokenizer.train([path], vocab_size=300)
    tok.save(folder / "tokenizer.json")
    return path, tok, folder / "tokenizer.json"


# ----------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------

def test_same_parameter_names_and_shapes():
    glass = GlassTransformer(CONFIG, seed=0)
    twin = Transformer(CONFIG)
    assert {k: tuple(v.shape) for k, v in twin.state_dict().items()} == \
        {k: v.shape for k, v in glass.state_dict().items()}


def test_logits_and_gradients_match_glassllm():
    glass = _scaled_glass(CONFIG, seed=1)
    twin = from_glassllm(glass)
    assert twin.tok_embeddings.weight.dtype == torch.float64
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, CONFIG.vocab_size, size=(3, 40))
    targets = rng.integers(0, CONFIG.vocab_size, size=(3, 40))

    ours = glass(tokens).data                                          # (B, n, V)
    theirs = twin(torch.from_numpy(tokens)).detach().numpy()
    np.testing.assert_allclose(theirs, ours, rtol=1e-10, atol=1e-10)

    _same_loss_and_gradients(glass, twin, tokens, targets)


def _same_loss_and_gradients(glass, twin, tokens, targets):
    """One backward of the mean cross-entropy in each: the same loss, and every parameter's gradient."""
    loss = glass.loss(tokens, targets)
    loss.backward()
    tloss = twin.loss(torch.from_numpy(tokens), torch.from_numpy(targets))
    tloss.backward()
    assert abs(tloss.item() - float(loss.data)) < 1e-10
    ours = dict(glass.named_parameters())
    for name, p in twin.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), ours[name].grad, rtol=1e-8, atol=1e-11, err_msg=name)


def test_a_tied_twin_holds_one_matrix_and_its_gradient_is_glassllms():
    """A tied head is one Parameter in both (PyTorch's tied module): logits and the shared matrix's
    gradient, the sum of its two uses, equal glassllm's; the crossing keeps it tied both ways."""
    config = ModelConfig(**{**CONFIG.to_dict(), "tie_embeddings": True})
    glass = _scaled_glass(config, seed=6)
    twin = from_glassllm(glass)
    assert twin.output.weight is twin.tok_embeddings.weight
    assert [n for n, _ in twin.named_parameters()] == [n for n, _ in glass.named_parameters()]
    assert sum(p.numel() for p in twin.parameters()) == glass.num_params() == config.n_params
    rng = np.random.default_rng(7)
    tokens, targets = rng.integers(0, config.vocab_size, size=(2, 40)), rng.integers(0, config.vocab_size, (2, 40))
    _same_loss_and_gradients(glass, twin, tokens, targets)
    back = to_glassllm(twin, dtype=np.float64)
    assert back.output.weight is back.tok_embeddings.weight
    assert set(back.state_dict()) == set(glass.state_dict()) and "output.weight" not in back.state_dict()
    np.testing.assert_array_equal(back.tok_embeddings.weight.data, glass.tok_embeddings.weight.data)


def test_a_tied_head_takes_pytorchs_adamw_steps():
    """The optimiser holds the tied matrix once: three AdamW steps of glassllm equal torch.optim.AdamW's."""
    from glassllm.optim import AdamW

    config = ModelConfig(**{**CONFIG.to_dict(), "tie_embeddings": True})
    glass = _scaled_glass(config, seed=8)
    twin = from_glassllm(glass)
    opt = AdamW(glass.named_parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    assert "output.weight" not in opt.params and "tok_embeddings.weight" in opt.params
    topt = torch.optim.AdamW([{"params": [p for p in twin.parameters() if p.ndim >= 2], "weight_decay": 0.1},
                              {"params": [p for p in twin.parameters() if p.ndim < 2], "weight_decay": 0.0}],
                             lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    rng = np.random.default_rng(9)
    for _ in range(3):
        tokens, targets = (rng.integers(0, config.vocab_size, size=(2, 24)) for _ in range(2))
        opt.zero_grad()
        glass.loss(tokens, targets).backward()
        opt.step()
        topt.zero_grad()
        twin.loss(torch.from_numpy(tokens), torch.from_numpy(targets)).backward()
        topt.step()
    assert glass.output.weight is glass.tok_embeddings.weight and twin.output.weight is twin.tok_embeddings.weight
    for name, p in twin.named_parameters():
        np.testing.assert_allclose(p.detach().numpy(), dict(glass.named_parameters())[name].data, rtol=1e-9,
                                   atol=1e-10, err_msg=name)


def test_float32_twin_matches_float32_glassllm():
    glass = _scaled_glass(CONFIG, seed=3, dtype=np.float32)
    twin = from_glassllm(glass)
    tokens = np.random.default_rng(4).integers(0, CONFIG.vocab_size, size=(2, 64))
    ref = _scaled_glass(CONFIG, seed=3, dtype=np.float64)(tokens).data
    np.testing.assert_allclose(twin(torch.from_numpy(tokens)).detach().numpy(), ref, rtol=0,
                               atol=1e-4 * np.abs(ref).max())


def test_model_file_round_trip_opens_in_the_glass_box(tmp_path, corpus):
    _, tok, _ = corpus
    glass = _scaled_glass(CONFIG, seed=5, dtype=np.float32)
    twin = from_glassllm(glass)
    path = tmp_path / "twin.safetensors"
    save_model(path, twin, tok, {"note": "from the twin"})
    model, tok2, meta = checkpoint.load_model(path)
    assert meta["note"] == "from the twin" and tok2.to_json() == tok.to_json()
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.data, dict(glass.named_parameters())[name].data)
    again, _, _ = load_model(path)
    np.testing.assert_array_equal(to_glassllm(again).output.weight.data, glass.output.weight.data)


def test_too_long_sequence_is_refused():
    twin = Transformer(CONFIG)
    with pytest.raises(ValueError, match="exceeds the context length 64"):
        twin(torch.zeros(1, 65, dtype=torch.long))


# ----------------------------------------------------------------------------
# The trainer
# ----------------------------------------------------------------------------

TRAIN = dict(steps=6, batch_size=4, seq_len=32, lr=3e-3, min_lr=3e-4, warmup_steps=2, weight_decay=0.1,
             grad_clip=0.5, seed=11, checkpoint_every=0, eval_every=0)


def _weights(path) -> dict[str, np.ndarray]:
    model, _, _ = checkpoint.load_model(path)
    return model.state_dict()


def test_one_process_trainer_takes_glassllm_train_steps(tmp_path, corpus):
    """Same config and data: the twin's run equals glassllm.train's, step for step (float64),
    repeated windows and short first windows included; either trainer resumes the other's run, and its own."""
    text, tok, _ = corpus
    config = TrainConfig(**TRAIN, dtype="float64", repeat_fraction=0.5, repeat_tokens="random",
                         short_steps=4, short_seq_len=16)
    mc = ModelConfig(vocab_size=300, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
    trainer = Trainer(config, mc, [text], tmp_path / "glass", tokenizer=tok, cache_dir=tmp_path / "cache",
                      progress=False)
    trainer.run()
    summary = train_ddp.run(config, mc, [text], tmp_path / "twin", tok, tmp_path / "cache", progress=False)
    assert summary["step"] == 6
    ours, theirs = _weights(tmp_path / "glass" / "model.safetensors"), _weights(tmp_path / "twin" / "model.safetensors")
    for name in ours:
        np.testing.assert_allclose(theirs[name], ours[name], rtol=1e-9, atol=1e-12, err_msg=name)

    # Same checkpoint format: glassllm.train resumes the twin's half-finished run.
    train_ddp.run(config, mc, [text], tmp_path / "half", tok, tmp_path / "cache", until=3, progress=False)
    resumed = Trainer.resume(tmp_path / "half", tmp_path / "cache", progress=False)
    assert resumed.step == 3
    resumed.run()
    half = _weights(tmp_path / "half" / "model.safetensors")
    for name in ours:
        np.testing.assert_allclose(half[name], ours[name], rtol=1e-9, atol=1e-12, err_msg=name)

    # The twin resumes its own half-finished run, in a fresh call with no options but the folder.
    train_ddp.run(config, mc, [text], tmp_path / "own", tok, tmp_path / "cache", until=3, progress=False)
    assert train_ddp.main(["--out", str(tmp_path / "own"), "--resume", "--no-progress"]) == 0
    own = _weights(tmp_path / "own" / "model.safetensors")
    for name in ours:
        np.testing.assert_allclose(own[name], theirs[name], rtol=0, atol=0, err_msg=name)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_ddp_equals_one_process(tmp_path, corpus):
    """torchrun, 2 processes, gloo: 20 steps give the weights of one process with the same global batch."""
    text, tok, tok_path = corpus
    opts = dict(TRAIN, steps=20, batch_size=8, short_steps=5, short_seq_len=16)
    mc = ModelConfig(vocab_size=300, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
    args = ["--data", str(text), "--tokenizer", str(tok_path), "--cache-dir", str(tmp_path / "cache"),
            "--no-progress", "--dim", "32", "--n-layers", "2", "--n-heads", "4", "--n-kv-heads", "2",
            "--ffn-dim", "64", "--max-seq-len", "64"]
    for key, value in opts.items():
        args += ["--" + key.replace("_", "-"), str(value)]

    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           "-m", "glassllm.torch.train_ddp", *args, "--out", str(tmp_path / "two")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "deprecated" not in done.stderr, done.stderr[-3000:]     # no FutureWarning per rank

    one = train_ddp.run(TrainConfig(**opts), mc, [text], tmp_path / "one", tok, tmp_path / "cache", progress=False)
    assert one["world_size"] == 1
    w1, w2 = _weights(tmp_path / "one" / "model.safetensors"), _weights(tmp_path / "two" / "model.safetensors")
    moved = 0.0
    for name in w1:
        np.testing.assert_allclose(w2[name], w1[name], rtol=1e-4, atol=2e-5, err_msg=name)
        moved = max(moved, float(np.abs(w1[name] - GlassTransformer(mc, seed=0).state_dict()[name]).max()))
    assert moved > 1e-3  # the runs trained (the comparison is not between two untouched inits)

    # The DDP checkpoint opens in the glass box: load, forward, trace.
    model, tok2, meta = checkpoint.load_model(tmp_path / "two" / "model.safetensors")
    assert meta["trainer"] == "glassllm.torch.train_ddp" and meta["step"] == "20"
    ids = tok2.encode("The cat sat on a mat and was happy.")
    twin, _, _ = load_model(tmp_path / "two" / "model.safetensors")
    with ag.no_grad():
        ours = model(np.asarray([ids])).data
    np.testing.assert_allclose(twin(torch.tensor([ids])).detach().numpy(), ours, rtol=0, atol=1e-4)
    trace_mod = pytest.importorskip("glassllm.trace")
    t = trace_mod.trace(model, ids, names=["layers.1.attn.softmax", "logits"])
    np.testing.assert_allclose(t.get("logits"), ours[0], rtol=0, atol=1e-5)
    assert t.get("layers.1.attn.softmax").shape == (4, len(ids), len(ids))


def test_trainer_bad_input_exits_2(tmp_path, corpus, capsys):
    text, _, tok_path = corpus
    base = ["--data", str(text), "--tokenizer", str(tok_path), "--out", str(tmp_path / "r"), "--no-progress"]
    assert train_ddp.main(base + ["--vocab-size", "512"]) == 2
    assert "--vocab-size 512 differs from the tokenizer's 300 ids" in capsys.readouterr().err
    assert train_ddp.main(base + ["--seq-len", "100", "--max-seq-len", "64"]) == 2
    assert "seq_len=100 exceeds the model's max_seq_len=64" in capsys.readouterr().err
    assert train_ddp.main(["--out", str(tmp_path / "nothing"), "--resume"]) == 2
    assert "cannot resume" in capsys.readouterr().err
