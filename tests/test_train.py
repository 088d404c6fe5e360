"""The training loop against a PyTorch twin, exact resume, atomic saves, evaluation, the CLI, the bundled model.

Every run here is tiny (a few thousand parameters, text made by the test), so
the file takes seconds; runs that must start fresh processes use subprocesses.
"""

from __future__ import annotations

import doctest
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from glassllm import checkpoint
from glassllm.cli import main
from glassllm.config import ModelConfig
from glassllm.nn import Transformer
from glassllm.data import WindowSampler
from glassllm.optim import AdamW
from glassllm.train import RECIPES, GradientThreads, TrainConfig, Trainer, evaluate, evaluate_text, train_step
from glassllm.tokenizer import Tokenizer
from tests.support.glassllm_testing import story_files

TINY = ModelConfig(vocab_size=300, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)


def make_stories(n: int, seed: int) -> str:
    """Story-like text in the shared files' layout (each story ends with an <|endoftext|> line)."""
    rng = np.random.default_rng(seed)
    names, things = ["Tom", "Lily", "Ben", "Mia", "Sam"], ["ball", "cat", "tree", "boat", "cake", "kite"]
    moods = ["happy", "sad", "sleepy", "excited"]
    stories = []
    for _ in range(n):
        a, b = rng.choice(names, 2, replace=False)
        t, m = rng.choice(things), rng.choice(moods)
        stories.append(f"Once upon a time, {a} had a {t}.\n{a} gave the {t} to {b}. {b} was {m}.\n"
                       f"They played with the {t} all day.")
    return "".join(s + "\n<|endoftext|>\n" for s in stories)


@pytest.fixture
def texts(tmp_path):
    return story_files(tmp_path, make_stories(200, 0), make_stories(20, 1))


# ----------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------

def test_default_config_and_the_bundled_recipe():
    c = TrainConfig()
    assert (c.batch_size, c.seq_len, c.grad_clip, c.weight_decay) == (16, 256, 1.0, 0.1)
    assert (c.repeat_fraction, c.short_steps) == (0.0, 0)                # plain text, full windows
    assert c.warmup == 100 and c.lr_at(0) == pytest.approx(c.lr / c.warmup) and c.lr_at(c.warmup) == c.lr
    assert TrainConfig.from_dict(json.loads(c.to_json())) == c
    assert RECIPES["default"] == c
    _, meta = checkpoint.read_header(checkpoint.bundled_model_path())   # the shipped model's own record
    if "base" in meta:                                                  # two stages: the second from the first
        assert TrainConfig.from_dict(json.loads(meta["train_config"])) == RECIPES["bundled-512"]
        assert TrainConfig.from_dict(json.loads(meta["base"])["train_config"]) == RECIPES["bundled"]
        assert meta["init_from"] == "bundled"
    else:
        assert TrainConfig.from_dict(json.loads(meta["train_config"])) == RECIPES["bundled"]


def test_cli_recipe_sets_defaults_that_options_override(texts, tmp_path):
    train, _ = texts
    out = tmp_path / "run"
    assert main(["train", "--data", str(train), "--out", str(out), "--recipe", "bundled", "--steps", "4",
                 "--short-steps", "2", "--batch-size", "2", "--seq-len", "64", "--vocab-size", "300",
                 "--dim", "32", "--n-layers", "1", "--n-heads", "2", "--n-kv-heads", "1", "--max-seq-len", "64",
                 "--no-progress"]) == 0
    _, meta = _state(out)
    config = TrainConfig.from_dict(json.loads(meta["train_config"]))
    bundled = RECIPES["bundled"]
    assert (config.repeat_fraction, config.repeat_tokens, config.short_seq_len) == \
        (bundled.repeat_fraction, bundled.repeat_tokens, bundled.short_seq_len)   # from the recipe
    assert (config.steps, config.short_steps, config.seq_len) == (4, 2, 64)        # given


def test_doctests():
    import importlib

    results = [doctest.testmod(importlib.import_module(f"glassllm.train.{m}"))
               for m in ("config", "step", "evaluate", "folder", "trainer")]
    assert sum(r.attempted for r in results) >= 3 and sum(r.failed for r in results) == 0


