"""The browser inspector: a prompt opens into every layer, head and snapshot of the model.

Run it with ``glassllm inspect [PROMPT]`` (a local server; see :mod:`glassllm.commands.inspect`) or
write one self-contained, offline HTML file with ``glassllm inspect PROMPT --html FILE``.

Modules, one concept each:

- :mod:`.schema`  the requests the page may send, and the server's limits;
- :mod:`.data`    the data layer: runs and traces the model, answers requests;
- :mod:`.cache`   the trace cache: traced passes by model, prompt and intervention, bounded in bytes;
- :mod:`.server`  the FastAPI app and the uvicorn runner;
- :mod:`.auth`    the access token, the cookie, the server's own host names and origins;
- :mod:`.pool`    bounded work: the worker pool with its queue (503), the rate limit per client (429);
- :mod:`.connections`  a deadline for request headers and a cap on connections per address;
- :mod:`.export`  the offline HTML file (precomputed answers, inlined page);
- :mod:`.notebook`  the inspector inline in Jupyter, for a prompt or a recorded trace (:func:`show`);
- :mod:`.assets`  reading the page's static files (for the server, the export and the notebook view);
- ``static/``     the page itself: ``index.html``, ``style.css`` and the scripts in ``js/``, one feature
                  each, loaded in the order ``assets.SCRIPTS`` gives (canvas, no dependencies).

The names below are imported on first use, so that ``glassllm --help`` works
without the web dependencies (``pip install "glassllm-numpy[app]"``)::

    from glassllm.inspector import Inspector, Limits, create_app, export_html

In a notebook, :func:`show` is the entry point (``glassllm.show`` is the same).
"""

from __future__ import annotations

import importlib

__all__ = ["Inspector", "Limits", "create_app", "export_html", "show"]

_HOMES = {"Inspector": ".data", "Limits": ".schema", "create_app": ".server", "export_html": ".export"}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def show(prompt_or_trace, model=None, tokenizer=None, **options):
    """The inspector inline in a notebook, for a prompt (``show("Once upon a time")``: see
    :func:`glassllm.inspector.notebook.show` for ``model``, ``tokenizer`` and the options) or for a
    recorded :class:`~glassllm.trace.Trace` (``show(trace, tokenizer=tok)``: its own snapshots; the
    option is ``height``)."""
    from . import notebook

    if hasattr(prompt_or_trace, "steps") and hasattr(prompt_or_trace, "config"):
        if model is not None:
            raise TypeError("show(trace) takes no model: the trace holds its own numbers")
        return notebook.show_trace(prompt_or_trace, tokenizer, **options)
    return notebook.show(prompt_or_trace, model, tokenizer, **options)
