"""The learner's install (``pip install -e ".[learn]"``) has no PyTorch, and the lessons do not need it.

CI proves it on every run (``.ci/run`` builds a clean venv with ``.[learn-test]``,
checks that torch cannot be imported, and runs every lesson and the notebook).
These checks catch the same mistakes in seconds: a heavy reference library in
the extra, or a lesson that imports one outside an optional aside.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.support.glassllm_testing import extra_requirements

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "transformer_lens", "transformer-lens", "tokenizers", "playwright")
OPTIONAL_LIBRARIES = re.compile(r"^\s*(?:import|from)\s+(torch|transformers|transformer_lens|tokenizers)\b")


def _closure(name: str) -> set[str]:
    found = extra_requirements(name)
    if found is None:
        pytest.skip("reading pyproject.toml needs Python 3.11 or later (tomllib)")
    return found


def test_the_learn_extra_brings_jupyter_and_the_inspector_but_no_pytorch():
    learn = _closure("learn")
    assert {"jupyterlab", "ipykernel", "anywidget", "matplotlib", "nbclient", "fastapi", "uvicorn",
            "mkdocs-material"} <= learn
    assert not learn & set(HEAVY), learn & set(HEAVY)
    assert _closure("learn-test") - learn == {"pytest", "sybil"}


def test_lessons_import_reference_libraries_only_in_optional_asides():
    """Each such import sits between a ``skip: start if(module_missing(...))`` and its ``skip: end``."""
    bad = []
    for path in sorted((ROOT / "docs" / "lessons").glob("*.md")):
        aside = None
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("<!-- skip: start"):
                aside = line
            elif line.startswith("<!-- skip: end"):
                aside = None
            else:
                found = OPTIONAL_LIBRARIES.match(line)
                if found and not (aside and f'module_missing("{found.group(1)}")' in aside):
                    bad.append(f"{path.name}:{number}: {line.strip()}")
    assert not bad, "imports outside an optional aside (wrap them in a module_missing skip):\n" + "\n".join(bad)


def test_ci_runs_the_lessons_and_the_notebook_in_a_clean_learn_venv():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip install -q -e ".[dev]" && python -m pytest' in ci                # the README's command
    assert "GLASSLLM_STRICT=1" in ci                                             # in a fresh venv, strictly
    assert 'source "$venv/bin/activate"' in ci and "fresh_venv \"$venv\"" in ci
    assert "-m venv" in ci and "--system-site-packages" not in ci
    assert '-e ".[learn-test]"' in ci and '-c "import torch"' in ci
    assert "-m pytest docs/lessons tests/test_notebooks.py" in ci
    assert ci.rstrip().endswith("exit $status")