@pytest.mark.parametrize("n", [2, 3, 7])
def test_gradient_threads_give_the_gradient_of_the_whole_batch(n):
    """Rows shared out among n threads (5 rows: unequal shares, and for n = 7 idle threads): the summed
    gradient and the loss are the whole batch's, in float64 to rounding; weights set after the threads
    were made (by assignment, not in place) are the ones used."""
    model = Transformer(TINY, seed=3, dtype=np.float64)
    threads = GradientThreads(model, n)
    rng = np.random.default_rng(n)
    for ignored in (False, True):
        x = rng.integers(0, TINY.vocab_size, size=(5, 17))
        y = x[:, 1:].copy()
        if ignored:  # uncounted targets, unevenly spread: a share's weight is its share of counted targets
            y[0] = -100
            y[1, :4] = -100
        model.zero_grad()
        loss = model.loss(x[:, :-1], y)
        (loss * 0.5).backward()
        want = {name: p.grad.copy() for name, p in model.named_parameters()}
        model.zero_grad()
        got = threads.backward(x[:, :-1], y, scale=0.5)
        assert got == pytest.approx(float(loss.data), rel=1e-13)
        for name, p in model.named_parameters():
            np.testing.assert_allclose(p.grad, want[name], rtol=1e-11, atol=1e-15, err_msg=name)
        new = Transformer(TINY, seed=4, dtype=np.float64).state_dict()
        for name, p in model.named_parameters():
            p.data = new[name].copy()                                    # fresh arrays: the copies must follow
    threads.close()
    with pytest.raises(ValueError, match="workers must be >= 1, got 0"):
        GradientThreads(model, 0)


def test_short_first_windows_keep_the_tokens_per_step(texts, tmp_path):
    """Sequence-length warm-up: steps 0 .. short_steps-1 draw short windows, more of them."""
    train, _ = texts
    config = TrainConfig(steps=5, batch_size=2, seq_len=32, grad_accum=2, short_steps=3, short_seq_len=8,
                         warmup_steps=1, checkpoint_every=0, eval_every=0)
    model = ModelConfig(vocab_size=300, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=32)
    trainer = Trainer(config, model, [train], tmp_path / "run", progress=False)
    shapes, draw = [], trainer.sampler.next_batch

    def recording(*args):
        x, y = draw(*args)
        shapes.append(x.shape)
        return x, y

    trainer.sampler.next_batch = recording
    trainer.run()
    assert shapes[::2] == shapes[1::2] == [(8, 8)] * 3 + [(2, 32)] * 2      # two micro-batches per step
    assert trainer.tokens_seen == 5 * 2 * 2 * 32


@pytest.mark.parametrize("kwargs, match", [
    ({"steps": 0}, "steps must be >= 1"), ({"lr": -1.0}, "lr must be > 0"),
    ({"min_lr": 1.0}, "min_lr"), ({"beta2": 1.0}, "beta2"), ({"dtype": "float16"}, "dtype"),
    ({"grad_clip": -1.0}, "grad_clip"), ({"batch_size": 2.5}, "must be an int"),
    ({"lr": float("nan")}, "finite"), ({"repeat_fraction": -0.1}, r"repeat_fraction must be in \[0, 1\], got -0.1"),
    ({"repeat_fraction": "0.2"}, "repeat_fraction must be a finite number"),
    ({"repeat_tokens": "noise"}, "repeat_tokens must be one of text, random, got 'noise'"),
    ({"short_steps": 5, "short_seq_len": 256}, "short_seq_len must be below seq_len=256 and divide "
                                               "batch_size \\* seq_len = 4096, got 256"),
    ({"short_steps": 5, "short_seq_len": 48}, "got 48"), ({"short_steps": -1}, "short_steps must be >= 0"),
    ({"workers": 0}, "workers must be >= 1, got 0"),
])
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        TrainConfig(**kwargs)


# ----------------------------------------------------------------------------
# 1. Training parity with PyTorch
# ----------------------------------------------------------------------------

