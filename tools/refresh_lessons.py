"""Rewrite the ``output`` blocks of lessons from what their code prints now.

For maintainers, after a change that moves a lesson's numbers on purpose (a new
bundled model, say). Each lesson's ``python`` blocks run top to bottom in one
namespace, as ``docs/lessons/conftest.py`` runs them under pytest; the
``output`` block under a block is replaced by the block's printout, and a block
that prints without showing an output block gets one. Prose is *not* touched:
read the printed diff and fix every sentence that quotes a number that moved.
An ``assert`` in a lesson that stops holding stops this tool too (the claim
around it needs rewriting, not a new number). Usage, from the repository root::

    python -m tools.refresh_lessons docs/lessons/11-reading-heads.md [more.md ...]
    python -m tools.refresh_lessons --check docs/lessons/*.md     # report only, exit 1 on a difference
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import re
import sys
from pathlib import Path

import numpy as np

FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```\n", re.MULTILINE | re.DOTALL)


def blocks(text: str):
    """(language, body, start, end) of every fenced block, in order."""
    return [(m["lang"], m["body"], m.start(), m.end()) for m in FENCE.finditer(text)]


def refresh(path: Path) -> tuple[str, str]:
    """The lesson's text, and the text with every output block made equal to its code's printout."""
    text = path.read_text(encoding="utf-8")
    found = blocks(text)
    namespace = {"bundled_model_missing": lambda: False, "__name__": "__lesson__"}
    saved = np.get_printoptions()
    edits = []  # (start, end, replacement)
    try:
        for i, (lang, body, start, end) in enumerate(found):
            if lang != "python":
                continue
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(body, f"{path}:block {i}", "exec"), namespace)
            printed = "\n".join(line.rstrip() for line in out.getvalue().rstrip().splitlines())
            following = found[i + 1] if i + 1 < len(found) else None
            shown = following is not None and following[0] == "output" and not text[end:following[2]].strip()
            if shown:
                edits.append((following[2], following[3], f"```output\n{printed}\n```\n" if printed else ""))
            elif printed:
                edits.append((end, end, f"\n```output\n{printed}\n```\n"))
    finally:
        np.set_printoptions(**saved)
    new = text
    for start, end, replacement in reversed(edits):
        new = new[:start] + replacement + new[end:]
    return text, new


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lessons", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="only report differences (exit 1 if any)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")
    changed = 0
    for path in args.lessons:
        old, new = refresh(path)
        if old == new:
            print(f"{path}: unchanged")
            continue
        changed += 1
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                   f"{path} (now)", f"{path} (printed)"))
        if not args.check:
            path.write_text(new, encoding="utf-8")
            print(f"{path}: output blocks rewritten -- now check the prose around them")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
