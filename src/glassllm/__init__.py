"""glassllm: a glass-box LLaMA-style language model in NumPy.

``glassllm.show(prompt)`` shows the inspector inline in a Jupyter notebook (see
:func:`glassllm.inspector.notebook.show`); it is imported on first use, so
``import glassllm`` needs NumPy alone.
"""

__version__ = "0.1.0"


def _interrupted_early(signum, frame):  # noqa: ARG001
    """Ctrl-C while the ``glassllm`` command is still importing: one line and exit 130, no traceback
    (:func:`glassllm.cli.main` puts Python's own handler back once it runs)."""
    import os

    os.write(2, b"glassllm: interrupted\n")
    os._exit(130)


def _catch_early_interrupts() -> None:
    """In the ``glassllm`` command only (not in a program that imports glassllm), and only when no other
    handler was chosen, let Ctrl-C during the first imports end the command with one line."""
    import signal
    import sys

    name = (sys.argv[0] if sys.argv else "").replace("\\", "/").rsplit("/", 1)[-1]
    if name in ("glassllm", "__main__.py") and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_early)


_catch_early_interrupts()


def show(prompt: str, model=None, tokenizer=None, **options):
    """The inspector for ``prompt``, inline in a notebook: see :func:`glassllm.inspector.notebook.show`."""
    # A call into the application layer (the inspector), looked up when called, as glassllm.inspector's own
    # lazy names are: importing glassllm imports nothing but this file.
    import importlib

    return importlib.import_module("glassllm.inspector.notebook").show(prompt, model, tokenizer, **options)