def _torch_lr(step, peak, warmup, total, floor):
    """The schedule written out again, independently of glassllm.optim."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (total - warmup))
    return floor + (peak - floor) * (1 + math.cos(math.pi * progress)) / 2


def test_training_matches_pytorch_for_20_steps(make_model):
    """AdamW + warm-up/cosine + clipping + accumulation of 2, float64: losses within 1e-8, then weights."""
    torch = pytest.importorskip("torch")
    from tests.support.torch_reference import TorchLlama

    config = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
    peak, floor, warmup, steps, clip, wd, accum = 1e-2, 1e-3, 5, 20, 1.0, 0.1, 2
    model = make_model(config, seed=3)                         # float64, trained-like weight scale
    ref = TorchLlama(config.to_dict())
    ref.load_glassllm_state(model.state_dict())

    opt = AdamW(model.named_parameters(), lr=peak, betas=(0.9, 0.95), eps=1e-8, weight_decay=wd)
    named = dict(ref.named_parameters())
    decay = [p for n, p in named.items() if p.ndim >= 2]
    no_decay = [p for n, p in named.items() if p.ndim < 2]
    assert len(no_decay) == 2 * config.n_layers + 1            # the RMSNorm gains
    topt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=peak, betas=(0.9, 0.95), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(topt, lambda s: _torch_lr(s, peak, warmup, steps, floor) / peak)

    ids = np.random.default_rng(0).integers(0, config.vocab_size, size=3000).astype(np.uint16)
    sampler = WindowSampler(ids, seq_len=16, batch_size=3, rng=np.random.default_rng(5))
    clipped = 0
    for step in range(steps):
        batches = [sampler.next_batch() for _ in range(accum)]
        loss, norm = train_step(model, opt, batches, _torch_lr(step, peak, warmup, steps, floor), clip, step + 1)

        topt.zero_grad()
        tloss = 0.0
        for x, y in batches:
            micro = ref.loss(x, y)
            (micro / accum).backward()
            tloss += micro.item() / accum
        tnorm = torch.nn.utils.clip_grad_norm_(ref.parameters(), clip).item()
        topt.step()
        sched.step()

        assert abs(loss - tloss) < 1e-8, f"step {step + 1}: loss {loss} vs torch {tloss}"
        assert norm == pytest.approx(tnorm, rel=1e-8)
        clipped += tnorm > clip
    assert clipped >= 3, f"clipping triggered only {clipped} times; the test needs it to act"
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.data, named[name].detach().numpy(), rtol=0, atol=1e-9, err_msg=name)


def test_non_finite_gradient_names_the_step_and_parameter(make_model):
    from glassllm import autograd as ag

    model = make_model(TINY, seed=0)
    opt = AdamW(model.named_parameters(), lr=1e-3)
    real_loss = model.loss

    def loss_with_bad_gradient(x, y):
        # sqrt at 0 is finite going forward, infinite going back: only norm.weight's gradient breaks.
        return real_loss(x, y) + ag.sqrt(model.norm.weight * 0.0).sum()

    model.loss = loss_with_bad_gradient
    before = model.norm.weight.data.copy()
    x = np.zeros((1, 4), dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"), \
            pytest.raises(ValueError, match=r"^step 7: non-finite gradient in norm\.weight"):
        train_step(model, opt, [(x, x)], 1e-3, 1.0, step=7)
    assert np.array_equal(model.norm.weight.data, before)     # no update happened

    model.loss = lambda x, y: real_loss(x, y) * float("inf")
    with pytest.raises(ValueError, match=r"^step 2: the loss is inf"):
        train_step(model, opt, [(x, x)], 1e-3, 1.0, step=2)


# ----------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, words", [
    (dict(batch_size=-1), "batch_size must be an int >= 1, got -1"),
    (dict(batch_size=0), "batch_size must be an int >= 1, got 0"),
    (dict(max_windows=-1), "max_windows must be an int >= 0, got -1"),
    (dict(seq_len=2.5), "seq_len must be an int >= 1, got 2.5"),
])
def test_evaluate_refuses_counts_that_would_give_a_wrong_loss(kwargs, words):
    """batch_size=-1 used to count only the last window; max_windows=-1 gave a negative token count."""
    model = Transformer(TINY, seed=0)
    tok = Tokenizer.train([make_stories(50, 0)], vocab_size=TINY.vocab_size)
    ids = np.random.default_rng(0).integers(0, TINY.vocab_size, 40)
    with pytest.raises(ValueError, match=words):
        evaluate(model, ids, tok, **{"seq_len": 8, **kwargs})
    with pytest.raises(TypeError, match="integer token ids"):
        evaluate(model, ids.astype(float), tok, seq_len=8)


def test_train_step_refuses_no_batches_and_a_nan_learning_rate():
    model = Transformer(TINY, seed=0)
    opt = AdamW(model.named_parameters())
    x = np.random.default_rng(0).integers(0, TINY.vocab_size, (2, 5))
    with pytest.raises(ValueError, match="at least one micro-batch"):
        train_step(model, opt, [], 1e-3, 1.0)
    before = {k: v.copy() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="learning rate must be a finite number >= 0, got nan"):
        train_step(model, opt, [(x, x)], float("nan"), 1.0)
    assert all(np.array_equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(TypeError, match="pass model.named_parameters"):
        AdamW(model.parameters())
    with pytest.raises(ValueError, match="betas must be two numbers"):
        AdamW(model.named_parameters(), betas=(0.9, 0.95, 0.99))


def test_settings_that_are_valid_but_odd_get_a_note(texts, tmp_path, capsys):
    train, _ = texts
    argv = ["train", "--data", str(train), "--out", str(tmp_path / "r"), "--steps", "2", "--warmup-steps", "5",
            "--workers", "3", "--batch-size", "2", "--seq-len", "16", "--vocab-size", "300", "--dim", "32",
            "--n-layers", "1", "--n-heads", "2", "--n-kv-heads", "1", "--no-progress"]
    assert main(argv) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("glassllm train: note:")]
    assert notes == ["glassllm train: note: --warmup-steps 5 is not below --steps 2: the learning rate never "
                     "reaches --lr 0.003",
                     "glassllm train: note: --workers 3 is more than --batch-size 2: 1 of them will have no rows "
                     "to work on"]


def test_a_stale_tokenizer_json_in_the_folder_is_replaced_by_the_runs(texts, tmp_path):
    train, _ = texts
    out = tmp_path / "run"
    out.mkdir()
    Tokenizer.train([make_stories(40, 9).upper()], vocab_size=300).save(out / "tokenizer.json")
    assert main(["train", "--data", str(train), "--out", str(out), *map(str, TINY_RUN)]) == 0
    _, tok, _ = checkpoint.load_model(out / "model.safetensors")
    assert Tokenizer.load(out / "tokenizer.json").to_json() == tok.to_json()


def test_empty_text_is_named_before_any_work(texts, tmp_path, capsys):
    train, _ = texts
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    for argv, words in ((["--data", str(empty)], "the training text is empty"),
                        (["--data", str(train), "--valid", str(empty)], "the held-out text is empty")):
        assert main(["train", *argv, "--out", str(tmp_path / "r"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert words in err and "empty.txt' has no bytes" in err and err.count("\n") == 1
        assert not (tmp_path / "r").exists()


def test_held_out_text_without_a_story_is_named_before_any_work(texts, tmp_path, capsys):
    """Bits per byte of text that holds no story's bytes would be made from nothing."""
    train, _ = texts
    seps = tmp_path / "seps.txt"
    seps.write_text("<|endoftext|>\n<|endoftext|>\n", encoding="utf-8")
    assert main(["train", "--data", str(train), "--valid", str(seps), "--out", str(tmp_path / "r"),
                 *map(str, TINY_RUN)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the held-out text holds no document to score" in err
    assert "give --valid text with at least one story" in err and not (tmp_path / "r").exists()


def test_eval_says_its_window_length(texts, tmp_path, capsys):
    """The loss depends on the window length, so the result line and the JSON say which one was used; by
    default the one the model was trained on (from its file), not 256."""
    train, valid = texts
    out = tmp_path / "run"
    assert main(["train", "--data", str(train), "--out", str(out), *map(str, TINY_RUN)]) == 0
    capsys.readouterr()
    assert main(["eval", "--model", str(out / "model.safetensors"), "--data", str(valid), "--seq-len", "8"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("[8-token windows]")
    assert main(["eval", "--model", str(out / "model.safetensors"), "--data", str(valid), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["seq_len"] == 16                    # as the model was trained


def test_a_trainer_takes_one_path_or_a_folder(texts, tmp_path):
    """As the command line does: a single path is not a list of one-letter names; a folder gives its *.txt."""
    train, valid = texts
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text(Path(train).read_text(encoding="utf-8"), encoding="utf-8")
    config = TrainConfig(steps=1, batch_size=2, seq_len=16, warmup_steps=1, checkpoint_every=0, eval_every=0)
    small = ModelConfig(vocab_size=300, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=32)
    one = Trainer(config, small, str(train), tmp_path / "r1", valid_files=str(valid), progress=False)
    assert one.train_files == [Path(train).resolve()] and one.valid_files == [Path(valid).resolve()]
    assert Trainer(config, small, [folder], tmp_path / "r2", progress=False).train_files == [(folder / "a.txt").resolve()]


def test_evaluate_matches_pytorch_and_counts_bytes(make_model, tmp_path):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from tests.support.torch_reference import TorchLlama

    text = make_stories(6, 9) + "Caf\u00e9 na\u00efve \u201cquotes\u201d.\n"
    tok = Tokenizer.train([make_stories(100, 2)], vocab_size=TINY.vocab_size)
    ids = tok.encode_corpus(text)
    T = 16
    assert (len(ids) - 1) % T != 0                              # there is a short last window
    model = make_model(TINY, seed=1)
    result = evaluate(model, ids, tok, seq_len=T, batch_size=3)

    ref = TorchLlama(TINY.to_dict())
    ref.load_glassllm_state(model.state_dict())
    nats = 0.0
    with torch.no_grad():
        for s in range(0, len(ids) - 1, T):
            window = ids[s:s + T + 1].astype(np.int64)
            logits = ref(window[None, :-1])[0]
            nats += F.cross_entropy(logits, torch.as_tensor(window[1:]), reduction="sum").item()
    # The stories' own bytes (the "\n<|endoftext|>\n" lines between them count none), all but the first token's.
    stories = text.split("\n<|endoftext|>\n")
    n_bytes = sum(len(s.encode("utf-8")) for s in stories) - len(tok.decode_bytes([int(ids[0])]))
    assert result.tokens == len(ids) - 1 and result.bytes == n_bytes
    assert result.windows == math.ceil((len(ids) - 1) / T)
    assert result.nats == pytest.approx(nats, rel=1e-10)
    assert result.loss == pytest.approx(nats / (len(ids) - 1), rel=1e-10)
    assert result.perplexity == pytest.approx(math.exp(nats / (len(ids) - 1)), rel=1e-10)
    assert result.bits_per_byte == pytest.approx(nats / (math.log(2) * n_bytes), rel=1e-10)

    # Only the first windows, and the same figures from text.
    head = evaluate(model, ids, tok, seq_len=T, batch_size=3, max_windows=2)
    assert head.tokens == 2 * T and head.windows == 2
    assert evaluate_text(model, tok, text, seq_len=T, batch_size=3) == result


# ----------------------------------------------------------------------------
# 2. Exact resume (fresh processes)
# ----------------------------------------------------------------------------

def _cli(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "glassllm.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"glassllm {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return proc


def _train_args(train, valid, out):
    return ["train", "--data", train, "--valid", valid, "--out", out, "--steps", 20, "--batch-size", 4,
            "--seq-len", 32, "--grad-accum", 2, "--warmup-steps", 3, "--lr", 1e-2, "--checkpoint-every", 4,
            "--eval-every", 5, "--eval-windows", 4, "--vocab-size", 300, "--dim", 32, "--n-layers", 2,
            "--n-heads", 4, "--n-kv-heads", 2, "--no-progress"]


def _state(folder):
    from safetensors import safe_open

    with safe_open(str(folder / "train_state.safetensors"), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


@pytest.mark.parametrize("extra", [(), ("--repeat-fraction", 0.5, "--repeat-tokens", "random"),
                                   ("--short-steps", 12, "--short-seq-len", 8), ("--workers", 2),
                                   ("--tie-embeddings", "true")],
                         ids=["plain", "repeated-windows", "short-windows-first", "two-workers", "tied-head"])
def test_resume_is_bit_identical(texts, tmp_path, extra):
    train, valid = texts
    straight, chunked = tmp_path / "straight", tmp_path / "chunked"
    _cli(*_train_args(train, valid, straight), *extra)
    _cli(*_train_args(train, valid, chunked), *extra, "--until", 10)
    assert _state(chunked)[1]["step"] == "10"
    _cli("train", "--out", chunked, "--resume", "--no-progress")        # a fresh process, no other options

    (a, meta_a), (b, meta_b) = _state(straight), _state(chunked)
    assert meta_a["step"] == meta_b["step"] == "20"
    assert sorted(a) == sorted(b) and any(k.startswith("adam_v/") for k in a)
    for key in a:                                                        # weights and both moments
        assert a[key].dtype == np.float32 and np.array_equal(a[key], b[key]), key
    assert ("param/output.weight" in a) == ("--tie-embeddings" not in extra)   # a tied head: one matrix
    drop = lambda rows: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]  # noqa: E731
    hist_a, hist_b = json.loads(meta_a["history"]), json.loads(meta_b["history"])
    assert len(hist_a) == 20 and drop(hist_a) == drop(hist_b)           # losses, norms, held-out: identical
    assert meta_a["sampler"] == meta_b["sampler"]
    # The inference files hold the same weights, and loss.csv has every step.
    ma, _, info = checkpoint.load_model(straight / "model.safetensors")
    mb, _, _ = checkpoint.load_model(chunked / "model.safetensors")
    assert all(np.array_equal(ma.state_dict()[k], mb.state_dict()[k]) for k in ma.state_dict())
    assert info["step"] == "20" and "valid_bits_per_byte" in info and info["command"].startswith("glassllm train")
    assert len((chunked / "loss.csv").read_text().splitlines()) == 21
    assert (chunked / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_refuses_changed_options_and_data(texts, tmp_path, capsys):
    train, valid = texts
    out = tmp_path / "run"
    assert main([str(a) for a in _train_args(train, valid, out)] + ["--until", "2"]) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--lr", "0.5", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--lr 0.5 differs from the resumed run's 0.01" in err
    assert main([str(a) for a in _train_args(train, valid, out)]) == 2          # the folder holds a run
    assert "add --resume" in capsys.readouterr().err
    train.write_text(make_stories(200, 0) + "One more.\n", encoding="utf-8")
    assert main(["train", "--out", str(out), "--resume", "--no-progress"]) == 2
    assert "changed since the run started" in capsys.readouterr().err


# ----------------------------------------------------------------------------
# 3. Atomic saves: kill a process in the middle of one
# ----------------------------------------------------------------------------

_KILL_SCRIPT = textwrap.dedent("""
    import builtins, os, sys, time
    from glassllm.config import ModelConfig
    from glassllm.train import Trainer, TrainConfig

    out, train, mode = sys.argv[1:4]
    config = TrainConfig(steps=10, batch_size=2, seq_len=16, warmup_steps=1, checkpoint_every=1, eval_every=0)
    model = ModelConfig(vocab_size=300, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=32)
    trainer = Trainer(config, model, [train], out, progress=False)
    trainer.run(until=2)                                  # checkpoint at steps 1 and 2

    def hang(what):
        print("IN_SAVE", what, flush=True)
        time.sleep(600)

    target = {"state-half": ".train_state.safetensors.", "model-half": ".model.safetensors."}.get(mode)
    real_open, real_replace = builtins.open, os.replace

    class HalfWriter:
        def __init__(self, f): self.f = f
        def __enter__(self): return self
        def __exit__(self, *exc): self.f.close()
        def write(self, data):                            # write half the bytes, then die here
            self.f.write(data[: len(data) // 2]); self.f.flush(); hang("write")

    def open_(file, mode_="r", *args, **kwargs):
        f = real_open(file, mode_, *args, **kwargs)
        name = os.path.basename(str(file))
        if target and "w" in mode_ and name.startswith(target) and name.endswith(".tmp"):
            return HalfWriter(f)
        return f

    def replace_(src, dst):
        if mode == "state-rename" and os.path.basename(str(dst)) == "train_state.safetensors":
            hang("rename")                                # the new file is complete but not in place
        return real_replace(src, dst)

    builtins.open, os.replace = open_, replace_
    trainer.run(until=3)
    print("NOT KILLED", flush=True)
""")


@pytest.mark.parametrize("mode, state_step", [("state-half", 2), ("state-rename", 2), ("model-half", 3)])
def test_kill_during_save_leaves_a_loadable_checkpoint(texts, tmp_path, mode, state_step):
    train, _ = texts
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(out), str(train), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("IN_SAVE"), f"child did not reach the save: {line!r} {proc.stderr.read()}"
        assert list(out.glob(".*.tmp")), "the kill should find a temporary file being written"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    # The training state is the last complete one, and it continues.
    resumed = Trainer.resume(out, progress=False)
    assert resumed.step == state_step
    resumed.run(until=state_step + 1)
    assert resumed.step == state_step + 1
    # The inference file from before the kill loads (it was never half-replaced).
    _, _, meta = checkpoint.load_model(out / "model.safetensors")
    assert int(meta["step"]) >= 2


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)])
def test_ctrl_c_saves_the_step_it_stops_at_and_the_run_resumes_bit_identically(texts, tmp_path, sig, code):
    """Ctrl-C (or SIGTERM) mid-run: the step in progress finishes, the run is saved there (no checkpoint was
    due: --checkpoint-every 0), the message says how to go on, and --resume ends where an unbroken run ends."""
    train, valid = texts
    args = ["train", "--data", str(train), "--valid", str(valid), "--steps", "300", "--batch-size", "2",
            "--seq-len", "16", "--vocab-size", "300", "--dim", "32", "--n-layers", "1", "--n-heads", "2",
            "--n-kv-heads", "1", "--checkpoint-every", "0", "--eval-every", "1", "--eval-windows", "1"]
    run = [sys.executable, "-c", "import sys; from glassllm.cli import main; sys.exit(main(sys.argv[1:]))"]
    out = tmp_path / "run"
    proc = subprocess.Popen(run + args + ["--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        seen = []
        while not any(line.startswith("step 2: ") for line in seen):    # training is under way
            line = proc.stderr.readline()
            assert line, "".join(seen)
            seen.append(line)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        err = "".join(seen) + err
    finally:
        proc.kill()
    assert proc.returncode == code, err
    m = re.search(r"interrupted at step (\d+) of 300: saved; continue with glassllm train --out \S+ --resume", err)
    assert m, err
    step = int(m.group(1))
    assert 0 < step < 300 and _state(out)[1]["step"] == str(step)
    assert "Traceback" not in err and not list(out.glob(".*.tmp"))
    _cli("train", "--out", out, "--resume", "--no-progress")
    straight = tmp_path / "straight"
    _cli(*args, "--out", straight, "--no-progress")
    (a, meta_a), (b, meta_b) = _state(straight), _state(out)
    assert meta_a["step"] == meta_b["step"] == "300"
    for key in a:
        assert np.array_equal(a[key], b[key]), key


# ----------------------------------------------------------------------------
# The CLI
# ----------------------------------------------------------------------------

def test_train_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    import dataclasses
    for field in dataclasses.fields(TrainConfig) + dataclasses.fields(ModelConfig):
        assert "--" + field.name.replace("_", "-") + " " in text, field.name
    for flag in ("--data", "--valid", "--out", "--resume", "--until", "--tokenizer", "--cache-dir", "--threads"):
        assert flag in text


@pytest.mark.parametrize("argv, match", [
    (["--lr", "-1"], "--lr must be > 0, got -1.0"),                      # the flag, not TrainConfig.lr
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--seq-len", "32", "--recipe", "bundled"], "--short-seq-len (set by --recipe bundled) must be below --seq-len 32"),
    (["--lr", "1e-6", "--recipe", "bundled"], "error: --min-lr must be in [0, lr=1e-06]"),   # not the recipe's
    (["--lr", "1e308"], "--lr=1e+308 is too large: the learning-rate schedule overflows"),     # not at step 2
    (["--seq-len", "600"], "seq_len=600 exceeds the model's max_seq_len=512"),
    (["--n-heads", "3"], "not divisible"),
    (["--data", "/no/such/file.txt"], "does not exist"),
    (["--data", "/dev/null"], "data path '/dev/null' is not a regular file or folder"),
])
def test_train_bad_input_is_one_line_exit_2(texts, tmp_path, capsys, argv, match):
    train, _ = texts
    args = ["train", "--data", str(train), "--out", str(tmp_path / "r"), "--no-progress"] + argv
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err and "Traceback" not in err


def test_a_yes_no_option_takes_true_or_false(texts, tmp_path, capsys):
    train, _ = texts
    with pytest.raises(SystemExit) as e:                                 # argparse's own refusal, exit 2
        main(["train", "--data", str(train), "--out", str(tmp_path / "r"), "--tie-embeddings", "yes"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "--tie-embeddings: expected true or false, got 'yes'" in err


def test_tokenizer_option_and_eval_command(texts, tmp_path, capsys):
    train, valid = texts
    tok = Tokenizer.train([train], vocab_size=280)
    tok.save(tmp_path / "tok.json")
    out = tmp_path / "run"
    assert main(["train", "--data", str(train), "--out", str(out), "--tokenizer", str(tmp_path / "tok.json"),
                 "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--dim", "32", "--n-layers", "1",
                 "--n-heads", "2", "--n-kv-heads", "1", "--no-progress"]) == 0
    model, loaded_tok, meta = checkpoint.load_model(out / "model.safetensors")
    assert loaded_tok.to_json() == tok.to_json() and model.config.vocab_size == 280
    assert model.config.ffn_dim == ModelConfig.llama_ffn_dim(32)       # follows --dim
    assert Tokenizer.load(out / "tokenizer.json").to_json() == tok.to_json()
    capsys.readouterr()
    assert main(["eval", "--model", str(out / "model.safetensors"), "--data", str(valid),
                 "--seq-len", "16", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    expected = evaluate_text(model, tok, str(valid), seq_len=16, from_start=True)   # after <|endoftext|> "\n"
    assert figures["loss"] == pytest.approx(expected.loss, rel=1e-6)
    assert figures["bytes"] == expected.bytes
    assert main(["eval", "--model", str(out / "model.safetensors"), "--data", str(valid), "--seq-len", "0"]) == 2


# ----------------------------------------------------------------------------
# 4. The bundled model
# ----------------------------------------------------------------------------

# A fixed slice of text written for this test. tools/finish_bundled.py evaluates the
# bundled model on the same text and records its SHA-256 and loss in the model file.
PROBE_TEXT = (
    "Once upon a time, there was a little dog named Max. Max liked to run in the park with his red ball.\n"
    "One day, Max saw a small bird on a tree. The bird was sad because it could not find its mom.\n"
    "Max said, \"Do not be sad. I will help you!\" They looked under the big tree and near the pond.\n"
    "At last, they found the mom bird. The little bird was so happy. Max wagged his tail and went home.\n"
    "<|endoftext|>\n"
)


def _bundled():
    path = checkpoint.bundled_model_path()
    if not path.exists():
        pytest.skip(f"the bundled model {path} is not there yet (tools/finish_bundled.py writes it "
                    "when the training run ends)")
    return path


def test_bundled_model_reproduces_its_recorded_probe_loss():
    path = _bundled()
    assert path.stat().st_size <= 8 * 1024 * 1024
    model, tok, meta = checkpoint.load_bundled()
    assert meta["probe_sha256"] == hashlib.sha256(PROBE_TEXT.encode("utf-8")).hexdigest(), \
        "the probe text here differs from the one tools/finish_bundled.py recorded"
    result = evaluate_text(model, tok, PROBE_TEXT)
    assert result.loss == pytest.approx(float(meta["probe_loss"]), rel=1e-5)
    # Bits per byte count the story's own bytes: not the "\n<|endoftext|>\n" after it, nor the first token's.
    ids = tok.encode_corpus(PROBE_TEXT)
    story = PROBE_TEXT[:-len("\n<|endoftext|>\n")].encode("utf-8")
    assert result.bytes == len(story) - len(tok.decode_bytes([int(ids[0])]))
    # The figure the file records, over the bytes it was recorded with (files made before bytes were counted
    # so recorded every predicted token's bytes, the separator's too, and no probe_bytes).
    recorded = int(meta.get("probe_bytes") or len(tok.decode_bytes(ids[1:])))
    assert result.nats / (math.log(2) * recorded) == pytest.approx(float(meta["probe_bits_per_byte"]), rel=1e-5)
    for key in ("command", "seed", "train_data_sha256", "tokens_seen", "wall_time_s", "valid_loss",
                "valid_bits_per_byte"):
        assert meta.get(key), key


def test_bundled_model_loads_without_network():
    _bundled()
    code = textwrap.dedent("""
        import socket
        def refuse(*a, **k):
            raise OSError("network used")
        socket.socket = refuse
        socket.create_connection = refuse
        from glassllm.checkpoint import load_bundled
        model, tok, meta = load_bundled()
        print(model(tok.encode("Once upon a time")).shape[-1])
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if "PROXY" not in k.upper()})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1024"


def test_bundled_card_matches_the_model_file():
    _bundled()
    card = (Path(checkpoint.bundled_model_path()).parent / "MODEL_CARD.md").read_text(encoding="utf-8")
    _, meta = checkpoint.read_header(checkpoint.bundled_model_path())
    for key in ("command", "probe_loss", "valid_loss", "valid_bits_per_byte", "seed"):
        assert meta[key] in card, key


# ----------------------------------------------------------------------------
# Data a run is given: what it refuses at the start, and what it records
# ----------------------------------------------------------------------------

TINY_RUN = ["--steps", 2, "--batch-size", 2, "--seq-len", 16, "--vocab-size", 300, "--dim", 32, "--n-layers", 1,
            "--n-heads", 2, "--n-kv-heads", 1, "--no-progress"]


def test_held_out_text_of_one_token_is_refused_before_training(texts, tmp_path, capsys):
    train, _ = texts
    (tmp_path / "one.txt").write_text("a", encoding="utf-8")
    code = main(["train", "--data", str(train), "--valid", str(tmp_path / "one.txt"), "--out", str(tmp_path / "r"),
                 *map(str, TINY_RUN)])
    err = capsys.readouterr().err
    assert code == 2 and "held-out text is 1 token long" in err and "at least 2" in err
    assert not (tmp_path / "r").exists()                                # refused before a step: no folder left


def test_a_refused_run_leaves_no_token_cache_behind(tmp_path, capsys):
    (tmp_path / "short.txt").write_text(make_stories(2, 0)[:120], encoding="utf-8")
    code = main(["train", "--data", str(tmp_path / "short.txt"), "--out", str(tmp_path / "r"), *map(str, TINY_RUN[:-1]),
                 "--seq-len", "64", "--no-progress"])
    assert code == 2, capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_model_file_names_each_data_file_by_its_whole_path(tmp_path, capsys):
    for sub, seed in (("a", 0), ("b", 1)):
        (tmp_path / "data" / sub).mkdir(parents=True)
        (tmp_path / "data" / sub / "train.txt").write_text(make_stories(60, seed), encoding="utf-8")
    assert main(["train", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "r"), *map(str, TINY_RUN)]) == 0
    _, _, meta = checkpoint.load_model(tmp_path / "r" / "model.safetensors")
    hashes = json.loads(meta["train_data_sha256"])
    want = {str((tmp_path / "data" / s / "train.txt").resolve()):
            hashlib.sha256((tmp_path / "data" / s / "train.txt").read_bytes()).hexdigest() for s in "ab"}
    assert hashes == want


def test_resume_checks_downloads_in_the_runs_own_cache(texts, tmp_path, monkeypatch, capsys):
    """A run that downloaded into OUT/cache looks there again on --resume (not in ~/.cache)."""
    import glassllm.commands.train as train_module

    train, _ = texts
    out = tmp_path / "r"
    assert main(["train", "--data", str(train), "--out", str(out), *map(str, TINY_RUN), "--until", "1"]) == 0
    seen = []
    real = train_module.resolve_sources

    def spy(sources, cache_dir=None, **kw):
        seen.append(cache_dir)
        return real(sources, cache_dir, **kw)

    monkeypatch.setattr(train_module, "resolve_sources", spy)
    assert main(["train", "--out", str(out), "--resume", "--data", str(train), "--no-progress"]) == 0
    assert seen == [out / "cache"]
