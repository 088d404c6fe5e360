"""glassllm.show(prompt, live=True): the inspector as a widget whose requests a real kernel computes.

The kernel side is checked by itself (every request kind answered as the server answers it, a bad one
refused in one line), then end to end in Chromium: the test starts JupyterLab on a notebook whose cell
makes the widget, runs the cell from the page, and anywidget's own front end renders it; in the
widget's page an ablation that nothing precomputed changes the next-token bars to the numbers
``trace`` computes for it.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from glassllm.checkpoint import bundled_model_path
from tests.test_inspector_browser import browser  # noqa: F401  (a fixture: Chromium, or a skip saying why)

PROMPT = "Once upon a time there was a little dog"
needs_bundled = pytest.mark.skipif(not bundled_model_path().exists(), reason="needs the bundled model")


def _softmax64(z, T):
    z = np.asarray(z, dtype=np.float64) / T
    e = np.exp(z - z.max())
    return e / e.sum()


@needs_bundled
def test_the_kernel_answers_every_request_as_the_server_does():
    pytest.importorskip("anywidget")
    pytest.importorskip("fastapi")
    import glassllm
    from glassllm.checkpoint import load_bundled
    from glassllm.inspector import Inspector
    from glassllm.inspector.schema import NextRequest, SnapshotRequest

    view = glassllm.show(PROMPT, live=True)
    sent = []
    view.send = sent.append                                    # what would go to the front end
    model, tokenizer, meta = load_bundled()
    server_side = Inspector(model, tokenizer, meta=meta)
    ask = {"prompt": PROMPT, "intervention": {"kind": "ablate", "layer": 3, "head": 1}}
    view._on_request(view, {"id": 7, "kind": "next", "body": ask}, [])
    assert sent[-1]["id"] == 7
    assert sent[-1]["answer"] == server_side.next_token(NextRequest(**ask))
    body = {"prompt": PROMPT, "name": "blocks.1.attn.hook_pattern", "head": 2, "step": 3}
    view._on_request(view, {"id": 8, "kind": "snapshot", "body": body}, [])
    assert sent[-1]["answer"] == server_side.snapshot(SnapshotRequest(**body))
    view._on_request(view, {"id": 9, "kind": "info", "body": None}, [])
    assert sent[-1]["answer"]["prompt"] == PROMPT and sent[-1]["answer"]["names"] == server_side.info()["names"]
    view._on_request(view, {"id": 10, "kind": "snapshot", "body": {"prompt": PROMPT, "name": "attn.nope", "layer": 0}}, [])
    assert sent[-1] == {"id": 10, "error": sent[-1]["error"]} and "unknown snapshot 'attn.nope'" in sent[-1]["error"]
    view._on_request(view, {"id": 11, "kind": "delete", "body": {}}, [])
    assert sent[-1]["error"].startswith("unknown request kind 'delete'")
    assert 'id="glass-data"' not in view.page and 'id="glass-kernel"' in view.page      # nothing precomputed
    with pytest.raises(ValueError, match="live must be True or False"):
        glassllm.show(PROMPT, live="yes")


@needs_bundled
def test_an_error_inside_the_model_is_answered_in_one_line_and_logged(monkeypatch, caplog):
    """The page waits for an answer to every request it sends: a bug gets one too, as the server's 500."""
    pytest.importorskip("anywidget")
    pytest.importorskip("fastapi")
    import glassllm

    view = glassllm.show(PROMPT, live=True)
    sent = []
    view.send = sent.append

    def broken(req):
        raise KeyError("layers.9")
    monkeypatch.setattr(view.inspector, "next_token", broken)
    with caplog.at_level("ERROR", logger="glassllm.inspector"):
        view._on_request(view, {"id": 3, "kind": "next", "body": {"prompt": PROMPT}}, [])
    assert sent == [{"id": 3, "error": "internal error (KeyError); see the kernel's log"}]
    assert "internal error on a 'next' request" in caplog.text and "KeyError: 'layers.9'" in caplog.text
    view._on_request(view, {"id": 4, "kind": "info", "body": None}, [])
    assert sent[-1]["id"] == 4 and sent[-1]["answer"]["prompt"] == PROMPT      # the view still answers


# ---------------------------------------------------------------------------------------------- in Chromium

