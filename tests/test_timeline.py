"""The training timeline: what it records equals what the tracer and the model compute, it survives
a file round trip and a resume, and its schedule is the log-spaced one it promises."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from glassllm.autograd import no_grad, softmax_np
from glassllm.config import ModelConfig
from glassllm.data import WindowSampler
from glassllm.nn import Transformer
from glassllm.timeline import Timeline, load_timeline, log_steps, timeline_path_for
from glassllm.tokenizer import Tokenizer
from glassllm.trace import trace
from glassllm.train import TrainConfig

from tests.test_train import _cli, _state, _train_args, texts  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def small():
    tok = Tokenizer.train("Max the dog found a red ball in the park. The cat sat on the mat. " * 30, vocab_size=280)
    model = Transformer(ModelConfig(vocab_size=280, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
                                    max_seq_len=64), seed=3, dtype=np.float64)
    return model, tok


def test_log_steps_are_distinct_ascending_and_end_at_the_last_step():
    assert log_steps(1000, 6) == [0, 1, 4, 16, 63, 251, 1000]          # 1000 ** (k / 5), rounded
    for total, points in [(1, 5), (7, 40), (12000, 40)]:
        s = log_steps(total, points)
        assert s[0] == 0 and s[-1] == total and s == sorted(set(s)) and len(s) <= points + 2
    with pytest.raises(ValueError, match="points >= 1"):
        log_steps(10, 0)


def test_a_recorded_step_equals_the_tracer_and_the_model(small):
    model, tok = small
    tl = Timeline.for_model(model, tok, steps=10, points=4)
    half = tok.encode("Max the dog found a red ball in the park.")
    assert tl.ids == half + half and tl.period == len(half)
    tl.record(model, tok, step=0, tokens=0, lr=0.0, train_loss=None)
    tr = trace(model, tl.ids, names="attn.softmax")
    n, P = len(tl.ids), tl.period
    for layer in range(2):
        np.testing.assert_allclose(tl.attn[0, layer], tr.get(f"layers.{layer}.attn.softmax"), rtol=1e-6)
        for head in range(4):                                            # the induction cell, one query at a time
            cells = [tl.attn[0, layer, head, i, i - P + 1] for i in range(P, n)]
            assert tl.induction[0, layer, head] == pytest.approx(np.mean(cells), rel=1e-6)
    with no_grad():
        logits = model(np.array([tl.ids])).data[0, -1].astype(np.float64)  # (V,)
    np.testing.assert_allclose(tl.probs[0], softmax_np(logits), rtol=1e-5, atol=1e-9)
    assert tl.rows[0]["val_loss"] is None and isinstance(tl.rows[0]["sample"], str)


def test_the_file_round_trips_and_a_bad_file_is_one_line(small, tmp_path):
    model, tok = small
    tl = Timeline.for_model(model, tok, steps=10, points=4)
    for step in (0, 1):
        tl.record(model, tok, step=step, tokens=step * 8, lr=1e-3, train_loss=None if step == 0 else 5.0)
    tl.set_history([{"step": 1, "tokens": 8, "lr": 1e-3, "loss": 5.0, "val_loss": None, "val_bpb": None}])
    path = tmp_path / "timeline.safetensors"
    tl.save(path)
    back = load_timeline(tmp_path)                                        # a run folder finds its file
    assert back.steps == [0, 1] and back.rows == tl.rows and back.ids == tl.ids and back.history == tl.history
    np.testing.assert_allclose(back.attn, tl.attn, atol=1e-3)             # stored as float16
    np.testing.assert_array_equal(back.induction, tl.induction)
    assert timeline_path_for(tmp_path / "x.safetensors").name == "x.timeline.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError, match="cannot read"):
        load_timeline(path)
    with pytest.raises(ValueError, match="no training timeline"):
        load_timeline(tmp_path / "elsewhere")


def test_a_second_stage_continues_the_first_timeline(small):
    """A run started from another run's last model joins its timeline: steps and tokens count on, the
    second stage's step 0 (the first's last model again) is dropped, every row's recording is kept."""
    model, tok = small
    first = Timeline.for_model(model, tok, steps=4, points=2)
    for step in first.schedule:
        first.record(model, tok, step=step, tokens=step * 8, lr=1e-3, train_loss=None)
    first.set_history([{"step": s, "tokens": s * 8, "lr": 1e-3, "loss": 5.0 - s, "val_loss": None, "val_bpb": None}
                       for s in (1, 2, 3, 4)])
    other = Transformer(model.config, seed=4, dtype=np.float64)           # the second stage's weights moved
    second = Timeline.for_model(other, tok, steps=2, points=2)
    for step in second.schedule:
        second.record(model if step == 0 else other, tok, step=step, tokens=step * 16, lr=1e-4 * (step + 1),
                      train_loss=None)
    second.set_history([{"step": s, "tokens": s * 16, "lr": 1e-4, "loss": 1.0, "val_loss": None, "val_bpb": None}
                        for s in (1, 2)])
    both = first.then(second)
    last = first.steps[-1]
    assert both.steps == first.steps + [last + s for s in second.steps[1:]]
    assert [r["tokens"] for r in both.rows[len(first.rows):]] == [32 + t for t in (16, 32)]
    assert [r["step"] for r in both.history] == [1, 2, 3, 4, 5, 6]
    # The first stage's last row stays its own (the rate of the step that led to it); the second's follow.
    assert both.rows[len(first.rows) - 1] == first.rows[-1]
    assert [r["lr"] for r in both.rows[len(first.rows):]] == pytest.approx([2e-4, 3e-4], rel=1e-12)
    np.testing.assert_array_equal(both.attn, np.concatenate([first.attn, second.attn[1:]]))
    np.testing.assert_array_equal(both.induction[-1], second.induction[-1])
    np.testing.assert_array_equal(both.probs[:len(first.steps)], first.probs)
    with pytest.raises(ValueError, match="different probes"):
        first.then(Timeline.for_model(model, tok, steps=2, points=2, span="The cat sat on the mat."))


