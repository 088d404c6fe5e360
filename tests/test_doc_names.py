"""Every dotted ``glassllm.`` name that README.md, DEVELOPING.md and docs/ quote resolves as a reader would
write it: ``import`` the longest prefix that is a module, then attribute access from ``glassllm`` down.

(``import glassllm.trace.names`` succeeding is not enough: ``glassllm.trace.names.transformer_lens_name`` is
looked up attribute by attribute from the package, which is how a reader's code spells it.)
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest
from tests.support.glassllm_testing import ROOT, missing_message, strict

from glassllm.optional import MissingExtra

DOCS = [ROOT / "README.md", ROOT / "DEVELOPING.md", *sorted((ROOT / "docs").rglob("*.md"))]
# "glassllm." then dotted identifiers, not inside a path or a longer word (src/glassllm/..., glassllm-numpy)
DOTTED = re.compile(r"(?<![\w/.-])glassllm(?:\.[A-Za-z_]\w*)+")


def quoted_names() -> dict[str, str]:
    """Each dotted name -> the first file and line that quotes it."""
    found: dict[str, str] = {}
    for path in DOCS:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in DOTTED.findall(line):
                name = re.sub(r"\.(py|md|json|safetensors|txt|npz)$", "", name)    # a file name, not an attribute
                found.setdefault(name, f"{path.relative_to(ROOT)}:{number}")
    return found


NAMES = quoted_names()


def resolve(name: str):
    """What ``name`` is when a reader imports its module part and reads the rest as attributes."""
    parts = name.split(".")
    module = importlib.import_module(parts[0])
    for depth in range(2, len(parts) + 1):                    # the longest prefix that is a module
        candidate = ".".join(parts[:depth])
        if not hasattr(module, "__path__") or importlib.util.find_spec(candidate) is None:
            break                                             # the rest are attributes
        module = importlib.import_module(candidate)
    value = importlib.import_module("glassllm")
    for depth, part in enumerate(parts[1:], 2):
        if not hasattr(value, part):
            raise AttributeError(f"{'.'.join(parts[:depth - 1])} has no attribute {part!r}")
        value = getattr(value, part)
    return value


def test_the_docs_quote_names():
    assert len(NAMES) > 30 and "glassllm.trace.names.transformer_lens_name" in NAMES


@pytest.mark.parametrize("name", sorted(NAMES))
def test_a_quoted_name_resolves(name):
    try:
        resolve(name)
    except MissingExtra as e:                                             # glassllm.torch without PyTorch
        if strict():
            pytest.fail(missing_message(e.name), pytrace=False)
        pytest.skip(missing_message(e.name))
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{NAMES[name]} quotes {name}, which does not resolve: {e}", pytrace=False)


def test_resolve_reads_attributes_from_the_package_down(monkeypatch):
    """The old trap: a package attribute that shadows its submodule of the same name."""
    import glassllm.trace

    assert resolve("glassllm.trace.names.transformer_lens_name") is glassllm.trace.names.transformer_lens_name
    monkeypatch.setattr(glassllm.trace, "names", lambda: [])
    with pytest.raises(AttributeError, match="glassllm.trace.names has no attribute 'transformer_lens_name'"):
        resolve("glassllm.trace.names.transformer_lens_name")
    with pytest.raises(AttributeError):
        resolve("glassllm.no_such_thing")
