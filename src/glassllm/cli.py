"""The ``glassllm`` command.

Each subcommand is a module of :mod:`glassllm.commands` listed in ``COMMANDS``:
it provides ``add_cli(name, parser)``, which adds its options and sets
``parser.set_defaults(func=...)``; ``func(args)`` returns an exit code.

Bad input never shows a traceback: a ``ValueError``/``TypeError`` (or an
``OSError``: a missing file, a folder that cannot be written; a ``MemoryError``:
a model or batch too large for this machine; an ``OverflowError``) becomes one
line on stderr and exit code 2, as argparse does for bad options. An empty
string where a file or folder is expected is refused before any work (it would
otherwise mean the current folder). A library error that names a parameter
(:class:`~glassllm.checks.ParameterError`) names the option that set it instead:
``--top-k``, not ``top_k`` (:func:`glassllm.commands.option_for`). A command that needs an optional
package which is not installed says which extra brings it, in one line, with exit code 2
(:class:`glassllm.optional.MissingExtra`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Options whose values are files or folders, by their metavar: "" is refused for all of them.
PATH_METAVARS = ("FILE", "DIR", "PATH", "OUT")

# subcommand -> (module that implements it, one-line help)
COMMANDS = {
    "generate": ("glassllm.commands.generate", "write text with a model, token by token"),
    "inspect": ("glassllm.commands.inspect", "open the browser inspector on a prompt"),
    "train": ("glassllm.commands.train", "train a model (and its tokenizer) on text files"),
    "eval": ("glassllm.commands.eval", "held-out loss, perplexity and bits per byte of a model"),
    "tokenize": ("glassllm.commands.tokenize", "train a tokenizer, or show how one splits text"),
    "export": ("glassllm.commands.export", "export a model file to another format (Hugging Face)"),
    "import": ("glassllm.commands.import_model", "open a Llama you have (Hugging Face folder, GGUF, llama2.c) as a model file"),
    "import-hf": ("glassllm.commands.import_model", "import a Hugging Face Llama folder as a model file (as import)"),
    "trace": ("glassllm.commands.trace", "print one snapshot of a forward pass: a labelled matrix, JSON or .npy"),
    "snapshots": ("glassllm.commands.trace", "list every snapshot name with its shape and equation"),
    "check": ("glassllm.commands.check", "check your answer to a write-it-yourself exercise"),
}

# Commands that run the model step after step: freed activations stay mapped for reuse (glassllm.heap).
# Not inspect: its server keeps a trace cache, and gives back what each computation freed instead.
KEEP_FREED_MEMORY = ("train", "eval", "generate")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: the problem and where to look, not the whole usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(
        prog="glassllm",
        description="A glass-box LLaMA-style language model: see and change every number it computes.",
    )
    parser.add_argument("--version", action="version", version=f"glassllm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and (e.name == module_name or module_name.startswith(e.name + ".")):
                continue  # that part of glassllm is not built yet
            raise
        sp = sub.add_parser(name, help=help_text, description=help_text)
        module.add_cli(name, sp)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = ["glassllm", *argv]       # what was typed, for the records a command keeps
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    empty = _empty_path_option(parser, args)
    if empty:
        print(f"glassllm {args.command}: error: {empty}: empty path; name a file or folder", file=sys.stderr)
        return 2
    import numpy as np

    from .checks import ParameterError
    from .commands import option_for
    from .optional import MissingExtra

    if args.command in KEEP_FREED_MEMORY:
        from .heap import keep_freed_memory
        keep_freed_memory()
    try:
        # NumPy's overflow warnings would only add noise: a NaN or an infinity that matters is
        # caught where it arises and reported as one line (generate, eval, train check for them).
        with np.errstate(all="ignore"):
            return int(args.func(args) or 0)
    except BrokenPipeError:
        return 0
    except ParameterError as e:                  # named by the option that set it, when one did
        sub = _subparser(parser, args.command)
        option = option_for(sub, e.param)
        text = e.as_option(option, lambda name: option_for(sub, name) or name) if option else e
        print(f"glassllm {args.command}: error: {_one_line(text)}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError, OverflowError, MissingExtra) as e:
        print(f"glassllm {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except MemoryError as e:
        print(f"glassllm {args.command}: error: not enough memory: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"glassllm {args.command}: interrupted", file=sys.stderr)
        return 130


def _empty_path_option(parser: argparse.ArgumentParser, args) -> str | None:
    """The option (``--out``, ``DIR``) given an empty string where a path belongs, or None."""
    for action in _subparser(parser, args.command)._actions:
        if action.metavar not in PATH_METAVARS:
            continue
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values):
            return action.option_strings[-1] if action.option_strings else action.metavar
    return None


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _one_line(e) -> str:
    """The error as one line: an OSError names its file and the system's reason."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename!r}: {e.strerror}" if e.filename else e.strerror
    return " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
