"""``glassllm train --init-from``: fine-tuning a model file keeps its tokenizer and architecture, resumes bit for
bit (on the bundled model and on an imported stories260K-shaped GGUF), records its timeline from step 0, and
lowers the held-out loss on the fine-tuning corpus as ``evaluate`` measures it before and after."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from glassllm import checkpoint
from tests.support.glassllm_testing import story_files, story_text
from glassllm.cli import main
from glassllm.timeline import load_timeline
from glassllm.train import RECIPES, evaluate_text


ROBOTS, PARTS = ["Zork", "Bleep", "Quix", "Vexa"], ["gear", "bolt", "wire", "lamp", "spring"]


def robot_stories(n: int, seed: int) -> str:
    """A corpus in the story-file layout whose stories are unlike TinyStories' (so fine-tuning has something to learn)."""
    rng = np.random.default_rng(seed)
    picks = zip(rng.choice(ROBOTS, n), rng.choice(PARTS, n), rng.choice(PARTS, n))
    return story_text(f"Robot {a} found a {p} on planet Krell.\n{a} fixed the {q} with the {p}. Beep boop, said {a}."
                      for a, p, q in picks)


@pytest.fixture
def corpus(tmp_path):
    return story_files(tmp_path, robot_stories(120, 0), robot_stories(12, 1), ("robots.txt", "robots-valid.txt"))


def gguf_model(tmp_path, ctx=512):
    """A stories260K-shaped GGUF (random weights, a SentencePiece vocabulary of 512), imported as a model file."""
    pytest.importorskip("gguf")
    pytest.importorskip("sentencepiece")
    from tests.support.llama_fixtures import numpy_llama, train_sentencepiece, write_gguf

    sp = train_sentencepiece(tmp_path / "sp", vocab_size=512)
    path = write_gguf(numpy_llama(tmp_path / "hf", sp, ctx=ctx), sp, tmp_path / "stories260K.gguf")
    out = tmp_path / "stories260K.safetensors"
    assert main(["import", str(path), str(out)]) == 0
    return path, out


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "glassllm.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def _state(folder):
    from safetensors import safe_open

    with safe_open(str(folder / "train_state.safetensors"), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def _args(init, corpus, out):
    train, valid = corpus
    return ["train", "--init-from", init, "--data", train, "--valid", valid, "--out", out, "--steps", 8,
            "--batch-size", 2, "--seq-len", 48, "--checkpoint-every", 3, "--eval-every", 4, "--eval-windows", 2,
            "--timeline-points", 4, "--doc-start-fraction", 0.5, "--repeat-fraction", 0.25, "--repeat-tokens",
            "random", "--threads", 1, "--no-progress"]


@pytest.mark.parametrize("source", ["bundled", "gguf"])
def test_fine_tuning_resumes_bit_for_bit(source, corpus, tmp_path):
    if source == "bundled":
        init, model_file = "bundled", checkpoint.bundled_model_path()
    else:
        _, model_file = gguf_model(tmp_path)
        init = model_file
    straight, chunked = tmp_path / "straight", tmp_path / "chunked"
    _cli(*_args(init, corpus, straight))
    _cli(*_args(init, corpus, chunked), "--until", 5)
    assert _state(chunked)[1]["step"] == "5"
    _cli("train", "--out", chunked, "--resume", "--threads", 1, "--no-progress")
    (a, meta_a), (b, meta_b) = _state(straight), _state(chunked)
    assert meta_a["step"] == meta_b["step"] == "8" and sorted(a) == sorted(b)
    for key in a:                                                        # weights and both moments
        assert np.array_equal(a[key], b[key]), key
    drop = lambda rows: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]  # noqa: E731
    assert drop(json.loads(meta_a["history"])) == drop(json.loads(meta_b["history"]))
    # The architecture and the tokenizer are the source's; the weights moved away from it.
    source_model, source_tok, _ = checkpoint.load_model(model_file)
    tuned, tok, info = checkpoint.load_model(straight / "model.safetensors")
    assert tuned.config == source_model.config and tok.to_json() == source_tok.to_json()
    assert info["init_from"] and info["step"] == "8"
    moved = [not np.array_equal(p, tuned.state_dict()[k]) for k, p in source_model.state_dict().items()]
    assert all(moved)
    # The fine-tuning schedule, as --help states it, where the command line did not set it.
    config = json.loads(meta_a["train_config"])
    finetune = RECIPES["finetune"]
    assert (config["lr"], config["min_lr"], config["warmup_steps"]) == (finetune.lr, finetune.min_lr,
                                                                        finetune.warmup_steps)


def test_fine_tuning_lowers_held_out_loss_and_records_the_timeline_from_step_0(corpus, tmp_path):
    train, valid = corpus
    model, tok, _ = checkpoint.load_bundled()
    before = evaluate_text(model, tok, str(valid), seq_len=64)
    out = tmp_path / "run"
    assert main(["train", "--init-from", "bundled", "--data", str(train), "--valid", str(valid), "--out", str(out),
                 "--steps", "30", "--batch-size", "4", "--seq-len", "64", "--eval-every", "0", "--eval-windows", "0",
                 "--timeline-points", "5", "--threads", "1", "--no-progress"]) == 0
    tuned, _, _ = checkpoint.load_model(out / "model.safetensors")
    after = evaluate_text(tuned, tok, str(valid), seq_len=64)
    assert after.loss < 0.8 * before.loss
    # The timeline starts at step 0 with the source model itself: its held-out loss is the "before" figure.
    timeline = load_timeline(out / "timeline.safetensors")
    assert timeline.steps[0] == 0 and timeline.rows[0]["step"] == 0
    assert timeline.rows[0]["val_loss"] == pytest.approx(evaluate_text(model, tok, str(valid), seq_len=64).loss,
                                                         rel=1e-6)
    assert timeline.rows[-1]["val_loss"] == pytest.approx(after.loss, rel=1e-6)


def test_a_longer_seq_len_grows_the_context_and_the_gguf_file_is_read_directly(corpus, tmp_path):
    gguf_file, _ = gguf_model(tmp_path, ctx=32)
    train, valid = corpus
    out = tmp_path / "run"
    assert main(["train", "--init-from", str(gguf_file), "--data", str(train), "--out", str(out), "--steps", "2",
                 "--batch-size", "2", "--seq-len", "64", "--timeline-points", "0", "--threads", "1",
                 "--no-progress"]) == 0
    tuned, tok, _ = checkpoint.load_model(out / "model.safetensors")
    assert tuned.config.max_seq_len == 64 and tuned.config.dim == 64 and tok.bos_id is not None


@pytest.mark.parametrize("argv, match", [
    (["--dim", "64"], "--dim cannot change the architecture of --init-from bundled"),
    (["--tokenizer", "tok.json"], "--tokenizer tok.json cannot be used with --init-from"),
])
def test_init_from_refuses_to_change_the_architecture(corpus, tmp_path, capsys, argv, match):
    train, _ = corpus
    assert main(["train", "--init-from", "bundled", "--data", str(train), "--out", str(tmp_path / "r"),
                 "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_init_from_names_a_missing_model(corpus, tmp_path, capsys):
    train, _ = corpus
    assert main(["train", "--init-from", str(tmp_path / "nope.safetensors"), "--data", str(train),
                 "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    assert "nope.safetensors' does not exist" in capsys.readouterr().err
