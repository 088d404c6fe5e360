"""Bad parameters, at the ground floor: the error a library function raises for one, and type tests.

A function that refuses a value of one of its parameters raises
:class:`ParameterError` (a ``ValueError``), or :class:`ParameterTypeError`
(both a ``ValueError`` and a ``TypeError``) for a value of the wrong type. The
error carries the parameter's name, so that a caller who knows the parameter
by another name can say the same thing in its own words: the ``glassllm``
command shows ``--top-k must be in [1, 1024] (the vocabulary), got 0`` where
the library says ``top_k must be in [1, 1024] (the vocabulary) or None, got 0``
(:mod:`glassllm.commands` maps names to options, in one place).

>>> e = ParameterError("top_k", "must be in [1, 1024], got 0", api_problem="must be in [1, 1024] or None, got 0")
>>> str(e), e.param, e.as_option("--top-k")
('top_k must be in [1, 1024] or None, got 0', 'top_k', '--top-k must be in [1, 1024], got 0')
>>> str(ParameterError("dim", "must be >= 1, got 0", owner="ModelConfig"))
'ModelConfig.dim must be >= 1, got 0'
>>> e = ParameterError("short_seq_len", "must be below {seq_len} (256), got 300", refs=("seq_len",))
>>> str(e), e.as_option("--short-seq-len", lambda name: "--" + name.replace("_", "-"))
('short_seq_len must be below seq_len (256), got 300', '--short-seq-len must be below --seq-len (256), got 300')
>>> str(ParameterError("lr", "=1e+308 is too large"))
'lr=1e+308 is too large'

:func:`check_int` is the one check of an integer parameter:

>>> check_int("steps", 3, low=1)
3
>>> check_int("top_k", 0, low=1, high=1024)
Traceback (most recent call last):
glassllm.checks.ParameterError: top_k must be in [1, 1024], got 0
>>> check_int("batch", 2.0)
Traceback (most recent call last):
glassllm.checks.ParameterTypeError: batch must be an int, got 2.0
>>> check_int("steps", 2.5, low=1)
Traceback (most recent call last):
glassllm.checks.ParameterTypeError: steps must be an int >= 1, got 2.5
>>> check_int("height", 10, low=200, high=4000, note="pixels")
Traceback (most recent call last):
glassllm.checks.ParameterError: height must be in [200, 4000] (pixels), got 10
>>> check_int("dim", "128", low=1, owner="ModelConfig")
Traceback (most recent call last):
glassllm.checks.ParameterTypeError: ModelConfig.dim must be an int >= 1, got '128'
>>> check_int("port", np.int64(8080), low=0, high=65535)    # a NumPy integer is an int too
8080

This module imports nothing from glassllm.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ParameterError", "ParameterTypeError", "is_int", "is_number", "check_int", "shown"]


class ParameterError(ValueError):
    """A bad value for one named parameter.

    ``param``   the parameter's name as the function or config spells it (``"top_k"``).
    ``problem`` what is wrong with the value and what was expected, worded for any caller
                (``"must be >= 1, got 0"``); the message is ``"{param} {problem}"`` (no space
                when the problem starts with ``=``: ``"lr=1e+308 is too large"``).
    ``owner``   the class whose field it is, if any (``"TrainConfig"``): the message then
                starts ``"TrainConfig.seq_len"``.
    ``api_problem``  the wording for Python callers when it differs, because the function also
                accepts what a command-line option cannot give (``"... or None, got 0"``).
    ``refs``    other parameters the problem names, as ``{name}`` fields of ``problem``: each
                is shown as its name, or as a command line's option by :meth:`as_option`.
    """

    def __init__(self, param: str, problem: str, *, owner: str = "", api_problem: str | None = None,
                 refs: tuple[str, ...] = ()):
        self.param = param
        self.problem = problem
        self.owner = owner
        self.refs = tuple(refs)
        super().__init__(_join(f"{owner + '.' if owner else ''}{param}", self._named(api_problem or problem, str)))

    def __reduce__(self):                       # picklable, like any exception
        return _rebuild, (type(self), self.param, self.problem, self.owner, self.refs, self.args[0])

    def as_option(self, option: str, option_of=None) -> str:
        """The message, with the parameter called ``option`` (a command line's ``--top-k``), and
        each parameter in ``refs`` called ``option_of(name)`` (default: its own name)."""
        return _join(option, self._named(self.problem, option_of or str))

    def _named(self, text: str, name_of) -> str:
        return text.format_map({r: name_of(r) for r in self.refs}) if self.refs else text


class ParameterTypeError(ParameterError, TypeError):
    """A parameter of the wrong type. It is both a ``ValueError`` and a ``TypeError``,
    so callers that catch ``ValueError`` for every bad parameter catch this too."""


def _join(name: str, problem: str) -> str:
    return f"{name}{'' if problem.startswith('=') else ' '}{problem}"


def _rebuild(cls, param, problem, owner, refs, message):
    e = cls(param, problem, owner=owner, refs=refs)
    e.args = (message,)
    return e


def is_int(x) -> bool:
    """Is ``x`` an integer (a Python or NumPy int, not a bool)?"""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def is_number(x) -> bool:
    """Is ``x`` a real number (a Python or NumPy int or float, not a bool)?"""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def check_int(name: str, x, low: int | None = None, high: int | None = None, *, none: bool = False,
              owner: str = "", note: str = "") -> int | None:
    """``x`` as a Python int, when it is an integer (not a bool) in [low, high] (either bound may be None).

    Otherwise raises :class:`ParameterTypeError` for a value that is not an integer (``"steps must be
    an int >= 1, got 2.5"``) or :class:`ParameterError` for one out of range (``"steps must be >= 1,
    got 0"``), naming parameter ``name`` (of class ``owner``, if given: ``"ModelConfig.dim must be >= 1,
    got 0"``). ``note`` says what the range means, in parentheses after it (``"pixels"``: ``"height must
    be in [200, 4000] (pixels), got 10"``). With ``none=True`` None is accepted and returned.
    """
    if x is None and none:
        return None
    if low is not None and high is not None:
        span = f" in [{low}, {high}]"
    elif low is not None or high is not None:
        span = f" >= {low}" if low is not None else f" <= {high}"
    else:
        span = ""
    span += f" ({note})" if note else ""
    if not is_int(x):
        raise ParameterTypeError(name, f"must be an int{span}{' or None' if none else ''}, got {x!r:.60}",
                                 owner=owner)
    if (low is not None and x < low) or (high is not None and x > high):
        raise ParameterError(name, f"must be{span}, got {int(x)}", owner=owner)
    return int(x)


def shown(value, limit: int = 40) -> str:
    """``repr(value)`` cut to about ``limit`` characters: an error line never echoes a whole request.

    >>> shown("x" * 100, 10)
    "'xxxxxxx...'"
    """
    if isinstance(value, str) and len(value) >= limit:
        return repr(value[:limit - 3] + "...")
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
