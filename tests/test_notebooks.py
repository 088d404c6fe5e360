"""The notebooks run end to end, clean, and draw their figures.

Each notebook is executed with nbclient in a fresh Jupyter kernel, in a copy
(the committed file is never rewritten). A cell that raises fails the test;
the notebooks' own ``assert`` cells check what the figures must show. We then
require the figures themselves: image/png outputs, one per ``plt.show()``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _execute(path: Path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return nb


def _outputs(nb):
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]


def test_attention_notebook_runs_and_draws_its_figures():
    path = NOTEBOOKS / "attention.ipynb"
    nb = _execute(path)
    outputs = _outputs(nb)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    # Figures: the PNG outputs, apart from the inline inspector's (its static picture rides with its HTML).
    figures = [o for o in outputs if "image/png" in o.get("data", {}) and "text/html" not in o.get("data", {})]
    shows = sum(cell.source.count("plt.show()") for cell in nb.cells if cell.cell_type == "code")
    assert shows >= 4
    assert len(figures) == shows, f"{len(figures)} figures drawn for {shows} plt.show() calls"
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    from glassllm.checkpoint import bundled_model_path

    if bundled_model_path().exists():  # part 2 must then show the trained heads, not the fallback
        assert "the bundled model:" in text and "MISSING" not in text
        # ... and the inspector inline: the offline page in a frame (tests/test_inspector_notebook.py draws one)
        inline = [o for o in outputs if "glass-data" in o.get("data", {}).get("text/html", "")]
        assert len(inline) == 1 and inline[0]["data"]["text/html"].startswith("<iframe")
        assert "image/png" in inline[0]["data"]                  # its picture, for where the page cannot run


def test_committed_notebooks_carry_no_outputs():
    """Outputs are produced by running the notebook, never stored: no stale numbers in the repo."""
    nbformat = pytest.importorskip("nbformat")
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        stored = [c for c in nb.cells if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
        assert not stored, f"{path.name} has stored outputs; clear them before committing"