@needs_bundled
@pytest.mark.browser
@pytest.mark.slow                     # JupyterLab, a kernel and Chromium start: about 40 s on a loaded machine
def test_a_live_widget_in_jupyterlab_computes_an_ablation_in_the_kernel(tmp_path, browser):
    """JupyterLab, its kernel and anywidget's front end: every answer the widget's page shows comes from
    the kernel (nothing is precomputed), the ablation's included."""
    pytest.importorskip("anywidget")
    pytest.importorskip("jupyterlab")
    nbformat = pytest.importorskip("nbformat")
    import secrets
    import socket
    import subprocess
    import sys
    import urllib.request

    from glassllm.checkpoint import load_bundled
    from glassllm.trace import ZeroAblate, trace

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        f"import glassllm\nglassllm.show({PROMPT!r}, live=True)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "live.ipynb")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    lab = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--allow-root", "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "MPLBACKEND": "Agg"})
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise AssertionError("JupyterLab did not start")
        errors = []
        page = browser.new_page()
        try:
            page.goto(f"{base}/lab/tree/live.ipynb?token={token}")
            page.wait_for_selector(".jp-Notebook .jp-Cell .cm-content", timeout=120_000)
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
            for _ in range(600):                                  # the kernel is up and idle
                with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=10) as r:
                    sessions = json.loads(r.read())
                if sessions and (sessions[0].get("kernel") or {}).get("execution_state") == "idle":
                    break
                time.sleep(0.2)
            page.click(".jp-Notebook .jp-Cell .cm-content")
            page.keyboard.press("Shift+Enter")
            try:
                page.wait_for_selector("iframe.glassllm-inspector", timeout=180_000)
            except Exception:
                page.screenshot(path=str(tmp_path / "jupyterlab.png"))
                raise AssertionError(f"no widget in the notebook; the page is in {tmp_path / 'jupyterlab.png'}")
            inner, deadline = None, time.monotonic() + 240      # the kernel loads the model, then traces
            while inner is None and time.monotonic() < deadline:
                inner = next((f for f in page.frames if f.url == "about:srcdoc"
                              and f.evaluate("() => !!(window.glass && window.glass.ready && window.glass.next)")),
                             None)
                # Not time.sleep: Playwright's sync API takes in the browser's events only while one of its calls
                # runs. A frame that JupyterLab showed before its srcdoc page arrived keeps the URL '' in
                # page.frames through any number of sleeps, and this loop would wait for nothing.
                page.wait_for_timeout(200)
            if not inner:                                         # say what the page shows, for the next look
                page.screenshot(path=str(tmp_path / "jupyterlab.png"))
                states = [f.evaluate("() => ({ready: !!(window.glass && window.glass.ready), next: !!(window.glass"
                                     " && window.glass.next), errors: Array.from(document.querySelectorAll("
                                     "'[id$=\"-error\"]')).map((e) => e.textContent).filter(Boolean)})")
                          for f in page.frames if f.url == "about:srcdoc"]
                raise AssertionError(f"the widget's inspector never became ready: {states}; "
                                     f"the page is in {tmp_path / 'jupyterlab.png'}")
            assert inner.evaluate("() => document.getElementById('mode-line').textContent").startswith(
                "live: this notebook's kernel")
            inner.evaluate("() => window.glass.intervene({kind: 'ablate', layer: 2, head: 1})")
            inner.evaluate("() => window.glass.idle()")
            got = inner.evaluate("() => ({b: Array.from(window.glass.next.before), a: Array.from(window.glass.next.after),"
                                 " T: window.glass.next.temperature})")
            errors = inner.evaluate("() => document.getElementById('view-error').hidden ? [] : "
                                    "[document.getElementById('view-error').textContent]")
        finally:
            page.close()
        assert not errors, errors
        model, tokenizer, _ = load_bundled()
        ids = tokenizer.encode_prompt(PROMPT)
        before = trace(model, ids).logits[-1]
        after = trace(model, ids, interventions=[ZeroAblate(2, 1)]).logits[-1]
        np.testing.assert_allclose(got["b"], _softmax64(before, got["T"]), rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(got["a"], _softmax64(after, got["T"]), rtol=1e-6, atol=1e-12)
        assert np.abs(np.array(got["a"]) - np.array(got["b"])).max() > 1e-6
    finally:
        lab.terminate()
        try:
            lab.wait(20)
        except subprocess.TimeoutExpired:
            lab.kill()
