"""Run every lesson as a test: each ```python block executes, and the ```output
block printed under it must equal what the code prints.

How a lesson is written (Markdown, rendered by MkDocs)::

    ```python
    print(1 + 1)
    ```

    ```output
    2
    ```

Rules, enforced when a lesson is parsed (so a typo cannot silently turn a
check off):

- ``python`` blocks run in order in one namespace per lesson (a lesson reads
  top to bottom like a script). Whatever a block prints must be shown in the
  ``output`` block that follows it, with only blank lines in between; a block
  that prints something but shows no output fails.
- An ``output`` block must follow a ``python`` block; an orphan fails.
- Comparison is exact, line by line, except for trailing spaces and trailing
  blank lines. Lessons round what they print, so the text is the same on
  every machine.
- ``text`` blocks hold diagrams and formulas: they are not code and do not run.
  Any other fence language (``bash``, ``py`` ...) is refused, because it would
  look like code the suite checks when it is not.
- ``<!-- skip: start if(bundled_model_missing(), reason="...") -->`` ...
  ``<!-- skip: end -->`` (Sybil's skip directive) marks the parts that need the
  bundled, trained model; without it they are reported as skipped, with the
  reason. ``if(module_missing("torch"), ...)`` marks an optional aside that
  compares with a library a learner's install (``.[learn]``) lacks: it runs
  wherever that library is installed, as it is for the full test suite.

NumPy print options are restored after each lesson, so no lesson leaks its
formatting into another.
"""

from __future__ import annotations

import difflib
import importlib.util
import io
import re
from contextlib import redirect_stdout

import numpy as np
import pytest
from tests.support.glassllm_testing import missing_message, strict
from sybil import Region, Sybil
from sybil.parsers.markdown import SkipParser
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

RUN, SHOW, PROSE = "python", "output", "text"
_INFO = re.compile(r"(?P<info>[^\n]*)$\n", re.MULTILINE)


class LessonFormatError(ValueError):
    """A lesson breaks one of the rules in this module's docstring."""


class CodeAndOutputParser:
    """Yield one region per ``python`` block, spanning the ``output`` block under it if any."""

    def __init__(self):
        self.lexer = RawFencedCodeBlockLexer(info_pattern=_INFO)

    def __call__(self, document):
        blocks = list(self.lexer(document))
        shown_by_previous = set()
        for i, block in enumerate(blocks):
            language = block.lexemes["info"].strip()
            where = document.line_column(block.start)
            if language not in (RUN, SHOW, PROSE):
                raise LessonFormatError(
                    f"{document.path}, {where}: fence language {language!r} is not one of "
                    f"'python' (runs), 'output' (checked) or 'text' (diagram)")
            if language == SHOW and i not in shown_by_previous:
                raise LessonFormatError(f"{document.path}, {where}: an 'output' block must follow a 'python' block")
            if language != RUN:
                continue
            expected, end = None, block.end
            if i + 1 < len(blocks):
                after = blocks[i + 1]
                between = document.text[block.end:after.start]
                if after.lexemes["info"].strip() == SHOW and not between.strip():
                    expected, end = str(after.lexemes["source"]), after.end
                    shown_by_previous.add(i + 1)
            yield Region(block.start, end, (block.lexemes["source"], expected), self.evaluate)

    @staticmethod
    def evaluate(example) -> str | None:
        """Run the code; return a diff (a failure) when its printout differs from the lesson's."""
        source, expected = example.parsed
        padded = "\n" * (example.line + source.line_offset) + source  # tracebacks show lesson lines
        code = compile(padded, example.path, "exec", dont_inherit=True)
        buffer = io.StringIO()
        with redirect_stdout(buffer):
            exec(code, example.namespace)
        example.namespace.pop("__builtins__", None)
        actual = _normalise(buffer.getvalue())
        if expected is None:
            if actual:
                return f"this block printed text that the lesson does not show:\n{actual}"
            return None
        expected = _normalise(expected)
        if actual == expected:
            return None
        diff = difflib.unified_diff(expected.splitlines(), actual.splitlines(),
                                    "output shown in the lesson", "output printed by the code", lineterm="")
        return "\n".join(diff)


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def bundled_model_missing() -> bool:
    """True when the trained model that ships with glassllm is not installed."""
    from glassllm.checkpoint import bundled_model_path

    return not bundled_model_path().exists()


def module_missing(name: str) -> bool:
    """True when the module ``name`` (an optional reference such as ``torch``) cannot be imported.

    Under the test suite's skip policy (CI: :func:`glassllm_testing.strict`) a missing module fails the
    block instead, naming the package."""
    if importlib.util.find_spec(name) is not None:
        return False
    if strict():
        pytest.fail(missing_message(name), pytrace=False)
    return True


def _setup(namespace: dict) -> None:
    namespace["bundled_model_missing"] = bundled_model_missing
    namespace["module_missing"] = module_missing
    namespace["_print_options"] = np.get_printoptions()


def _teardown(namespace: dict) -> None:
    np.set_printoptions(**namespace["_print_options"])


pytest_collect_file = Sybil(
    parsers=[CodeAndOutputParser(), SkipParser()],
    patterns=["*.md"],
    setup=_setup,
    teardown=_teardown,
).pytest()
