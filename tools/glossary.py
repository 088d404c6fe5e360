"""``python -m tools.glossary docs/glossary.md``: regenerate the snapshot entries of the glossary.

The entries are made from the tracer's registry (``glassllm.trace.registry``:
names, axes, descriptions), so the glossary lists exactly the names the model
records; tests/test_glossary.py checks that the page holds what this writes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

BEGIN = "<!-- BEGIN GENERATED: python -m tools.glossary docs/glossary.md -->"
END = "<!-- END GENERATED -->"


def anchor(name: str) -> str:
    """The glossary anchor of a snapshot name: ``layers.2.attn.softmax`` -> ``snap-attn.softmax``."""
    return "snap-" + re.sub(r"^layers\.(\d+|\{i\})\.", "", name)


def snapshot_entries() -> str:
    """One entry per snapshot name (``layers.{i}.`` standing for every block), in forward order."""
    from glassllm.trace.explain import equation, sites
    from glassllm.trace.registry import generic_names

    where = sites()
    entries = []
    for generic, axes, shape, description in generic_names():
        letters = ", ".join(axes) + ("," if len(axes) == 1 else "")
        sizes = ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "")
        entries.append(f"### `{generic}` {{ #{anchor(generic)} }}\n\n"
                       f"**{equation(generic)['text']}**. Axes ({letters}), shape ({sizes}) in the default model. "
                       f"{description[0].upper()}{description[1:]}. Recorded in `{where[generic].function}`.\n")
    return "\n".join(entries)


def write(path) -> None:
    from glassllm.checkpoint import atomic_write

    text = Path(path).read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"{str(path)!r} lacks the markers {BEGIN!r} ... {END!r}")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{snapshot_entries()}{END}{tail}"
    atomic_write(path, new.encode("utf-8"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tools.glossary docs/glossary.md")
    write(sys.argv[1])
