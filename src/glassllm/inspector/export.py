"""One self-contained HTML file: the inspector for one prompt, working offline.

The page's controls can only ask a finite set of questions about one prompt,
so the export asks them all ahead of time and embeds the answers under the
same request keys the page uses (:func:`~glassllm.inspector.schema.request_key`).
The page's script finds ``<script id="glass-data">`` and answers itself from it
instead of calling a server; nothing else changes.

What is embedded, for the prompt:

- every snapshot of every layer and head, its value and its gradient;
- ``steps`` greedy decoding steps (fewer if the text ends), every snapshot's value;
- the next-token logits of the prompt and of every step;
- the head grid (every layer's and head's weights, as float16, and their gradients);
- the logit lens over every window of positions the page's earlier/later buttons reach (together,
  every position of the prompt), and the direct attribution at the last position;
- interventions: each head ablated, the mask switched off in each layer, the
  scores of each layer divided by each of ``TEMPERATURES``: the logits after each,
  and the intervened layer's scores, mask and weights; under each head ablation,
  the head grid too;
- the training timeline, when the model has one;
- under each ablation of a head of layer 0, the scores and weights of every head
  of every later layer: how a later head's pattern depends on a layer-0 head
  (a previous-token head feeding an induction head, say).

The layers embedded (``layers``, default every one) bound the file: each chosen layer
brings its snapshots, its decoding steps' snapshots and its interventions; the head grid,
the logit lens, the attributions and the logits cover the whole model. A view of a layer
left out says so on the page, with the command that includes it. The answers are counted
as they are made: past ``max_mb`` megabytes the export stops and refuses in one line,
naming how much it held at which layer and what to choose instead (fewer layers, a
shorter prompt, a larger bound), before writing anything.

Precision: the head grid's attention weights (the prompt's grid and each ablation's) are embedded as
float16, because the page only draws them, as colours on the fixed scale 0 ... 1 of 256 levels (a
weight's float16 rounding is at most 2^-12, a sixteenth of a level); that halves the largest part of an
export of a wide model. Everything the page prints or computes from stays exact float32: every
snapshot (hovering a heatmap cell prints its exact value), the gradient grid (its legend prints the
largest gradient), the logits (the page computes probabilities, their changes and KL from them), the
lens and the attributions.

Answers a view cannot have (the gradient of a constant, say) are embedded as
their error message, which the page shows as the live server would. Style
sheet and scripts are inlined, and a Content-Security-Policy forbids every
network request, so the file works offline and can be shared as it is.
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np

from ..checks import check_int, is_int
from ..files import atomic_write
from ..optional import require
from .data import Inspector
from .schema import (
    AttributionRequest, HeadsRequest, Intervention, LensRequest, NextRequest, PromptRequest, SnapshotRequest,
    TimelineRequest, describe_validation_error, request_key,
)
from .assets import SCRIPTS, read_assets, script_tag
from .views import encode_array

ValidationError = require("pydantic", "the inspector").ValidationError

__all__ = ["TEMPERATURES", "MAX_MB", "build_responses", "render_html", "inline_page", "export_html",
           "ExportTooLarge", "drawn_only"]

MAX_MB = 50.0                          # the default bound of one export's embedded answers, in MB (1e6 bytes)


class ExportTooLarge(ValueError):
    """The answers an export would embed pass its ``max_mb`` bound."""

TEMPERATURES = (0.25, 0.5, 2.0, 4.0)   # the page's score-temperature choices
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
       "connect-src 'none'; base-uri 'none'; form-action 'none'")


def drawn_only(kind: str, req) -> bool:
    """Whether the page only draws answer ``kind``/``req``'s values as colours (printing none, computing from
    none): the head grid's weights, not its gradients. The export holds those as float16."""
    return kind == "heads" and not req.grad


def _float16(enc: dict) -> dict:
    """An encoded float array (:func:`~glassllm.inspector.views.encode_array`) again as float16."""
    a = np.frombuffer(base64.b64decode(enc["b64"]), dtype=np.dtype(enc["dtype"]).newbyteorder("<"))
    return encode_array(a.reshape(enc["shape"]).astype(np.float16))


def _answer(fn, req) -> dict:
    try:
        return fn(req)
    except ValueError as e:
        return {"error": str(e).splitlines()[0]}


def _views(inspector: Inspector, layers, names=None, inside=None, outside=None):
    """(name, layer, head) for every view the page's selectors can reach (``inside``: only the names
    inside the layers; ``outside``: only those outside them)."""
    for entry in inspector.info()["names"]:
        if names is not None and entry["name"] not in names:
            continue
        if (inside and not entry["in_layer"]) or (outside and entry["in_layer"]):
            continue
        for layer in (layers if entry["in_layer"] else [None]):
            for head in (range(entry["heads"]) if entry["heads"] else [None]):
                yield entry["name"], layer, head


