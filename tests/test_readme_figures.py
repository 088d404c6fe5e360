"""The performance figures in README.md and docs/performance.md are the committed run's, not typed by hand.

``bench/run`` writes ``bench/results.md`` (the table) and ``bench/results.json``
(the same rows, unrounded), and each benchmark's JSON in ``bench/results/``.
docs/performance.md pastes the whole table and quotes a few training figures
in its text; README.md pastes selected rows. All of it is checked here against
those files, and the product documents are checked to speak about the product:
no issue numbers, no dated runs, no commits.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PERFORMANCE = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
RESULTS = json.loads((ROOT / "bench" / "results.json").read_text(encoding="utf-8"))
RESULTS_MD = (ROOT / "bench" / "results.md").read_text(encoding="utf-8")


def _table(text: str) -> str:
    """The lines of the first Markdown table in ``text``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| group | metric |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_the_performance_page_has_the_committed_table():
    table = _table(RESULTS_MD)
    assert len(table.splitlines()) == 2 + len(RESULTS["rows"])
    assert table in PERFORMANCE, "docs/performance.md's table differs from bench/results.md: paste it again"


def test_the_results_page_is_the_committed_reports_markdown(monkeypatch):
    """bench/results.md is what bench/run makes of bench/results.json (and of the engineer-scale report),
    with a line for each benchmark measured again since the full run (bench/run --only NAME --update)."""
    import importlib.machinery
    import importlib.util
    import sys

    from bench import benchlib

    monkeypatch.setitem(sys.modules, "benchlib", benchlib)             # as the script finds it beside itself
    loader = importlib.machinery.SourceFileLoader("bench_run_script", str(ROOT / "bench" / "run"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    assert module.summarize(RESULTS["benchmarks"]) == RESULTS["rows"]
    assert module.markdown(RESULTS) == RESULTS_MD, "bench/results.md differs from bench/results.json: run bench/run"
    for again in RESULTS.get("again", []):
        assert f"Measured again since, {', '.join(again['benchmarks'])}: " in RESULTS_MD


def test_every_row_of_the_readme_table_is_a_row_of_the_committed_run():
    committed = set(_table(RESULTS_MD).splitlines())
    rows = _table(_section(README, "Performance")).splitlines()
    assert len(rows) >= 2 + 5, "README's Performance section shows no headline table"
    missing = [row for row in rows if row not in committed]
    assert not missing, f"README rows not in bench/results.md (paste them again): {missing}"
    assert "bench/run" in _section(README, "Performance")


def test_the_training_figures_quoted_in_the_text_are_the_committed_runs():
    """The sentences about the hand-written step and the two workers quote the run's train.json."""
    train = json.loads((ROOT / "bench" / "results" / "train.json").read_text(encoding="utf-8"))
    one, two = (next(r["tokens_per_s"] for r in train["results"] if r["threads"] == k) for k in (1, 2))
    text = " ".join(PERFORMANCE.split())                               # the page's line breaks removed
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


def _product_documents() -> list[Path]:
    docs = ROOT / "docs"
    return [ROOT / "README.md", *sorted(p for p in docs.rglob("*.md") if "_hooks" not in p.parts)]


# What a document about the product has no reason to contain: the project's issue tracker, dated runs,
# commit ids. (Dates of runs belong in the generated result files, bench/results*.)
NOT_ABOUT_THE_PRODUCT = [
    (re.compile(r"\bissues?\b|(?<![\w/.])#\d+\b(?!-)", re.IGNORECASE), "an issue"),   # not a link's #5-rmsnorm
    (re.compile(r"\b20\d\d-\d\d-\d\d"), "a date"),
    (re.compile(r"\bcommit [0-9a-f]{7,40}\b"), "a commit"),
]


def test_the_documents_speak_about_the_product():
    found = []
    for path in _product_documents():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for pattern, what in NOT_ABOUT_THE_PRODUCT:
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_the_pattern_catches_what_it_is_for():
    samples = ["As issue #10 says", "the run of 2026-11-30", "before commit 996f832"]
    for sample, (pattern, _) in zip(samples, NOT_ABOUT_THE_PRODUCT):
        assert pattern.search(sample)
    assert NOT_ABOUT_THE_PRODUCT[0][0].search("see #12 for the plan")
    assert not NOT_ABOUT_THE_PRODUCT[0][0].search("[exercise 5](../exercises/index.md#5-rmsnorm)")


def test_the_readme_screenshot_shows_every_section_of_the_page():
    """docs/inspector.png is shot by tools/screenshot.py, which records the sections the page showed; the page's
    sections today (index.html) must all be in it, so a new panel asks for a new picture."""
    import pytest

    Image = pytest.importorskip("PIL.Image")
    assert "![" in README and "(docs/inspector.png)" in README
    shot = Image.open(ROOT / "docs" / "inspector.png")
    recorded = shot.text.get("glassllm-sections")
    assert recorded, "docs/inspector.png was not shot by: python -m tools.screenshot docs/inspector.png"
    page = (ROOT / "src" / "glassllm" / "inspector" / "static" / "index.html").read_text(encoding="utf-8")
    sections = re.findall(r'<section [^>]*aria-label="([^"]+)"', page)
    assert sorted(recorded.splitlines()) == sorted(sections), "re-shoot: python -m tools.screenshot docs/inspector.png"


def test_the_engineer_scale_table_is_the_committed_runs():
    """docs/performance.md and bench/results.md show bench/results/scale.json's table (bench/run --scale)."""
    scale = json.loads((ROOT / "bench" / "results" / "scale.json").read_text(encoding="utf-8"))
    assert scale["markdown"] in PERFORMANCE, "docs/performance.md's engineer-scale table differs: paste it again"
    assert scale["markdown"] in RESULTS_MD, "bench/results.md's engineer-scale table differs: run bench/run --scale"
    assert {t["what"] for t in scale["targets"]} >= {"load", "import, peak RSS / file"}
