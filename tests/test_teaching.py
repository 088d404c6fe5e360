"""The teachers' page (docs/teaching.md) names only commands, recipes, exercises and inspector names
that exist, and its plan adds up to the 50 minutes it promises."""

from __future__ import annotations

import re
from pathlib import Path

from glassllm.exercises import EXERCISES
from glassllm.trace.registry import DESCRIPTIONS
from glassllm.train import RECIPES

PAGE = Path(__file__).resolve().parents[1] / "docs" / "teaching.md"


def test_the_recipe_and_the_exercises_it_names_exist():
    text = PAGE.read_text(encoding="utf-8")
    for recipe in re.findall(r"--recipe (\w+)", text):
        assert recipe in RECIPES, recipe
    for name in re.findall(r"glassllm check (\w+)", text):
        assert name in EXERCISES, name
    for name in re.findall(r"`(attn\.\w+|mlp\.\w+|resid_\w+)`", text):
        assert name in DESCRIPTIONS, name


def test_the_segments_fill_fifty_minutes_without_gaps():
    rows = re.findall(r"^\| (\d+)–(\d+) \|", PAGE.read_text(encoding="utf-8"), flags=re.M)
    spans = [(int(a), int(b)) for a, b in rows]
    assert spans[0][0] == 0 and spans[-1][1] == 50
    assert all(end == start for (_, end), (start, _) in zip(spans, spans[1:])), spans
