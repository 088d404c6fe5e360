"""Code quoted in the docs is the code in the package, character for character.

A quotation is marked in Markdown by a comment naming the quoted object, right
above the fenced block that holds it::

    <!-- quote: glassllm.nn.Attention.__call__ -->
    ```text
    def __call__(self, ...):
        ...
    ```

The block must equal ``inspect.getsource`` of that object, dedented. Change the
source and the quote fails here until the docs follow.
"""

from __future__ import annotations

import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
QUOTE = re.compile(r"<!-- quote: (?P<name>[\w.]+) -->\n```\w*\n(?P<body>.*?)^```$", re.DOTALL | re.MULTILINE)


def _quotes():
    for path in sorted(DOCS.rglob("*.md")):
        for match in QUOTE.finditer(path.read_text(encoding="utf-8")):
            yield path.relative_to(DOCS).as_posix(), match["name"], match["body"]


def _resolve(dotted: str):
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ValueError(f"cannot import any prefix of {dotted!r}")


QUOTES = list(_quotes())


def test_lesson_4_quotes_the_attention_layer():
    assert ("lessons/04-causal-attention.md", "glassllm.nn.Attention.__call__") in {(p, n) for p, n, _ in QUOTES}


@pytest.mark.parametrize("path,name,body", QUOTES, ids=[f"{p}:{n}" for p, n, _ in QUOTES])
def test_quoted_code_equals_the_source(path, name, body):
    source = textwrap.dedent(inspect.getsource(_resolve(name)))
    assert body == source, f"{path} quotes {name}, which has changed: copy the source again"
