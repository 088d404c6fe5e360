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

This module imports nothing from glassllm.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ParameterError", "ParameterTypeError", "is_int", "is_number"]


class ParameterError(ValueError):
    """A bad value for one named parameter.

    ``param``   the parameter's name as the function or config spells it (``"top_k"``).
    ``problem`` what is wrong with the value and what was expected, worded for any caller
                (``"must be >= 1, got 0"``); the message is ``"{param} {problem}"``.
    ``owner``   the class whose field it is, if any (``"TrainConfig"``): the message then
                starts ``"TrainConfig.seq_len"``.
    ``api_problem``  the wording for Python callers when it differs, because the function also
                accepts what a command-line option cannot give (``"... or None, got 0"``).
    """

    def __init__(self, param: str, problem: str, *, owner: str = "", api_problem: str | None = None):
        self.param = param
        self.problem = problem
        self.owner = owner
        super().__init__(f"{owner + '.' if owner else ''}{param} {api_problem or problem}")

    def __reduce__(self):                       # picklable, like any exception
        return _rebuild, (type(self), self.param, self.problem, self.owner, self.args[0])

    def as_option(self, option: str) -> str:
        """The message, with the parameter called ``option`` (a command line's ``--top-k``)."""
        return f"{option} {self.problem}"


class ParameterTypeError(ParameterError, TypeError):
    """A parameter of the wrong type. It is both a ``ValueError`` and a ``TypeError``,
    so callers that catch ``ValueError`` for every bad parameter catch this too."""


def _rebuild(cls, param, problem, owner, message):
    e = cls(param, problem, owner=owner)
    e.args = (message,)
    return e


def is_int(x) -> bool:
    """Is ``x`` an integer (a Python or NumPy int, not a bool)?"""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def is_number(x) -> bool:
    """Is ``x`` a real number (a Python or NumPy int or float, not a bool)?"""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
