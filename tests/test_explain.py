"""Every snapshot carries its equation and the line of code that records it, found from the code."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import glassllm.nn
from glassllm.trace import explain as ex
from glassllm.trace.registry import generic_names

NN = Path(glassllm.nn.__file__)


def test_every_snapshot_has_an_equation_in_latex_and_text():
    for generic, *_ in generic_names():
        eq = ex.equation(generic)
        assert eq["latex"].strip() and eq["text"].strip(), generic
    # Nothing in the table that the model does not record.
    assert set(ex.EQUATIONS) == {ex.local_name(g) for g, *_ in generic_names()}
    assert ex.equation("layers.3.attn.scores")["text"] == "S = Q Kᵀ / √D"


def test_every_recorded_line_holds_its_snap_call():
    sites = ex.sites()
    assert set(sites) == {g for g, *_ in generic_names()}
    assert ex.check_sites(sites, NN) == []
    lines = NN.read_text(encoding="utf-8").splitlines()
    for generic, site in sites.items():
        assert f'snap("{site.local}"' in lines[site.line - 1] or f'snap_derived("{site.local}"' in lines[site.line - 1]
        assert site.code.splitlines()[site.line - site.first].strip() == lines[site.line - 1].strip()
    assert sites["layers.{i}.attn.scores"].function == "Attention.__call__"
    assert sites["probs"].function == "Transformer.__call__"


def test_a_moved_line_fails_the_check_and_the_finder_follows_it(tmp_path):
    copy = tmp_path / "nn.py"
    shutil.copy(NN, copy)
    recorded = ex.sites()
    scores = recorded["layers.{i}.attn.scores"]
    lines = copy.read_text(encoding="utf-8").splitlines(keepends=True)
    lines.insert(scores.line - 1, "\n")                      # the scores line moves down by one
    copy.write_text("".join(lines), encoding="utf-8")
    problems = ex.check_sites(recorded, copy)
    assert any(p.startswith("layers.{i}.attn.scores:") for p in problems)
    assert not any(p.startswith("layers.{i}.attn.q:") for p in problems)      # above the edit: unchanged
    found = ex.snap_sites(copy)
    assert found[("Attention", "scores")].line == scores.line + 1
    assert found[("Attention", "q")].line == recorded["layers.{i}.attn.q"].line


def test_a_snapshot_without_a_snap_call_is_refused(tmp_path):
    copy = tmp_path / "nn.py"
    copy.write_text(NN.read_text(encoding="utf-8").replace('self.snap("mix", ', "("), encoding="utf-8")
    assert ("Attention", "mix") not in ex.snap_sites(copy)
    assert ("Attention", "softmax") in ex.snap_sites(copy)


def test_explain_gives_the_neighbouring_lines():
    info = ex.explain("layers.1.attn.softmax")
    assert info["name"] == "layers.{i}.attn.softmax" and info["path"] == "glassllm/nn.py"
    numbers = [n for n, _ in info["context"]]
    assert numbers[0] < info["line"] < numbers[-1]
    assert dict(info["context"])[info["line"]].strip() == info["code"].strip()
    with pytest.raises(ValueError, match="attn.sofmax"):
        ex.explain("attn.sofmax")


def test_the_module_doctest():
    import doctest

    assert doctest.testmod(ex).failed == 0