def build_responses(inspector: Inspector, prompt: str, steps: int, layers=None, max_bytes: int | None = None,
                    ) -> dict[str, dict]:
    """Every answer the page can ask for about ``prompt`` (the views of ``layers``: default every
    layer): request key -> response. Past ``max_bytes`` of answers (as JSON), :class:`ExportTooLarge`."""
    out: dict[str, dict] = {}
    L = inspector.config.n_layers
    layers = list(range(L)) if layers is None else sorted(set(layers))
    held = [0]
    where = ["the model-wide views"]

    def put(kind, fn, req):
        answer = _answer(fn, req)
        if kind == "next":
            # The page filters the logits itself; the server's filtered copy is for API clients.
            for part in (answer, answer.get("after") or {}):
                part.pop("sampled", None)
                part.pop("survivors", None)
        if drawn_only(kind, req) and "values" in answer:
            answer["values"] = _float16(answer["values"])
        out[request_key(kind, req)] = answer
        held[0] += len(json.dumps(answer, separators=(",", ":")))
        if max_bytes is not None and held[0] > max_bytes:
            raise ExportTooLarge(_too_large(inspector, layers, held[0], max_bytes, where[0]))

    tokens = PromptRequest(prompt=prompt)
    put("tokens", inspector.tokens, tokens)
    inspector.check_pass(prompt)  # a bad prompt, or a pass that is not finite, fails here with the server's line

    if inspector.timeline is not None:                 # the Training tab: the run's probe history
        out[request_key("timeline", TimelineRequest())] = inspector.timeline_view()

    # The prompt's pass: values and gradients, one view at a time and all heads at once.
    put("next", inspector.next_token, NextRequest(prompt=prompt))
    for grad in (False, True):
        put("heads", inspector.heads, HeadsRequest(prompt=prompt, grad=grad))
    put("lens", inspector.lens, tokens)               # the default window, then every window the buttons reach
    window = out[request_key("lens", tokens)].get("positions")
    while window is not None:
        lens = LensRequest(prompt=prompt, positions=tuple(window))
        put("lens", inspector.lens, lens)
        window = out[request_key("lens", lens)].get("earlier")
    put("attribution", inspector.attribution, AttributionRequest(prompt=prompt))
    for name, layer, head in _views(inspector, [None], outside=True):
        for grad in (False, True):
            put("snapshot", inspector.snapshot,
                SnapshotRequest(prompt=prompt, name=name, layer=layer, head=head, grad=grad))
    for at in layers:
        where[0] = f"layer {at}"
        for name, layer, head in _views(inspector, [at], inside=True):
            for grad in (False, True):
                put("snapshot", inspector.snapshot,
                    SnapshotRequest(prompt=prompt, name=name, layer=layer, head=head, grad=grad))

    # Greedy decoding, step by step, while the text goes on.
    where[0] = "the decoding steps"
    for step in range(1, steps + 1):
        nxt = out[request_key("next", NextRequest(prompt=prompt, step=step - 1))]
        if "error" in nxt or nxt.get("finished"):
            break
        put("next", inspector.next_token, NextRequest(prompt=prompt, step=step))
        for name, layer, head in _views(inspector, layers):
            put("snapshot", inspector.snapshot,
                SnapshotRequest(prompt=prompt, name=name, layer=layer, head=head, step=step))

    # Interventions: the logits after each, and the intervened layer's attention.
    H = inspector.config.n_heads
    for layer in layers:
        where[0] = f"the interventions of layer {layer}"
        ivs = [Intervention(kind="ablate", layer=layer, head=h) for h in range(H)]
        ivs.append(Intervention(kind="mask_off", layer=layer))
        ivs += [Intervention(kind="temperature", layer=layer, temperature=t) for t in TEMPERATURES]
        for iv in ivs:
            put("next", inspector.next_token, NextRequest(prompt=prompt, intervention=iv))
            if iv.kind == "ablate":
                put("heads", inspector.heads, HeadsRequest(prompt=prompt, intervention=iv))
            # The intervened layer's attention; under a layer-0 head's ablation, every later chosen layer's too.
            later = [at for at in layers if at >= layer] if layer == 0 and iv.kind == "ablate" else [layer]
            for name, at, head in _views(inspector, later, {"attn.scores", "attn.mask", "attn.softmax"}):
                put("snapshot", inspector.snapshot,
                    SnapshotRequest(prompt=prompt, name=name, layer=at, head=head, intervention=iv))
    return out


def _too_large(inspector: Inspector, layers: list[int], held: int, max_bytes: int, where: str) -> str:
    L = inspector.config.n_layers
    fewer = f"fewer layers (--html-layers 0,{L - 1}, or one), " if len(layers) > 2 else (
        "one layer (--html-layers 0), " if len(layers) == 2 else "")
    if where == "the model-wide views":            # every export holds them, whichever layers it chooses
        fewer = ""
    return (f"this export passes its bound of {max_bytes / 1e6:g} MB (--html-max-mb) with {held / 1e6:.1f} MB "
            f"embedded, at {where}, of {len(layers)} chosen layer(s) of {L}; choose {fewer}"
            "a shorter prompt or fewer --steps, or raise --html-max-mb")


