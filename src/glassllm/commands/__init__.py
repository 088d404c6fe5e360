"""The ``glassllm`` command's subcommands, one module each: the command-line layer.

A command module provides ``add_cli(name, parser)``, which adds its options to
the argparse ``parser`` and sets ``parser.set_defaults(func=run)``;
``run(args)`` does the work through the library and returns an exit code.
:mod:`glassllm.cli` lists the modules (``COMMANDS``), builds the parser and
turns errors into one line on stderr and exit code 2.

Nothing below this layer knows about options or ``sys.argv``. A library
function that refuses a value raises :class:`~glassllm.checks.ParameterError`
naming its parameter (``top_k``); :func:`option_for` finds the option a user
typed for it (``--top-k``), so that the error line speaks of the flag.
"""

from __future__ import annotations

import argparse

__all__ = ["option_for", "load_model_option"]


def option_for(parser: argparse.ArgumentParser, param: str) -> str | None:
    """The option of ``parser`` that sets the library parameter ``param``, or None if it has none.

    The rule, for every command: parameter ``max_new_tokens`` is option ``--max-new-tokens``.

    >>> p = argparse.ArgumentParser()
    >>> _ = p.add_argument("--top-k", type=int)
    >>> option_for(p, "top_k"), option_for(p, "prompt")
    ('--top-k', None)
    """
    option = "--" + param.replace("_", "-")
    return option if option in parser._option_string_actions else None


def model_file(spec):
    """The path a model argument names: None or ``"bundled"`` is the bundled model, anything else a file."""
    from pathlib import Path

    from .. import checkpoint

    if spec is None or spec == "bundled":
        path = checkpoint.bundled_model_path()
        if not path.exists():
            said = "no --model FILE given and" if spec is None else "'bundled' names"
            raise ValueError(f"{said} the bundled model {str(path)!r}, which is missing from this installation; "
                             "name a model file")
        return path
    return Path(spec)


def load_model_option(path):
    """The model of a ``--model FILE`` option: ``(model, tokenizer, metadata)``; None or ``"bundled"`` = the
    bundled model."""
    from .. import checkpoint

    return checkpoint.load_model(model_file(path))
