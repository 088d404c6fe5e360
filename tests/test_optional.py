"""Optional packages: every import of one goes through ``glassllm.optional.require``, which names the
extra that brings it; the extras declare what the table says; and the core install (NumPy alone) runs
the bundled model: ``generate``, ``eval``, ``check`` and the tracer, in a subprocess where every optional
package is blocked, while ``inspect`` says in one line which extra it needs.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.support.glassllm_testing import ROOT, extra_requirements

from glassllm import optional
from glassllm.optional import EXTRAS, MissingExtra, require

PACKAGE = ROOT / "src" / "glassllm"


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def test_every_optional_import_in_src_goes_through_require():
    """A module may ``import`` an optional package only after ``require`` has named its extra in that module
    (``glassllm.torch``'s modules: its ``__init__`` requires torch before any of them loads)."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "optional.py":
            continue
        text = path.read_text(encoding="utf-8")
        for line, name in _imports(ast.parse(text)):
            top = name.split(".")[0]
            if top not in EXTRAS:
                continue
            guarded = any(f'require("{m}' in text for m in (top, EXTRAS[top][0]))   # starlette: fastapi's
            if not guarded and not (top == "torch" and path.parent.name == "torch"):
                bad.append(f"{path.relative_to(ROOT)}:{line}: import {name}")
    assert not bad, "optional imports that bypass glassllm.optional.require:\n" + "\n".join(bad)


def test_the_extras_declare_what_the_table_names():
    for module, (package, extra) in EXTRAS.items():
        declared = extra_requirements(extra)
        if declared is None:
            pytest.skip("reading pyproject.toml needs Python 3.11 or later (tomllib)")
        assert package in declared, f"{module}: {package} is not in .[{extra}]"
    assert "gguf" in extra_requirements("import") and "gguf" in extra_requirements("app")
    assert {"gguf", "sentencepiece", "pydantic", "safetensors"} <= extra_requirements("dev")
    assert extra_requirements("import") == {"gguf", "numpy"}                  # importing needs nothing else


def test_a_missing_package_is_one_line_naming_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(MissingExtra) as caught:
        require("gguf", "reading a GGUF file")
    text = str(caught.value)
    assert "\n" not in text and caught.value.name == "gguf" and isinstance(caught.value, ImportError)
    assert text.startswith("reading a GGUF file needs the package gguf, which is not installed")
    assert f'pip install "{optional.DISTRIBUTION}[import]"' in text and 'pip install -e ".[import]"' in text
    monkeypatch.setitem(sys.modules, "matplotlib", None)                  # a submodule names its package
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)           # (even after another test imported it)
    with pytest.raises(MissingExtra, match=r"Trace.plot needs the package matplotlib.*\[app\]"):
        require("matplotlib.pyplot", "Trace.plot")
    with pytest.raises(ModuleNotFoundError) as other:                     # not optional: its own error
        require("glassllm_no_such_module")
    assert not isinstance(other.value, MissingExtra)
    assert require("json") is json


# -- the core install -------------------------------------------------------------------------------

