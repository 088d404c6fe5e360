"""The page's static files (``static/``), read from the installed package, for the server and the offline export.

No web framework here: the notebook view and the offline HTML file read the page through this module
alone, so they need no FastAPI.

The page's script is a set of plain scripts (``static/js/``, no build step), one per feature, run in the
order of :data:`SCRIPTS`: later ones use the names earlier ones define. That order is kept here only:
:func:`read_assets` writes the page's ``<script>`` tags from it, the server serves exactly these files,
and the export inlines them in the same order.
"""

from __future__ import annotations

from importlib import resources

from ..trace import colors

__all__ = ["ASSETS", "SCRIPTS", "SCRIPTS_MARK", "read_assets", "script_tag"]

# The page's scripts, in the order they run (each file's first lines say what it holds).
SCRIPTS = (
    "js/dom.js",
    "js/state.js",
    "js/api.js",
    "js/paint.js",
    "js/sampling.js",
    "js/controls.js",
    "js/prompt.js",
    "js/heatmap.js",
    "js/cells.js",
    "js/explain.js",
    "js/compare.js",
    "js/interventions.js",
    "js/next.js",
    "js/generate.js",
    "js/lens.js",
    "js/save.js",
    "js/stepthrough.js",
    "js/tabs.js",
    "js/map.js",
    "js/grid.js",
    "js/training.js",
    "js/main.js",
)

# The page's files and the content type each is served with.
ASSETS = {"index.html": "text/html; charset=utf-8", "style.css": "text/css; charset=utf-8",
          **{name: "text/javascript; charset=utf-8" for name in SCRIPTS}}

# The line of index.html that stands for the page's scripts.
SCRIPTS_MARK = "<!-- the page's scripts: glassllm.inspector.assets.SCRIPTS -->"


def script_tag(name: str) -> str:
    """The ``<script>`` element that loads script ``name`` (one of :data:`SCRIPTS`)."""
    return f'<script src="{name}"></script>'


def read_assets() -> dict[str, str]:
    """The page's files (:data:`ASSETS`), read from the installed package.

    In index.html, the scripts' line becomes the colour maps and hatching of :mod:`glassllm.trace.colors`
    as ``<script id="glass-colors" type="application/json">`` (which ``js/paint.js`` reads: the page,
    ``Trace.plot`` and the notebooks draw from the same definitions), then one ``<script>`` tag per script,
    in the order of :data:`SCRIPTS`.
    """
    folder = resources.files("glassllm.inspector") / "static"
    assets = {}
    for name in ASSETS:
        item = folder
        for part in name.split("/"):                  # one step at a time: a zipped package has no "a/b" step
            item = item / part
        assets[name] = item.read_text(encoding="utf-8")
    assert assets["index.html"].count(SCRIPTS_MARK) == 1, "index.html lost its scripts' line"
    palette = f'<script id="glass-colors" type="application/json">{colors.page_json()}</script>\n'
    tags = "\n".join(script_tag(name) for name in SCRIPTS)
    assets["index.html"] = assets["index.html"].replace(SCRIPTS_MARK, palette + tags)
    return assets
