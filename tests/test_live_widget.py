"""glassllm.show(prompt, live=True): the inspector as a widget whose requests a real kernel computes.

The kernel side is checked by itself (every request kind answered as the server answers it, a bad one
refused in one line), then end to end in Chromium: a real IPython kernel (jupyter_client) creates the
widget; a small relay served by this test plays the notebook front end -- it loads the widget's own
script (``_esm``) with the state the kernel sent in its ``comm_open``, and carries the widget's custom
messages between the page and the kernel over the Jupyter widget protocol (``comm_msg``, method
``custom``). In the page an ablation that nothing precomputed changes the next-token bars to the
numbers ``trace`` computes for it.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest

from glassllm.checkpoint import bundled_model_path

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


# ---------------------------------------------------------------------------------------------- in Chromium

HOST = """<!doctype html><html><head><meta charset="utf-8"><title>relay</title></head><body>
<div id="out"></div>
<script type="module">
  const state = await (await fetch("/state")).json();
  const listeners = [];
  const model = {
    get: (k) => state[k],
    send: (msg) => fetch("/send", {method: "POST", body: JSON.stringify(msg)}),
    on: (ev, cb) => { if (ev === "msg:custom") listeners.push(cb); },
    off: () => {},
  };
  async function poll() {
    const msgs = await (await fetch("/recv")).json();
    for (const m of msgs) for (const cb of listeners) cb(m);
    setTimeout(poll, 30);
  }
  const url = URL.createObjectURL(new Blob([state._esm], {type: "text/javascript"}));
  const widget = (await import(url)).default;
  widget.render({model, el: document.getElementById("out")});
  poll();
</script></body></html>"""


class _Relay:
    """The notebook front end's part of the widget protocol, between one page and one kernel's widget."""

    def __init__(self, client, comm_id: str, state: dict):
        self.client, self.comm_id, self.state = client, comm_id, state
        self.inbox: queue.Queue = queue.Queue()
        self.sent = 0
        self.stopping = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, body: bytes, kind: str):
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/":
                    self._reply(HOST.encode(), "text/html; charset=utf-8")
                elif self.path == "/state":
                    self._reply(json.dumps(relay.state).encode(), "application/json")
                elif self.path == "/recv":
                    out = []
                    while not relay.inbox.empty():
                        out.append(relay.inbox.get())
                    self._reply(json.dumps(out).encode(), "application/json")
                else:
                    self.send_error(404)

            def do_POST(self):
                msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                relay.client.shell_channel.send(relay.client.session.msg("comm_msg", {
                    "comm_id": relay.comm_id, "data": {"method": "custom", "content": msg}}))
                relay.sent += 1
                self._reply(b"{}", "application/json")

        self.http = HTTPServer(("127.0.0.1", 0), Handler)
        self.serving = threading.Thread(target=self.http.serve_forever, daemon=True)

    def _read(self):
        while not self.stopping.is_set():
            try:
                msg = self.client.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                continue
            content = msg["content"]
            if msg["msg_type"] == "comm_msg" and content.get("comm_id") == self.comm_id \
                    and content["data"].get("method") == "custom":
                self.inbox.put(content["data"]["content"])

    def __enter__(self):
        self.reader.start()
        self.serving.start()
        return f"http://127.0.0.1:{self.http.server_port}/"

    def __exit__(self, *exc):
        self.stopping.set()
        self.http.shutdown()
        self.http.server_close()
        self.reader.join(5)


def _widget_from_kernel(client, code: str, timeout: float = 180) -> tuple[str, dict]:
    """Run ``code`` in the kernel; the comm id and state of the widget with a script (``_esm``) it opens."""
    client.execute(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = client.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        content = msg["content"]
        if msg["msg_type"] == "error":
            raise AssertionError("the kernel failed: " + "\n".join(content["traceback"])[-2000:])
        if msg["msg_type"] == "comm_open" and "_esm" in content["data"].get("state", {}):
            return content["comm_id"], content["data"]["state"]
    raise AssertionError("the kernel opened no widget")


@needs_bundled
@pytest.mark.browser
@pytest.mark.slow                     # a kernel and Chromium start: about 25 s on a loaded machine
def test_a_live_widget_in_chromium_computes_an_ablation_in_the_kernel():
    pytest.importorskip("anywidget")
    jupyter_client = pytest.importorskip("jupyter_client")
    pytest.importorskip("ipykernel")
    from test_inspector_browser import CHROMIUM, _unavailable

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright's Python package is not installed (pip install playwright)")
    if not os.path.exists(CHROMIUM):
        _unavailable(f"Chromium is not installed at {CHROMIUM}")
    from glassllm.checkpoint import load_bundled
    from glassllm.trace import ZeroAblate, trace

    manager = jupyter_client.KernelManager(kernel_name="python3")
    manager.start_kernel(env={**os.environ, "MPLBACKEND": "Agg"})
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        comm_id, state = _widget_from_kernel(client, f"import glassllm\nview = glassllm.show({PROMPT!r}, live=True)")
        assert 'id="glass-data"' not in state["page"]                     # the page holds no answers
        relay = _Relay(client, comm_id, state)
        errors = []
        with relay as url, sync_playwright() as p:
            try:
                browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                                                  "--disable-component-update"])
            except Exception as e:  # Playwright raises its own error type
                _unavailable(f"Chromium at {CHROMIUM} does not start: {str(e).splitlines()[0]}")
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(url)
                page.wait_for_selector("iframe.glassllm-inspector", timeout=60_000)
                frame = page.frame_locator("iframe.glassllm-inspector")
                inner = next(f for f in page.frames if f is not page.main_frame)
                inner.wait_for_function("() => window.glass && window.glass.ready === true && window.glass.next",
                                        timeout=120_000)
                assert frame.locator("#mode-line").inner_text() == "live: this notebook's kernel"
                inner.evaluate("() => window.glass.intervene({kind: 'ablate', layer: 2, head: 1})")
                inner.evaluate("() => window.glass.idle()")
                got = inner.evaluate("() => ({b: Array.from(window.glass.next.before), a: Array.from(window.glass.next.after),"
                                     " T: window.glass.next.temperature})")
                bars = frame.locator("#iv-bars li.bar[data-id]").count()
            finally:
                browser.close()
        assert not errors, errors
        assert relay.sent >= 3                                          # info, tokens, next, ... all via the kernel
        model, tokenizer, _ = load_bundled()
        ids = tokenizer.encode_prompt(PROMPT)
        before = trace(model, ids).logits[-1]                           # every snapshot traced, as the inspector does
        after = trace(model, ids, interventions=[ZeroAblate(2, 1)]).logits[-1]
        np.testing.assert_allclose(got["b"], _softmax64(before, got["T"]), rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(got["a"], _softmax64(after, got["T"]), rtol=1e-6, atol=1e-12)
        assert np.abs(np.array(got["a"]) - np.array(got["b"])).max() > 1e-6
        assert bars >= 6
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
