"""MkDocs hook: put the inspector's exported HTML for one prompt into the site.

At build time it runs ``glassllm inspect PROMPT --html FILE`` on the bundled
model and adds the file to the site as ``inspector/export.html`` (the page
``inspector/index.md`` shows it). The export is generated, never committed.

If this installation has no inspector or no bundled model, a short page saying
so takes its place (logged at info level, so a strict build still passes);
``tests/test_docs_site.py`` insists on the real export whenever both exist.
If the inspector exists and the export fails, the build fails.
"""

from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

PROMPT = "Once upon a time there was a little dog"
TARGET = "inspector/export.html"
log = logging.getLogger("mkdocs.hooks.inspector_page")


def missing_parts() -> list[str]:
    """What this installation lacks for an export (empty when it can export)."""
    from glassllm.checkpoint import bundled_model_path

    missing = []
    if importlib.util.find_spec("glassllm.inspector") is None:
        missing.append("the inspector (glassllm.inspector)")
    if not bundled_model_path().exists():
        missing.append("the bundled model")
    return missing


def export_html(prompt: str = PROMPT) -> str:
    """The inspector's standalone HTML for ``prompt``, produced by the real command."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "export.html"
        cmd = [sys.executable, "-m", "glassllm.cli", "inspect", prompt, "--html", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not out.is_file():
            raise PluginError(f"`glassllm inspect --html` failed (exit {done.returncode}): "
                              f"{done.stderr.strip() or 'no file written'}")
        return out.read_text(encoding="utf-8")


def _placeholder(missing: list[str]) -> str:
    return ("<!doctype html><meta charset='utf-8'><title>glassllm inspector export</title>"
            f"<p>This build of the site has no inspector export: it lacks {' and '.join(missing)}.</p>")


def on_files(files, config):
    missing = missing_parts()
    if missing:
        log.info("inspector export skipped: missing %s", ", ".join(missing))
        html = _placeholder(missing)
    else:
        html = export_html()
    files.append(File.generated(config, TARGET, content=html))
    return files