def test_the_bundled_timeline_holds_each_steps_learning_rate_from_its_stages_schedules():
    """The shipped timeline joins two runs (the second started from the first's last model): every row's
    learning rate is the one of the step that led to it, the first run's schedule up to the join and the
    second's after it, as the training history holds it; step 0 has none."""
    from glassllm.checkpoint import bundled_model_path, load_model

    meta = load_model(bundled_model_path())[2]
    base = json.loads(meta["base"])
    first = TrainConfig.from_dict(base["train_config"])
    second = TrainConfig.from_dict(json.loads(meta["train_config"]))
    split, tl = base["steps"], load_timeline(timeline_path_for(bundled_model_path()))
    lr = {row["step"]: row["lr"] for row in tl.rows}
    # By hand: 100 warm-up steps to 3e-3, then from the join 30 to 8e-4, each lr_at(k) = peak * (k + 1) / warm-up;
    # the step that led to model k is step k - 1 of its stage's schedule.
    assert (first.lr, first.warmup, second.lr, second.warmup) == (3e-3, 100, 8e-4, 30)
    assert lr[0] is None
    assert [lr[1], lr[2], lr[split + 1], lr[split + 2]] == pytest.approx([3e-5, 6e-5, 8e-4 / 30, 1.6e-3 / 30],
                                                                         rel=1e-12)
    history = {h["step"]: h["lr"] for h in tl.history}                  # thinned: every 20th step, and the last ones
    together = [step for step in lr if step in history]
    assert len(together) >= 8                                            # on both sides of the join
    for step in together:
        assert lr[step] == pytest.approx(history[step], rel=1e-12), step
    for step, got in lr.items():
        if step:
            want = first.lr_at(step - 1) if step <= split else second.lr_at(step - split - 1)
            assert got == pytest.approx(want, rel=1e-12), step


def test_warm_up_and_repeats_follow_the_run_length():
    assert TrainConfig(steps=100).warmup == 10 and TrainConfig(steps=100).lr_at(10) == TrainConfig().lr
    assert TrainConfig(steps=5000).warmup == 100 and TrainConfig(steps=100, warmup_steps=0).warmup == 0
    c = TrainConfig(repeat_fraction=0.0, short_steps=4, short_seq_len=64, short_repeat_fraction=1.0)
    assert [c.repeat_at(s) for s in (0, 3, 4)] == [1.0, 1.0, 0.0]
    assert TrainConfig(repeat_fraction=0.25, short_steps=4, short_seq_len=64).repeat_at(0) == 0.25
    ids = np.arange(500, dtype=np.uint16)
    x, _ = WindowSampler(ids, 40, 6, np.random.default_rng(0), repeat_tokens="random").next_batch(repeat_fraction=1.0)
    for row in x:                                                          # every row one span, repeated
        period = next(h for h in range(1, 41) if np.array_equal(row[h:], row[:-h]))
        assert period <= 21
    with pytest.raises(ValueError, match="short_repeat_fraction"):
        TrainConfig(short_repeat_fraction=1.5)


def test_a_resumed_run_records_the_same_timeline(texts, tmp_path):  # noqa: F811
    train, valid = texts
    straight, chunked = tmp_path / "straight", tmp_path / "chunked"
    _cli(*_train_args(train, valid, straight), "--timeline-points", 8)
    _cli(*_train_args(train, valid, chunked), "--timeline-points", 8, "--until", 7)
    _cli("train", "--out", chunked, "--resume", "--no-progress")
    a, b = load_timeline(straight), load_timeline(chunked)
    assert a.steps == b.steps == log_steps(20, 8)
    assert a.rows == b.rows                                               # losses, held-out, samples
    for name in ("attn", "probs", "induction"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert all(r["val_loss"] is not None for r in a.rows)                 # the run had held-out text


def test_two_runs_of_one_command_give_identical_weights(texts, tmp_path):  # noqa: F811
    train, valid = texts
    args = ["--recipe", "class", "--steps", 6, "--batch-size", 4, "--seq-len", 32, "--vocab-size", 300,
            "--dim", 32, "--n-layers", 2, "--n-heads", 4, "--n-kv-heads", 2, "--no-progress"]
    _cli("train", "--data", train, "--out", tmp_path / "a", *args)
    _cli("train", "--data", train, "--out", tmp_path / "b", *args)
    (a, _), (b, _) = _state(tmp_path / "a"), _state(tmp_path / "b")
    assert sorted(a) == sorted(b)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_each_evaluation_prints_a_sample(texts, tmp_path):  # noqa: F811
    train, valid = texts
    args = [a for a in _train_args(train, valid, tmp_path / "run") if a != "--no-progress"]
    proc = _cli(*args)
    evals = [line for line in proc.stderr.splitlines() if "held-out loss" in line and line.lstrip().startswith("step")]
    samples = [line for line in proc.stderr.splitlines() if line.strip().startswith("sample: Once upon a time")]
    assert len(evals) == 4 and len(samples) == 4                          # steps 5, 10, 15, 20
    quiet = _cli(*[a for a in _train_args(train, valid, tmp_path / "quiet") if a != "--no-progress"], "--quiet")
    assert quiet.stderr == ""


def test_doctests():
    import doctest

    import glassllm.timeline

    assert doctest.testmod(glassllm.timeline).failed == 0
