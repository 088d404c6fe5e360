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


def test_the_exit_question_agrees_with_a_real_cached_generation():
    """The question's step (the one that predicts the k-th token) has the n, start and m of its answer in
    glassllm's own generation records, and the keys it may read are those of its causal-mask row."""
    import numpy as np

    from glassllm.nn import Transformer, causal_mask
    from glassllm.config import ModelConfig
    from glassllm.generate import generate
    from glassllm.tokenizer import Tokenizer

    text = PAGE.read_text(encoding="utf-8").split("Exit question", 1)[1]
    k = int(re.search(r"write the (\d+)th token", text).group(1))
    fed = int(re.search(r"feeds it the (\d+)th token", text).group(1))
    n, start, m = map(int, re.search(r"\(n = (\d+), start = (\d+), m = (\d+);", text).groups())
    first, last = map(int, re.search(r"positions (\d+) to (\d+)\.\)", text).groups())
    tok = Tokenizer.train(["the cat sat on the mat. " * 20], vocab_size=262)
    model = Transformer(ModelConfig(vocab_size=tok.vocab_size, dim=16, n_layers=1, n_heads=2, n_kv_heads=1,
                                    ffn_dim=16, max_seq_len=32), seed=0)
    prompt = tok.decode([tok.encode("the")[0]])
    assert len(tok.encode_prompt(prompt)) == 1
    records = list(generate(model, tok, prompt, max_new_tokens=k, temperature=0))
    # Token 1 is the prompt; records[j] is the token at position j + 1, i.e. token j + 2.
    step = records[k - 2]
    assert (step.n, step.start, step.m) == (n, start, m)
    assert fed == start + 1                            # the token it feeds sits at position start
    allowed = np.flatnonzero(~causal_mask(n, m, start)[0])
    assert (allowed[0], allowed[-1]) == (first, last)
