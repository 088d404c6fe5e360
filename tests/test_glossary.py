"""The glossary (docs/glossary.md) covers every shape symbol and every snapshot name, and the lessons'
links into it land on real entries.

The symbols are read from the shape legends the code and DEVELOPING.md state; the snapshot names from
the tracer's registry, so a new symbol or snapshot without an entry fails here.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import glassllm.nn
from glassllm.config import ModelConfig
from glassllm.trace.registry import registry

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "glossary.md"
TERMS = ["Bits per byte", "Residual stream", "Logits", "KV cache", "RoPE", "GQA", "SwiGLU", "RMSNorm",
         "Perplexity", "Induction head", "Ablation"]


def _tool():
    spec = importlib.util.spec_from_file_location("glossary_tool", ROOT / "tools" / "glossary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sections() -> dict[str, str]:
    """Heading text -> the body under it, for every ### entry."""
    parts = re.split(r"^### (.+?)(?: \{ #[^}]+ \})?$", PAGE.read_text(encoding="utf-8"), flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _legend_symbols() -> set[str]:
    """The letters of every shape legend: nn's docstring and DEVELOPING.md's."""
    symbols = set()
    for text in (glassllm.nn.__doc__, (ROOT / "DEVELOPING.md").read_text(encoding="utf-8")):
        legend = re.search(r"Shape legend(?::|[^\n]*\n\n)\s*(.+?)\.?(?:\n\n|$)", text, flags=re.S)
        assert legend, "no shape legend found"
        for item in re.split(r",\s*", legend.group(1)):
            symbols.add(item.split()[0])
        symbols |= set(re.findall(r"m = (\w+) \+ n", legend.group(1)))
    return symbols


def _anchors() -> set[str]:
    """Every anchor of the page: the explicit ``{ #id }`` ones and the headings' slugs."""
    text = PAGE.read_text(encoding="utf-8")
    explicit = set(re.findall(r"\{ #([^ }]+) \}", text))
    slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
             for h in re.findall(r"^#{2,3} (?!.*\{ #)(.+)$", text, flags=re.M)}
    return explicit | slugs


def test_every_shape_symbol_has_an_entry():
    symbols = _legend_symbols() | {"L", "T", "start"}
    assert {"B", "n", "m", "H", "G", "D", "C", "V", "F", "start"} <= symbols
    missing = symbols - set(_sections())
    assert not missing, f"no glossary entry for {sorted(missing)}"


def test_the_sizes_given_are_the_default_model_and_training():
    from glassllm.train import TrainConfig

    c, t = ModelConfig(), TrainConfig()
    s = _sections()
    expected = {"H": c.n_heads, "G": c.n_kv_heads, "D": c.head_dim, "C": c.dim, "V": f"{c.vocab_size:,}",
                "F": c.ffn_dim, "L": c.n_layers, "B": t.batch_size, "T": t.seq_len}
    for symbol, value in expected.items():
        assert re.search(rf"\b{value}\b", s[symbol]), (symbol, value, s[symbol])


def test_every_snapshot_name_has_an_entry_generated_from_the_registry():
    tool = _tool()
    text = PAGE.read_text(encoding="utf-8")
    block = text.split(tool.BEGIN, 1)[1].split(tool.END, 1)[0]
    assert block.strip() == tool.snapshot_entries().strip(), "regenerate: python -m tools.glossary docs/glossary.md"
    anchors = _anchors()
    for name in registry(ModelConfig(n_layers=2)):
        assert tool.anchor(name) in anchors, name


def test_the_terms_have_entries():
    missing = set(TERMS) - set(_sections())
    assert not missing, missing


@pytest.mark.parametrize("lesson", sorted((ROOT / "docs" / "lessons").glob("[0-9][0-9]-*.md")), ids=lambda p: p.stem)
def test_lessons_link_to_entries_that_exist_and_only_from_prose(lesson):
    text = lesson.read_text(encoding="utf-8")
    anchors = _anchors()
    links = re.findall(r"\]\(\.\./glossary\.md#([^)]+)\)", text)
    assert links, f"{lesson.name} links nothing in the glossary"
    assert not set(links) - anchors, set(links) - anchors
    for block in re.findall(r"^```.*?^```", text, flags=re.S | re.M):
        assert "glossary.md" not in block, block
