"""The browser inspector: a prompt opens into every layer, head and snapshot of the model.

Run it with ``glassllm inspect [PROMPT]`` (a local server; see :mod:`.cli`) or
write one self-contained, offline HTML file with ``glassllm inspect PROMPT --html FILE``.

Modules, one concept each:

- :mod:`.schema`  the requests the page may send, and the server's limits;
- :mod:`.data`    the data layer: runs and traces the model, answers requests;
- :mod:`.server`  the FastAPI app and the uvicorn runner;
- :mod:`.export`  the offline HTML file (precomputed answers, inlined page);
- :mod:`.cli`     the ``glassllm inspect`` command;
- ``static/``     the page itself: ``index.html``, ``app.js``, ``style.css`` (canvas, no dependencies).

>>> from glassllm.inspector import Inspector, create_app, export_html   # doctest: +SKIP
"""

from .data import Inspector
from .schema import Limits

__all__ = ["Inspector", "Limits", "create_app", "export_html"]


def create_app(*args, **kwargs):
    """See :func:`glassllm.inspector.server.create_app` (imported lazily: it needs FastAPI)."""
    from .server import create_app as make

    return make(*args, **kwargs)


def export_html(*args, **kwargs):
    """See :func:`glassllm.inspector.export.export_html`."""
    from .export import export_html as write

    return write(*args, **kwargs)
