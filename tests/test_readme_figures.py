"""The README's performance figures are the committed benchmark run's, not numbers typed by hand.

``bench/run`` writes ``bench/results.md`` (the table) and ``bench/results.json``
(the same rows, unrounded). The README pastes the table, adds the run as the
newest column of its run-to-run table and quotes a few training figures in its
text; all three are checked here against those files. (The prose about earlier
runs quotes figures that are no longer in the repository and is not checked.)
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
RESULTS = json.loads((ROOT / "bench" / "results.json").read_text(encoding="utf-8"))


def test_the_performance_table_is_the_committed_run():
    table = (ROOT / "bench" / "results.md").read_text(encoding="utf-8").strip()
    assert table in README, "README's Performance table differs from bench/results.md: paste it again"


def _row(metric, reference_name):
    (row,) = [r for r in RESULTS["rows"] if r["metric"] == metric and r["reference_name"] == reference_name]
    return row


def test_the_newest_run_to_run_column_is_the_committed_run():
    lines = [line.strip() for line in README.splitlines() if line.strip().startswith("| figure |")]
    assert len(lines) == 1, "expected one run-to-run table"
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[-1] == "target"
    newest = header[-2]
    assert newest == datetime.fromisoformat(RESULTS["date"]).strftime("%H:%M")

    start = README.index(lines[0])
    body = README[start:].split("\n\n", 1)[0].splitlines()[2:]
    column = {}
    for line in body:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        column[cells[0]] = cells[-2]

    ratio = lambda metric, ref: f"{_row(metric, ref)['ratio']:.2f}x"  # noqa: E731
    want = {
        "training, 1 thread, / torch_sdpa": ratio("tokens/s, width 128, 1 thread", "torch_sdpa"),
        "training, 2 threads (workers), / torch_sdpa": ratio("tokens/s, width 128, 2 threads (workers)", "torch_sdpa"),
        "training, width 256, / torch_sdpa": ratio("tokens/s, width 256, 1 thread", "torch_sdpa"),
        "training, width 512, / torch_sdpa": ratio("tokens/s, width 512, 1 thread", "torch_sdpa"),
        "decoding, tokens/s": f"{_row('tokens/s, 16 + 256 tokens, batch 1', 'PyTorch KV-cache loop')['glassllm']:,.0f}",
        "decoding / PyTorch": ratio("tokens/s, 16 + 256 tokens, batch 1", "PyTorch KV-cache loop"),
        "attention forward at 4,096 / torch SDPA": ratio("attention forward, 4096 tokens (ms)", "torch SDPA"),
        "full trace / untraced": ratio("full trace / untraced forward (CPU ms)", "untraced forward"),
        "one traced name (attn.softmax) / untraced":
            ratio("one name (layers.2.attn.softmax) / untraced forward (CPU ms)", "untraced forward"),
    }
    assert column == want


def test_the_training_figures_quoted_in_the_text_are_the_committed_runs():
    """The sentences about the hand-written step and the two workers quote the run's train.json."""
    train = json.loads((ROOT / "bench" / "results" / "train.json").read_text(encoding="utf-8"))
    one, two = (next(r["tokens_per_s"] for r in train["results"] if r["threads"] == k) for k in (1, 2))
    text = " ".join(README.split())                                     # the README's line breaks removed
    n = lambda x: f"{x:,.0f}"  # noqa: E731
    for quoted in (
        f"made {n(one['numpy_hand'])} and {n(one['numpy_hand_tiled'])} tokens/s, against glassllm's "
        f"{n(one['glassllm'])} and PyTorch's {n(one['torch_sdpa'])}",
        f"glassllm / `numpy_hand_tiled` = {one['glassllm'] / one['numpy_hand_tiled']:.2f}x",
        f"2 workers: {n(two['glassllm'])} tokens/s, against {n(one['glassllm'])} at 1 thread and "
        f"{n(two['glassllm_blas'])} for BLAS threads alone",
        f"2 workers trained at {two['glassllm'] / one['glassllm']:.2f}x the 1-thread speed and BLAS threads "
        f"alone at {two['glassllm_blas'] / one['glassllm']:.2f}x",
    ):
        assert quoted in text, quoted
