"""The documentation site builds with ``mkdocs build --strict``: no warnings, no broken links.

mkdocs.yml turns every link check (missing pages, bad anchors, absolute
links, pages left out of the navigation) into a warning, and strict mode makes
any warning fail the build. The build runs the real command in a subprocess,
into a temporary folder, so the MkDocs hook that adds the inspector's exported
HTML (docs/_hooks/inspector_page.py) runs exactly as it does for a reader.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    assert "WARNING" not in log, log
    return out


def test_every_lesson_becomes_a_page(site):
    lessons = sorted((ROOT / "docs" / "lessons").glob("[0-9][0-9]-*.md"))
    assert len(lessons) >= 11
    for lesson in lessons:
        page = site / "lessons" / lesson.stem / "index.html"
        assert page.is_file(), f"no page for {lesson.name}"
    assert (site / "index.html").is_file()


def test_lesson_outputs_are_rendered_next_to_their_code(site):
    html = (site / "lessons" / "04-causal-attention" / "index.html").read_text(encoding="utf-8")
    assert "0.330238" in html and "1.604448" in html          # the verified example's output
    assert "language-output" in html and "language-python" in html


def test_site_includes_the_inspector_export(site):
    export = site / "inspector" / "export.html"
    assert export.is_file()
    assert (site / "inspector" / "index.html").is_file()
    from glassllm.checkpoint import bundled_model_path

    if importlib.util.find_spec("glassllm.inspector") is not None and bundled_model_path().exists():
        html = export.read_text(encoding="utf-8")
        assert "has no inspector export" not in html
        assert "Once upon a time" in html                     # the exported prompt


def test_every_lesson_says_at_its_top_that_its_blocks_run_in_order_in_one_namespace():
    """A learner who starts from a block in the middle meets names defined above it: each lesson says so before
    its first code block."""
    lessons = sorted((Path(__file__).resolve().parents[1] / "docs" / "lessons").glob("[0-9][0-9]-*.md"))
    assert len(lessons) >= 12
    for path in lessons:
        before = path.read_text(encoding="utf-8").split("```python", 1)[0]
        assert "run one after another in one\n> namespace" in before, path.name