def _core(code: str, *argv: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where every package of ``EXTRAS`` cannot be imported."""
    prelude = f"import sys\nfor _m in {sorted(EXTRAS)!r}:\n    sys.modules[_m] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code), *argv], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return _core("from glassllm.cli import main\nsys.argv[0] = 'glassllm'\nsys.exit(main(sys.argv[1:]))", *argv)


@pytest.fixture(scope="module")
def bundled():
    from glassllm.checkpoint import bundled_model_path

    if not bundled_model_path().is_file():
        pytest.skip("needs the bundled model")
    return bundled_model_path()


def test_core_install_generates_with_the_bundled_model(bundled):
    run = _cli("generate", "Once upon a time", "--max-new-tokens", "40", "--seed", "0")
    assert run.returncode == 0, run.stderr
    text = run.stdout
    assert text.startswith("Once upon a time") and len(text.split()) > 12, text
    words = [w.strip(".,!?\"'") for w in text.split()]
    assert sum(w.isalpha() for w in words) > 0.8 * len(words), text             # words, not bytes


def test_core_install_evaluates_and_checks(bundled, tmp_path, capsys):
    story = tmp_path / "story.txt"
    story.write_text("Once upon a time, there was a little cat. The cat liked to play in the sun.\n"
                     "<|endoftext|>\nTom had a red ball. He gave it to his friend Sue, and she smiled.\n",
                     encoding="utf-8")
    run = _cli("eval", "--data", str(story), "--json")
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    from glassllm import cli                                  # the same command with everything installed
    assert cli.main(["eval", "--data", str(story), "--json"]) == 0
    assert result == json.loads(capsys.readouterr().out) and 0 < result["bits_per_byte"] < 8
    run = _cli("check", "softmax", str(PACKAGE / "exercises" / "solutions.py"))
    assert run.returncode == 0, run.stdout + run.stderr


def test_core_install_traces(bundled):
    run = _core("""
        from glassllm.checkpoint import load_bundled
        from glassllm.trace import trace
        model, tok, _ = load_bundled()
        t = trace(model, tok.encode("Once upon a time"), "layers.0.attn.softmax")
        print(t.get("layers.0.attn.softmax").shape)
    """)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("(")
    from glassllm.cli import COMMANDS

    if "trace" in COMMANDS:                                       # the command prints the same snapshot
        run = _cli("trace", "Once upon a time", "--snapshot", "layers.0.attn.softmax", "--head", "0")
        assert run.returncode == 0 and run.stdout.startswith("layers.0.attn.softmax, head 0"), run.stderr


def test_core_install_names_the_extra_a_command_needs(bundled, tmp_path):
    run = _cli("inspect", "Once upon a time")
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith("glassllm inspect: error: glassllm inspect needs the package fastapi")
    assert f'"{optional.DISTRIBUTION}[app]"' in run.stderr


def test_core_install_trains_without_a_progress_bar(tmp_path):
    text = tmp_path / "stories.txt"
    text.write_text("Once upon a time there was a cat. The cat sat in the sun and was happy.\n" * 40, encoding="utf-8")
    tiny = ["--steps", "3", "--dim", "32", "--n-layers", "1", "--n-heads", "2", "--n-kv-heads", "1", "--ffn-dim",
            "64", "--vocab-size", "270", "--seq-len", "32", "--batch-size", "2", "--data", str(text)]
    run = _cli("train", "--out", str(tmp_path / "run"), "--no-progress", *tiny)
    assert run.returncode == 0, run.stderr
    from glassllm.checkpoint import load_model

    model, _, meta = load_model(tmp_path / "run" / "model.safetensors")
    assert meta["step"] == "3" and (tmp_path / "run" / "loss.csv").is_file()
    assert not (tmp_path / "run" / "loss.png").exists()                       # no matplotlib: no plot
    run = _cli("train", "--out", str(tmp_path / "bar"), *tiny)                # a progress bar needs tqdm
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "needs the package tqdm" in run.stderr and "--no-progress" in run.stderr
    assert not (tmp_path / "bar").exists()


def test_python_m_glassllm_is_the_command():
    import glassllm

    run = subprocess.run([sys.executable, "-m", "glassllm", "--version"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == f"glassllm {glassllm.__version__}", run.stderr


def test_the_installed_version_is_glassllm_version():
    import importlib.metadata

    import glassllm

    try:
        installed = importlib.metadata.version(optional.DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"glassllm is not installed as the distribution {optional.DISTRIBUTION} here")
    assert installed == glassllm.__version__                        # pyproject reads it from glassllm/__init__.py


def test_the_torch_trainer_run_without_torch_says_so_in_one_line(tmp_path):
    """``python -m glassllm.torch.train_ddp`` (what torchrun runs) is a command: no traceback, exit 2; the
    PyTorch twin used from a program raises MissingExtra."""
    import os

    fake = tmp_path / "torch"                                   # a torch that is not there
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")])}
    run = subprocess.run([sys.executable, "-m", "glassllm.torch.train_ddp", "--data", "x.txt", "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith("glassllm.torch.train_ddp: error: glassllm.torch.train_ddp needs the package "
                                 "torch, which is not installed") and '".[torch]"' in run.stderr
    for code in ("from glassllm.torch import Transformer", "import glassllm.torch.model"):
        imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                  cwd=tmp_path, timeout=120)
        assert imported.returncode == 1, code
        assert imported.stderr.splitlines()[-1].startswith("glassllm.optional.MissingExtra: glassllm.torch needs "
                                                           "the package torch"), imported.stderr
