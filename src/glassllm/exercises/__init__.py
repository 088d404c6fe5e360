"""Write-it-yourself exercises, each with a checker.

A student writes one function of the model in plain NumPy -- a stable
softmax, the causal mask, one attention head, RoPE on one vector, RMSNorm,
the backward of softmax -- starting from a stub, and the checker compares it
with glassllm's own code on random and edge-case inputs::

    glassllm check softmax --stub > softmax.py     # the stub to fill in
    glassllm check softmax softmax.py              # exit 0 if right, 1 with what is wrong

or, from Python or a notebook, ``glassllm.exercises.check("softmax", my_softmax)``.
The reference solutions live in :mod:`glassllm.exercises.solutions`.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from . import checks, solutions

__all__ = ["Exercise", "Result", "EXERCISES", "exercise", "check", "stub", "load_function"]


@dataclass(frozen=True)
class Exercise:
    """One exercise: the function a student writes, where its topic is taught, and its checker."""

    name: str                         # the function's name, and the name ``glassllm check`` takes
    title: str
    lesson: str                       # the lesson page that teaches it, relative to docs/
    run: Callable[[Callable], int]    # calls the student's function; raises checks.Wrong, or returns #cases

    @property
    def solution(self) -> Callable:
        return getattr(solutions, self.name)


EXERCISES = {e.name: e for e in (
    Exercise("softmax", "Softmax with a stable shift", "lessons/03-attention-first-principles.md",
             checks.check_softmax),
    Exercise("causal_mask", "The causal mask, with start", "lessons/04-causal-attention.md",
             checks.check_causal_mask),
    Exercise("attention_head", "One attention head", "lessons/04-causal-attention.md",
             checks.check_attention_head),
    Exercise("rope_vector", "RoPE on one vector", "lessons/05-rope.md", checks.check_rope_vector),
    Exercise("rms_norm", "RMSNorm", "lessons/02-embeddings-rmsnorm.md", checks.check_rms_norm),
    Exercise("softmax_backward", "The backward of softmax", "lessons/09-autograd.md",
             checks.check_softmax_backward),
)}


@dataclass(frozen=True)
class Result:
    """The checker's verdict: ``passed``, and a message of one or two lines."""

    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return self.message


def exercise(name: str) -> Exercise:
    """The exercise called ``name``; a one-line ValueError naming the known ones otherwise."""
    if name not in EXERCISES:
        raise ValueError(f"no exercise is named {name!r}; the exercises are {', '.join(EXERCISES)}")
    return EXERCISES[name]


def check(name: str, answer) -> Result:
    """Check ``answer`` -- a function, or the path of a Python file defining it -- for exercise ``name``.

    Returns a :class:`Result`. Bad usage (an unknown exercise, a missing file,
    a file without the function) raises ``ValueError`` or ``OSError`` instead:
    that is not a wrong answer.

    >>> from glassllm.exercises import check, solutions
    >>> check("softmax", solutions.softmax).passed
    True
    """
    ex = exercise(name)
    if callable(answer):
        f = answer
    else:
        f = load_function(answer, ex.name)
        if isinstance(f, Result):
            return f
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")       # overflow in exp: the message says it better
            n = ex.run(f)
    except checks.Wrong as wrong:
        return Result(False, f"{ex.name}: wrong: {wrong}")
    return Result(True, f"{ex.name}: right: all {n} cases agree with glassllm's own code")


def load_function(path, name: str):
    """The function ``name`` defined in the Python file at ``path``.

    A missing file or a folder is an ``OSError``; a file that is not UTF-8, holds a
    NUL byte or is not valid Python (a syntax error: nothing could run), or does not
    define ``name``, is a ``ValueError``. A file that fails while it runs (any
    exception at import, sys.exit and GeneratorExit too) is the student's answer
    failing: a failed :class:`Result`. Ctrl-C still stops the check.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(21, "is a folder, not a file", str(path))
    if not path.is_file():
        raise FileNotFoundError(2, "no such file", str(path))
    data = path.read_bytes()
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{str(path)!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at position "
                         f"{e.start}); expected a Python source file in UTF-8") from None
    nul = data.find(b"\0")
    if nul >= 0:                              # Python refuses such source before it reads a line of it
        line = len((data[:nul] + b"_").splitlines())    # the lines Python counts: \n, \r\n or \r ends one
        raise ValueError(f"{path.name} line {line}: a NUL byte (0x00) at position {nul}; expected Python "
                         "source text, which has no NUL bytes: remove it, then check again")
    try:
        compile(source, str(path), "exec")
    except SyntaxError as e:                  # nothing ran: the check could not start, it did not find a wrong answer
        raise ValueError(f"{path.name} line {e.lineno}: SyntaxError: {e.msg}: fix it, then check again") from None
    module_name = f"glassllm_exercise_{name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:                 # Ctrl-C stops the check, as it stops every command
        raise
    except BaseException as e:                # the student's file failed while it ran (sys.exit too)
        line = next((fr.lineno for fr in reversed(traceback.extract_tb(e.__traceback__))
                     if fr.filename == spec.origin), None)
        at = f" line {line}" if line else ""
        return Result(False, f"{name}: wrong: {path.name}{at} raised {checks.raised(e)}")
    finally:
        sys.modules.pop(module_name, None)
    f = getattr(module, name, None)
    if not callable(f):
        raise ValueError(f"{str(path)!r} defines no function {name}(); the exercise asks for "
                         f"def {name}{inspect.signature(getattr(solutions, name))}")
    return f


def stub(name: str) -> str:
    """The file a student starts from: the solution's signature and docstring, and no body."""
    ex = exercise(name)
    source = inspect.getsource(ex.solution)
    body = ast.parse(source).body[0].body
    head = "\n".join(source.splitlines()[:body[0].end_lineno])          # def line + docstring
    return (f'"""Exercise: {ex.title}.\n\n'
            f"Write {ex.name} below in plain NumPy, then check it:\n\n"
            f"    glassllm check {ex.name} {ex.name}.py\n"
            f'"""\n\nimport numpy as np\n\n\n{head}\n'
            f"    raise NotImplementedError  # replace this line with your code\n")