def left_out(inspector: Inspector, layers) -> str | None:
    """What an export of ``layers`` leaves out, and how to include it (None: nothing is left out)."""
    L = inspector.config.n_layers
    if layers is None or set(layers) >= set(range(L)):
        return None
    chosen = ",".join(str(i) for i in sorted(set(layers)))
    return (f"this export holds the views of layers {chosen} of 0..{L - 1} (and the head grid, logit lens, "
            "attributions and logits of every layer); --html-layers chooses the layers it holds")


def _part(key: str) -> str:
    """Which part of the export a request key belongs to: its kind, or "ablation" for a later layer's
    view under a layer-0 head's ablation."""
    kind, body = key.split(":", 1)
    body = json.loads(body)
    iv = body.get("intervention") or {}
    if kind == "snapshot" and iv.get("kind") == "ablate" and iv.get("layer") == 0 and body.get("layer", 0) > 0:
        return "ablation"
    return kind


def render_html(info: dict, prompt: str, responses: dict[str, dict], note: str | None = None) -> str:
    """The page with its style, script and data inlined (``note``: what the export left out)."""
    data = json.dumps({"info": info, "prompt": prompt, "responses": responses, "left_out": note},
                      separators=(",", ":"), ensure_ascii=True)
    data = data.replace("<", "\\u003c")  # no "</script>" can close the data block early
    return inline_page('<script id="glass-data" type="application/json">' + data + "</script>\n")


def inline_page(data_script: str) -> str:
    """The page with its style and scripts inlined, ``data_script`` (a ``<script>`` element) before the scripts,
    and a Content-Security-Policy that forbids every network request.

    The scripts are inlined where the page loads them, each in its own ``<script>`` element, in the order
    of :data:`~glassllm.inspector.assets.SCRIPTS`."""
    assets = read_assets()
    html = assets["index.html"]
    head = f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
    html = html.replace('<meta charset="utf-8">\n', '<meta charset="utf-8">\n' + head, 1)
    style = "<style>\n" + assets["style.css"] + "</style>"
    html, n_style = re.subn(r'<link rel="stylesheet" href="style.css">', lambda _: style, html)
    assert n_style == 1, "index.html lost its style tag"
    for i, name in enumerate(SCRIPTS):
        tag = script_tag(name)
        assert html.count(tag) == 1, f"index.html lost its script tag for {name}"
        script = "<script>\n" + assets[name].replace("</script", "<\\/script") + "</script>"
        html = html.replace(tag, (data_script if i == 0 else "") + script, 1)
    return html


def export_html(inspector: Inspector, prompt: str, path, steps: int | None = None, layers=None,
                max_mb: float = MAX_MB) -> dict:
    """Write the offline inspector for ``prompt`` to ``path`` (atomically).

    ``steps``: greedy decoding steps to include (default: 8, or the
    inspector's ``max_new_tokens`` if lower). ``layers``: the layers whose views it holds (default:
    all). ``max_mb``: the most megabytes of answers it may embed; past it, :class:`ExportTooLarge`
    (a ``ValueError``) and nothing is written. Returns ``{"path", "bytes",
    "responses", "over_max_cells", "parts", "left_out"}`` (views larger than the inspector's ``max_cells``,
    saved as their error; ``parts``: the embedded answers' bytes by kind -- ``snapshot``, ``next``,
    ``heads``, ``tokens``, and ``ablation`` for the later layers' views under a layer-0 head's
    ablation). Raises ``ValueError`` for a prompt the inspector refuses
    (empty, too long) or a bad ``steps``.
    """
    try:
        PromptRequest(prompt=prompt)  # the same checks as the server's
    except ValidationError as e:
        raise ValueError(describe_validation_error(e.errors())) from None
    limit = inspector.limits.max_new_tokens
    steps = min(8, limit) if steps is None else steps
    steps = check_int("steps", steps, low=0, high=limit, note="--max-new-tokens")
    L = inspector.config.n_layers
    if layers is not None:
        layers = list(layers)
        bad = [i for i in layers if not is_int(i) or not 0 <= i < L]
        if bad or not layers:
            raise ValueError(f"layers (--html-layers) must be layer numbers in 0..{L - 1}, got {layers!r}")
    if isinstance(max_mb, bool) or not isinstance(max_mb, (int, float)) or not 0 < max_mb < float("inf"):
        raise ValueError(f"max_mb must be a number of MB > 0, got {max_mb!r}")
    responses = build_responses(inspector, prompt, steps, layers, int(max_mb * 1e6))
    note = left_out(inspector, layers)
    html = render_html(inspector.info(), prompt, responses, note)
    data = html.encode("utf-8")
    atomic_write(path, data)
    too_big = sum(1 for r in responses.values() if "max-cells" in str(r.get("error", "")))
    parts: dict[str, int] = {}
    for key, answer in responses.items():
        parts[_part(key)] = parts.get(_part(key), 0) + len(json.dumps(answer, separators=(",", ":")))
    return {"path": str(path), "bytes": len(data), "responses": len(responses), "over_max_cells": too_big,
            "parts": parts, "left_out": note}
