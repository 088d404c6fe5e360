"""The live notebook view: the inspector in a widget whose requests the kernel answers.

``glassllm.show(prompt, live=True)`` returns a :class:`LiveView`, an
`anywidget <https://anywidget.dev>`_ widget (JupyterLab, Jupyter Notebook, VS
Code, Colab, marimo; the ``notebook`` extra). It shows the
inspector's page in a sandboxed frame, as the offline view does, but the page
embeds no answers: each request it makes (another layer, a head ablation, one
edited number, a decoding step) goes as a widget message to the kernel, where
:func:`answer` checks it with the server's request models
(:mod:`glassllm.inspector.schema`) and computes it with the server's
:class:`~glassllm.inspector.data.Inspector`, and the answer comes back the same
way. The notebook stays small and every intervention works; without a running
kernel (a notebook opened later, a static render) the widget shows nothing, and
the offline ``glassllm.show(prompt)`` is the view to keep.

The path of a request: the page posts ``{glass: "ask", id, kind, body}`` to its
frame's parent; the widget's script sends ``{id, kind, body}`` to the kernel;
:meth:`LiveView._on_request` answers ``{id, answer}`` or ``{id, error}``; the
script posts ``{glass: "answer", ...}`` back into the frame. Every request is
answered: an error inside the model is logged and answered, as the server
answers it, with a generic one-line error.
"""

from __future__ import annotations

import logging

from ..checks import check_int
from ..optional import require
from .data import Inspector
from .export import inline_page
from .schema import (AttributionRequest, HeadsRequest, LensRequest, NextRequest, PromptRequest, SnapshotRequest,
                     TimelineRequest, describe_validation_error)

anywidget = require("anywidget", "the live notebook view (glassllm.show(..., live=True))")
import traitlets  # noqa: E402  (anywidget brings it)

ValidationError = require("pydantic", "the inspector").ValidationError

__all__ = ["LiveView", "answer"]

log = logging.getLogger("glassllm.inspector")

# Request kind -> (its body's model, the Inspector method that answers it): the server's routes.
REQUESTS = {
    "tokens": (PromptRequest, "tokens"),
    "snapshot": (SnapshotRequest, "snapshot"),
    "next": (NextRequest, "next_token"),
    "heads": (HeadsRequest, "heads"),
    "lens": (LensRequest, "lens"),
    "attribution": (AttributionRequest, "attribution"),
    "timeline": (TimelineRequest, None),
}

ESM = """
function render({ model, el }) {
  const frame = document.createElement("iframe");
  frame.setAttribute("sandbox", "allow-scripts");
  frame.className = "glassllm-inspector";
  frame.title = "glassllm inspector (live)";
  frame.style.cssText = `width: 100%; height: ${model.get("height")}px; border: 1px solid #ccc;`;
  frame.srcdoc = model.get("page");
  const onAsk = (ev) => {
    const m = ev.data;
    if (ev.source !== frame.contentWindow || !m || m.glass !== "ask") return;
    model.send({id: m.id, kind: m.kind, body: m.body});
  };
  const onAnswer = (msg) => {
    if (msg && msg.id !== undefined && frame.contentWindow) frame.contentWindow.postMessage({...msg, glass: "answer"}, "*");
  };
  window.addEventListener("message", onAsk);
  model.on("msg:custom", onAnswer);
  el.appendChild(frame);
  return () => { window.removeEventListener("message", onAsk); model.off("msg:custom", onAnswer); };
}
export default { render };
"""


def answer(inspector: Inspector, prompt: str, kind, body) -> dict:
    """The answer to one of the page's requests, as the server gives it; ValueError (one line) for a bad one."""
    if kind == "info":
        return {**inspector.info(), "prompt": prompt, "tab": None}
    if kind not in REQUESTS:
        raise ValueError(f"unknown request kind {kind!r}; expected info or one of {', '.join(REQUESTS)}")
    model, method = REQUESTS[kind]
    try:
        req = model.model_validate(body)
    except ValidationError as e:
        raise ValueError(describe_validation_error(e.errors())) from None
    return inspector.timeline_view() if method is None else getattr(inspector, method)(req)


class LiveView(anywidget.AnyWidget):
    """The inspector for one model, live in a notebook: every request is computed by the kernel.

    Made by ``glassllm.show(prompt, live=True)``; ``inspector``: the
    :class:`~glassllm.inspector.data.Inspector` that answers; ``prompt``: the
    text the page opens with (another can be typed in the page).
    """

    _esm = ESM
    page = traitlets.Unicode("").tag(sync=True)
    height = traitlets.Int(860).tag(sync=True)

    def __init__(self, inspector: Inspector, prompt: str, height: int = 860):
        height = check_int("height", height, low=200, high=4000, note="pixels")
        super().__init__(page=inline_page('<script id="glass-kernel" type="application/json">{}</script>\n'),
                         height=height)
        self.inspector, self.prompt = inspector, prompt
        self.answered = 0
        self.on_msg(self._on_request)

    def __repr__(self) -> str:
        return f"LiveView({self.prompt[:60]!r}, {self.answered} request(s) answered)"

    def _on_request(self, _widget, content, _buffers) -> None:
        if not isinstance(content, dict) or "id" not in content:
            return
        try:
            reply = {"id": content["id"],
                     "answer": answer(self.inspector, self.prompt, content.get("kind"), content.get("body"))}
        except (ValueError, TypeError) as e:
            reply = {"id": content["id"], "error": str(e).splitlines()[0] if str(e) else type(e).__name__}
        except Exception as e:                         # a bug: logged, and the page says so instead of waiting
            log.exception("inspector: internal error on a %r request", content.get("kind"))
            reply = {"id": content["id"], "error": f"internal error ({type(e).__name__}); see the kernel's log"}
        self.answered += 1
        self.send(reply)
