"""Optional packages, behind one door: :func:`require` imports one or says which extra brings it.

glassllm's core needs NumPy alone. Plumbing that only some commands use (the
inspector's web server, progress bars, plots, the GGUF reader, the PyTorch
twin) comes with an *extra* of the ``glassllm-numpy`` distribution. Every
import of such a package goes through :func:`require`, so a missing one is a
single line naming the extra to install, which the ``glassllm`` command prints
with exit code 2::

    >>> gguf = require("gguf", "reading a GGUF file")          # doctest: +SKIP
    MissingExtra: reading a GGUF file needs the package gguf, which is not installed:
    pip install "glassllm-numpy[import]" (from a source checkout: pip install -e ".[import]")

(one line in reality). ``EXTRAS`` maps each optional module to the package that
provides it and the smallest extra that brings it.
"""

from __future__ import annotations

import importlib

__all__ = ["DISTRIBUTION", "EXTRAS", "MissingExtra", "require", "available", "install_hint"]

# The distribution's name on the package index (the import name and the command stay ``glassllm``).
DISTRIBUTION = "glassllm-numpy"

# top-level module -> (the package to install, the smallest extra of DISTRIBUTION that brings it)
EXTRAS: dict[str, tuple[str, str]] = {
    "gguf": ("gguf", "import"),
    "tqdm": ("tqdm", "app"),
    "matplotlib": ("matplotlib", "app"),
    "threadpoolctl": ("threadpoolctl", "app"),
    "fastapi": ("fastapi", "app"),
    "starlette": ("fastapi", "app"),
    "pydantic": ("pydantic", "app"),
    "uvicorn": ("uvicorn", "app"),
    "psutil": ("psutil", "app"),
    "anywidget": ("anywidget", "notebook"),
    "torch": ("torch", "torch"),
    "transformers": ("transformers", "hf"),
    "tokenizers": ("tokenizers", "hf"),
    "safetensors": ("safetensors", "dev"),
    "sentencepiece": ("sentencepiece", "dev"),
    "transformer_lens": ("transformer-lens", "dev"),
    "playwright": ("playwright", "dev"),
}


class MissingExtra(ModuleNotFoundError):
    """An optional package is not installed; the message is one line naming the extra that brings it.

    A ``ModuleNotFoundError`` (so ``except ImportError`` still catches it) whose ``name`` is the module.
    """


def install_hint(extra: str) -> str:
    """How to install ``extra``: from the package index, or from a source checkout."""
    return f'pip install "{DISTRIBUTION}[{extra}]" (from a source checkout: pip install -e ".[{extra}]")'


def require(module: str, purpose: str | None = None, extra: str | None = None):
    """Import and return ``module`` (``"matplotlib.pyplot"``, ``"gguf"``), or raise :class:`MissingExtra`.

    ``purpose`` says what needs it (``"glassllm inspect"``, ``"reading a GGUF file"``); ``extra`` overrides
    the extra named by :data:`EXTRAS`. Only a missing package becomes ``MissingExtra``: an installed
    package that fails while importing raises its own error.
    """
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] not in EXTRAS or isinstance(e, MissingExtra):
            raise
        missing = e.name.split(".")[0]
    package, default_extra = EXTRAS[missing]
    if missing != top:                                 # the module is there, one of its own dependencies is not
        package, default_extra = EXTRAS.get(top, (package, default_extra))
    raise MissingExtra(f"{purpose or module} needs the package {package}, which is not installed: "
                       f"{install_hint(extra or default_extra)}", name=missing) from None


def available(module: str) -> bool:
    """Can ``module`` be imported (without importing it)?"""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):                  # a missing parent package
        return False
