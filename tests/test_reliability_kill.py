"""Training faults: SIGKILL at random moments, and a non-finite number diagnosed by the tracer.

Kills. :func:`kill_campaign` trains one tiny run twice with ``glassllm train``
(a checkpoint after every step, so most of the wall time is spent saving):
once straight through, and once killed with SIGKILL at random moments --
during start-up, a step or any of the five atomic writes -- and resumed with
``--resume`` after each kill until it finishes. After every kill the last
completed checkpoint must load (``Trainer.resume``, ``load_model``), must
not be older than the one before the kill, and the inference file must be the
training state's step or one checkpoint behind it. At the end the killed run's
weights, AdamW moments, sampler state and loss history must equal the straight
run's, bit for bit. Here a few kills run; ``tools/reliability_report.py`` runs 50.

Non-finite numbers. ``train_step`` stops on a non-finite loss or gradient
and names, via :func:`glassllm.train.find_non_finite`, the first snapshot
that is not finite in forward order (and the first snapshot gradient in
backward order). The reference is an independent PyTorch float64 run of the
same weights: the first snapshot whose true value exceeds float32's range.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.test_reliability_inventory import stories

# Imports the heavy modules, says READY, then runs the command: kills land after start-up costs.
CHILD = (
    "import sys, matplotlib; matplotlib.use('Agg'); import matplotlib.pyplot, safetensors.numpy, tqdm\n"
    "from glassllm.cli import main\nimport glassllm.train, glassllm.tokenizer\n"
    "print('READY', glassllm.__file__, flush=True)\nsys.exit(main(sys.argv[1:]))\n"
)


def _train_argv(folder: Path, steps: int) -> list[str]:
    return ["train", "--data", str(folder / "train.txt"), "--tokenizer", str(folder / "tok.json"),
            "--steps", str(steps), "--batch-size", "2", "--seq-len", "16", "--grad-accum", "2",
            "--warmup-steps", "2", "--lr", "0.01", "--checkpoint-every", "1", "--eval-every", "0",
            "--dim", "32", "--n-layers", "1", "--n-heads", "2", "--n-kv-heads", "1", "--no-progress"]


def _start(argv: list[str], env: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    code = env.get("PYTHONPATH", "").split(os.pathsep)[0]
    if not (line.startswith("READY ") and line.split()[1].startswith(code)):
        proc.kill()
        raise AssertionError(f"the child did not start on the campaign's code {code}: {line!r} {proc.stderr.read()}")
    return proc


def _finish(proc: subprocess.Popen, timeout: float = 600) -> None:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}: {err}"


def _state(folder: Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    with safe_open(str(folder / "train_state.safetensors"), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())


def _check_checkpoint(run: Path, previous: int) -> int:
    """The checkpoint a kill left: it loads, is not older than ``previous``, and the model file matches."""
    from glassllm.checkpoint import load_model
    from glassllm.tokenizer import Tokenizer
    from glassllm.train import Trainer

    trainer = Trainer.resume(run, progress=False)
    assert trainer.step >= previous, f"the checkpoint went back from step {previous} to {trainer.step}"
    _, _, meta = load_model(run / "model.safetensors")
    assert int(meta["step"]) in (trainer.step, trainer.step - 1), \
        f"model file at step {meta['step']}, training state at {trainer.step}"
    Tokenizer.load(run / "tokenizer.json")
    return trainer.step


def kill_campaign(folder: Path, kills: int, seed: int = 0, log=None) -> dict:
    """Kill a training run ``kills`` times at random moments; return what happened (see the module docstring).

    ``folder`` gets the text, the tokenizer and two run folders. Raises
    AssertionError on a corrupted checkpoint or an inexact resume.
    """
    from glassllm.tokenizer import Tokenizer

    folder = Path(folder)
    text = stories(400, 3)
    (folder / "train.txt").write_text(text, encoding="utf-8")
    Tokenizer.train([text], vocab_size=300).save(folder / "tok.json")
    # Every process of the campaign runs one copy of the code: a shared checkout may change under a
    # long campaign, and bit-identical resume is only promised for the same code.
    import shutil

    import glassllm

    code = folder / "code"
    shutil.copytree(Path(glassllm.__file__).parent, code / "glassllm", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))}
    steps = 4 * kills + 10
    rng = np.random.default_rng(seed)

    # The straight run, timed from READY: how long a step (and its five saves) takes.
    straight = folder / "straight"
    t0 = time.perf_counter()
    proc = _start([*_train_argv(folder, steps), "--out", str(straight)], env)
    t_ready = time.perf_counter()
    _finish(proc)
    per_step = (time.perf_counter() - t_ready) / steps

    run = folder / "killed"
    stats = {"kills": 0, "finished_before_kill": 0, "in_write": {}, "steps_at_kill": [], "corrupted": 0,
             "starts": 0, "straight_s": round(time.perf_counter() - t0, 2), "per_step_s": round(per_step, 4)}
    step = 0
    while stats["kills"] < kills:
        resume = (run / "train_state.safetensors").exists()
        argv = [*_train_argv(folder, steps), "--out", str(run)] if not resume else \
            ["train", "--out", str(run), "--resume", "--no-progress"]
        proc = _start(argv, env)
        stats["starts"] += 1
        time.sleep(rng.uniform(0, 6 * per_step))                  # about 3 steps on average, saves included
        if proc.poll() is not None:
            _finish(proc)
            stats["finished_before_kill"] += 1
            break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()
        stats["kills"] += 1
        for tmp in run.glob(".*.tmp"):                              # a kill inside an atomic write
            target = tmp.name[1:].split(".tmp")[0].rsplit(".", 1)[0]
            stats["in_write"][target] = stats["in_write"].get(target, 0) + 1
        if (run / "train_state.safetensors").exists():
            try:
                step = _check_checkpoint(run, step)
            except Exception:
                stats["corrupted"] += 1
                raise
        stats["steps_at_kill"].append(step)
        if log:
            log(f"kill {stats['kills']}/{kills}: checkpoint at step {step}")
    if (run / "train_state.safetensors").exists() and _state(run)[1]["step"] != str(steps):
        _finish(_start(["train", "--out", str(run), "--resume", "--no-progress"], env))
    elif not (run / "train_state.safetensors").exists():
        _finish(_start([*_train_argv(folder, steps), "--out", str(run)], env))

    # Exact resume: every tensor of the training state, the sampler and the history.
    (a, meta_a), (b, meta_b) = _state(straight), _state(run)
    assert meta_a["step"] == meta_b["step"] == str(steps)
    assert sorted(a) == sorted(b)
    differ = [k for k in a if not np.array_equal(a[k], b[k])]
    assert not differ, f"the killed run's {differ[:3]} differ from the straight run's"
    assert meta_a["sampler"] == meta_b["sampler"]
    drop = lambda rows: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]  # noqa: E731
    assert drop(json.loads(meta_a["history"])) == drop(json.loads(meta_b["history"]))
    assert not list(run.glob(".*.tmp")), "temporary files were left behind"
    stats.update(steps=steps, exact=True, tensors_compared=len(a))
    return stats


# ----------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------

def test_random_sigkills_lose_nothing_and_resume_exactly(tmp_path):
    stats = kill_campaign(tmp_path, kills=3, seed=int(os.environ.get("GLASSLLM_KILL_SEED", "0")))
    assert stats["kills"] == 3 and stats["corrupted"] == 0 and stats["exact"]


def test_resume_removes_what_a_killed_save_left(tmp_path):
    from glassllm.config import ModelConfig
    from glassllm.tokenizer import Tokenizer
    from glassllm.train import TrainConfig, Trainer

    text = stories(100, 1)
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    config = TrainConfig(steps=3, batch_size=2, seq_len=16, warmup_steps=1, checkpoint_every=1, eval_every=0)
    model = ModelConfig(vocab_size=270, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=32)
    Trainer(config, model, [tmp_path / "train.txt"], tmp_path / "run", tokenizer=Tokenizer.train([text], 270),
            progress=False).run(until=1)
    stale = [tmp_path / "run" / ".train_state.safetensors.abc123.tmp", tmp_path / "run" / ".loss.png.x.tmp"]
    for s in stale:
        s.write_bytes(b"half a file")
    keep = tmp_path / "run" / ".notes.tmp"                             # not a file the run writes
    keep.write_text("mine")
    Trainer.resume(tmp_path / "run", progress=False)
    assert not any(s.exists() for s in stale) and keep.exists()


# -- non-finite numbers ------------------------------------------------------------

CONFIG = dict(vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)


def _exploding_model(scale: float):
    """A float32 model whose layer-1 queries and keys are scaled by ``scale``: their dot products overflow."""
    from glassllm.config import ModelConfig
    from glassllm.nn import Transformer

    model = Transformer(ModelConfig(**CONFIG), seed=0)
    model.layers[1].attention.wq.weight.data[:] *= scale
    model.layers[1].attention.wk.weight.data[:] *= scale
    return model


def _first_beyond_float32(model, x) -> str:
    """Independent reference: the PyTorch float64 twin's snapshots, in forward order; the first whose
    true value is beyond float32's range (where a float32 run first overflows)."""
    torch = pytest.importorskip("torch")
    from tests.support.torch_reference import TorchLlama

    from glassllm.trace import registry

    ref = TorchLlama(model.config.to_dict(), dtype=torch.float64)
    ref.load_glassllm_state({k: v.astype(np.float64) for k, v in model.state_dict().items()})
    capture = {}
    with torch.no_grad():
        ref(np.asarray(x)[None], capture=capture)
    big = float(np.finfo(np.float32).max)
    for name in registry(model):
        if name in capture and capture[name].dtype != torch.bool:
            if torch.abs(capture[name]).max().item() > big:
                return name
    return ""


