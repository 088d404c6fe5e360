"""The run folder: its files, the training state file, the loss curve, and its lock.

The run folder (``--out DIR``)::

    train_state.safetensors   weights, AdamW moments (``param/``, ``adam_m/``, ``adam_v/`` + name),
                              and metadata: step, both configs, tokenizer, the data sampler's
                              RNG state, data file hashes, the loss history
    model.safetensors         the inference file (checkpoint.save_model) + run metadata
    tokenizer.json            the tokenizer (trained on --data unless --tokenizer is given)
    loss.csv, loss.png        the loss curve
    cache/                    token ids, uint16, memory-mapped (unless --cache-dir)
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from ..files import atomic_path, atomic_write, encode_safetensors, make_folder, read_tagged
from ..optional import require

__all__ = ["RUN_FILES", "STATE_FORMAT", "STATE_VERSION", "write_state", "read_state", "write_loss_csv",
           "write_loss_png", "lock_run_folder"]

RUN_FILES = ("train_state.safetensors", "model.safetensors", "tokenizer.json", "loss.csv", "loss.png",
             "timeline.safetensors")
STATE_FORMAT = "glassllm-train-state"
STATE_VERSION = "1"
LOSS_COLUMNS = ("step", "tokens", "lr", "loss", "grad_norm", "val_loss", "val_bpb", "elapsed_s")


def write_state(path, tensors: dict[str, np.ndarray], meta: dict[str, str]) -> None:
    """Write a training state file (safetensors, format and version in its metadata) atomically."""
    atomic_write(path, encode_safetensors(tensors, {"format": STATE_FORMAT, "version": STATE_VERSION, **meta}))


def read_state(out_dir) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """The metadata and tensors of ``out_dir/train_state.safetensors``; half-written temporary files
    of a run killed mid-save are removed first. One ``ValueError`` line for anything unreadable."""
    path = Path(out_dir) / "train_state.safetensors"
    if not path.is_file():
        raise ValueError(f"cannot resume: {str(path)!r} does not exist (start a run without --resume)")
    for name in RUN_FILES:
        for stale in Path(out_dir).glob(f".{name}.*.tmp"):
            stale.unlink(missing_ok=True)
    return read_tagged(path, STATE_FORMAT, STATE_VERSION, "a glassllm training state")


def write_loss_csv(history: list[dict], path) -> None:
    """``loss.csv``: one row per step (empty cells where a step has no held-out figures), atomically."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(LOSS_COLUMNS)
    for row in history:
        writer.writerow(["" if row[k] is None else row[k] for k in LOSS_COLUMNS])
    atomic_write(path, buf.getvalue())


def write_loss_png(history: list[dict], path) -> None:
    """Plot the loss curve with matplotlib's Agg backend (no display needed), atomically."""
    require("matplotlib", "the loss plot (loss.png)").use("Agg")
    Figure = require("matplotlib.figure", "the loss plot (loss.png)").Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    ax = fig.add_subplot()
    steps = [r["step"] for r in history]
    ax.plot(steps, [r["loss"] for r in history], lw=0.8, alpha=0.7, label="train (per step)")
    val = [(r["step"], r["val_loss"]) for r in history if r["val_loss"] is not None]
    if val:
        ax.plot(*zip(*val), "o-", ms=3, label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")


def lock_run_folder(out, create: bool = True):
    """Hold an exclusive lock on the run folder ``out`` (its ``.lock`` file) for as long as the returned
    file stays open, so that two trainings never write one folder; ``ValueError`` if another holds it.

    With ``create`` False a missing folder is left for the caller to report. Without ``fcntl``
    (Windows) nothing is locked.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        return None
    out = Path(out)
    if not out.is_dir():
        if not create:
            return None
        make_folder(out)
    f = open(out / ".lock", "a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ValueError(f"{str(out)!r} is in use by another glassllm train (it holds the folder's .lock); "
                         "wait for it to finish or choose another --out") from None
    return f
