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

import os
import signal
import sys


def _interrupted_early(signum, frame):  # noqa: ARG001
    """Ctrl-C while the ``glassllm`` command is still importing: one line and exit 130, no traceback
    (:func:`main` puts Python's own handler back once it runs)."""
    os.write(2, b"glassllm: interrupted\n")
    os._exit(130)


# First of all, in the glassllm command only (not in a program that imports this module), and only when
# no other handler was chosen: Ctrl-C during the imports below ends the command with one line.
if (os.path.basename(sys.argv[0] if sys.argv else "") in ("glassllm", "__main__.py")
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
    signal.signal(signal.SIGINT, _interrupted_early)

import argparse  # noqa: E402
import importlib  # noqa: E402

# Freed to make room for the last line when memory runs out (formatting a message needs a little).
_RESERVE = bytearray(1 << 20)

# Options whose values are files or folders, by their metavar: "" is refused for all of them.
PATH_METAVARS = ("FILE", "DIR", "PATH", "OUT", "MODEL")

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
    """Run one ``glassllm`` command; the exit code. Whatever happens, the user sees at most one line:
    Ctrl-C at any moment gives ``interrupted`` and 130, running out of memory (even while an error
    is being reported) ``not enough memory`` and 2."""
    global _RESERVE
    command = "glassllm"
    try:
        argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
        command = f"glassllm {argv[0]}" if argv and argv[0] in COMMANDS else "glassllm"
        return _main(argv)
    except KeyboardInterrupt:
        _last_line(f"{command}: interrupted")
        return 130
    except MemoryError:
        _RESERVE = None
        _last_line(f"{command}: error: not enough memory")
        return 2
    except RecursionError:
        _last_line(f"{command}: error: the input is nested too deeply")
        return 2
    except Exception as e:
        if _interrupted_inside(e):               # an import that turned Ctrl-C into an ImportError (NumPy's)
            _last_line(f"{command}: interrupted")
            return 130
        raise


def _interrupted_inside(e: BaseException) -> bool:
    """Did ``e`` arise from a Ctrl-C (a KeyboardInterrupt in its chain of causes)?"""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _last_line(text: str) -> None:
    """Write ``text`` and a newline to stderr with as little work as possible (no formatting of anything
    large: it may run when memory is exhausted)."""
    try:
        print(text, file=sys.stderr, flush=True)
        return
    except Exception:  # noqa: BLE001 -- no memory to format, or a broken stderr: write the bytes directly
        pass
    try:
        os.write(2, text.encode("utf-8", "replace") + b"\n")
    except (OSError, MemoryError):
        pass


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:                                   # said by the command's own parser: its name, its --help
        where = _subparser(parser, args.command) if getattr(args, "command", None) else parser
        where.error(f"unrecognized arguments: {' '.join(unknown)}")
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
    if signal.getsignal(signal.SIGINT) is _interrupted_early:   # imports done: Ctrl-C may now stop the work
        signal.signal(signal.SIGINT, signal.default_int_handler)  # cleanly (KeyboardInterrupt, caught above)
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
        global _RESERVE
        _RESERVE = None                          # room to format the line
        print(f"glassllm {args.command}: error: not enough memory: {_one_line(e)[:200]}", file=sys.stderr)
        return 2


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