def test_non_finite_loss_names_the_first_overflowing_snapshot():
    from glassllm.optim import AdamW
    from glassllm.train import find_non_finite, train_step

    model = _exploding_model(1e21)
    x = np.array([[1, 2, 7, 3, 4], [3, 4, 5, 6, 7]])
    y = np.array([[2, 7, 3, 4, 5], [4, 5, 6, 7, 8]])
    expected = _first_beyond_float32(model, x[0])
    assert expected == "layers.1.attn.scores"                       # q and k fit in float32; q.k does not
    before = {k: v.copy() for k, v in model.state_dict().items()}
    opt = AdamW(model.named_parameters(), lr=1e-3)
    with np.errstate(all="ignore"), pytest.raises(ValueError) as e:
        train_step(model, opt, [(x, y)], 1e-3, 1.0, step=12)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("step 12: the loss is nan")
    assert f"first non-finite snapshot {expected} (forward order)" in msg
    # Backward order starts at the loss: the first gradient to break is the logits'.
    assert "first non-finite gradient logits (backward order)" in msg
    assert all(np.array_equal(v, before[k]) for k, v in model.state_dict().items())   # nothing moved
    found = find_non_finite(model, [(x[1:], y[1:]), (x, y)])
    assert (found.batch, found.row, found.value) == (0, 0, expected)


def test_a_finite_model_is_not_blamed():
    from glassllm.train import find_non_finite

    model = _exploding_model(1.0)
    x = np.array([[1, 2, 7, 3, 4]])
    assert find_non_finite(model, [(x, x)]) is None
