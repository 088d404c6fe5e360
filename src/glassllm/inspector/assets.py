"""The page's static files (``static/``), read from the installed package, for the server and the offline export.

No web framework here: the notebook view and the offline HTML file read the page through this module
alone, so they need no FastAPI.
"""

from __future__ import annotations

from importlib import resources

from ..trace import colors

__all__ = ["ASSETS", "read_assets"]

# The page's files and the content type each is served with.
ASSETS = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "style.css": "text/css; charset=utf-8"}


def read_assets() -> dict[str, str]:
    """The page's three files, read from the installed package.

    index.html gets the colour maps and hatching of :mod:`glassllm.trace.colors`
    as ``<script id="glass-colors" type="application/json">``, which app.js reads:
    the page, ``Trace.plot`` and the notebooks draw from the same definitions.
    """
    folder = resources.files("glassllm.inspector") / "static"
    assets = {name: (folder / name).read_text(encoding="utf-8") for name in ASSETS}
    tag = '<script src="app.js"></script>'
    assert assets["index.html"].count(tag) == 1, "index.html lost its script tag"
    palette = f'<script id="glass-colors" type="application/json">{colors.page_json()}</script>\n'
    assets["index.html"] = assets["index.html"].replace(tag, palette + tag)
    return assets
