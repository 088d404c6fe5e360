"""What the inspector's page may ask for: request bodies and the server's limits.

Every request is a JSON object checked before any model work:

1. here, by shape and type, with pydantic models that forbid unknown keys
   (a sampling ``temperature`` must be a finite number -- not a bool or a string -- in
   [0, 100]; ``layer`` an int >= 0, ...);
2. in :mod:`glassllm.inspector.requests`, against the model and the :class:`Limits`
   (``layer`` < n_layers, a head that the chosen snapshot has, a name from the
   tracer's registry, a prompt that fits the context, a snapshot that is not
   too large). An intervention's fields are checked in one place, the library's
   :func:`glassllm.trace.interventions.from_fields`.

Both raise errors that the server turns into HTTP 400 with ``{"error": "<one line>"}``.

The same request objects drive the offline HTML export, which answers a
finite set of them ahead of time (:mod:`glassllm.inspector.export`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from ..checks import check_int, shown
from ..optional import require
from ..trace.names import from_transformer_lens

require("pydantic", "the inspector")
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator, model_validator

__all__ = [
    "Limits", "InterventionBody", "Intervention", "PromptRequest", "SnapshotRequest", "NextRequest", "HeadsRequest", "TimelineRequest",
    "AttributionRequest", "LensRequest",
    "request_key", "describe_validation_error", "shown",
]

MAX_PROMPT_CHARS = 20_000  # refused before tokenizing; a 512-token prompt is a few thousand characters


@dataclass(frozen=True)
class Limits:
    """What one request may cost; the server checks every request against these.

    ``max_prompt_tokens``  prompt length in tokens (at most the model's context).
    ``max_new_tokens``     generation steps a request may ask for.
    ``max_cells``          values in one snapshot response (rows x columns).

    >>> Limits(max_prompt_tokens=64).max_new_tokens
    64
    """

    max_prompt_tokens: int = 256
    max_new_tokens: int = 64
    max_cells: int = 1 << 19

    def __post_init__(self):
        for name in ("max_prompt_tokens", "max_new_tokens", "max_cells"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), low=1, owner="Limits"))

    def fit(self, context: int) -> "Limits":
        """These limits, with the prompt capped so that the prompt plus one new token fit ``context``."""
        if self.max_prompt_tokens < context:
            return self
        return Limits(max(1, context - 1), self.max_new_tokens, self.max_cells)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _glassllm_name(data):
    """A request's ``name`` given as a TransformerLens hook (``attn.hook_pattern``, ``blocks.2.attn.hook_z``,
    ``pattern``) as glassllm's layer-local name, the layer taken from the hook name when it has one."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return data
    found = from_transformer_lens(data["name"])
    if found is None:
        return data
    local, layer = found
    if layer is not None and data.get("layer") not in (None, layer):
        raise ValueError(f"name {shown(data['name'])} is in layer {layer}, but layer is {shown(data['layer'])}")
    return {**data, "name": local, **({"layer": layer} if layer is not None else {})}


class InterventionBody(_Request):
    """One change to the forward pass of the prompt, as a request carries it (its fields' types; their
    values are checked against the model by :func:`glassllm.trace.interventions.from_fields`).

    ``ablate``    zero head ``head`` of layer ``layer`` (its mix rows, before W_O).
    ``mask_off``  switch off the causal mask in layer ``layer``: queries see future keys.
    ``temperature``  divide the attention scores of layer ``layer`` by ``temperature``
                  (head ``head``, or every head if None): above 1 flattens each row of
                  weights over the keys it may read, below 1 sharpens it.
    ``edit``      set one number of snapshot ``name`` of layer ``layer`` (a name inside
                  the blocks, as the heatmap menu lists it: ``attn.softmax``, ``mlp.act`` ...,
                  or its TransformerLens hook name)
                  to ``value``: head ``head`` when the snapshot has a head axis, the cell at
                  ``row``, ``col`` of the matrix the heatmap shows (col 0 for a (n,) snapshot).
                  Everything downstream sees the new number (``glassllm.trace.Edit``).
    """

    kind: Literal["ablate", "mask_off", "temperature", "edit"]
    layer: StrictInt
    head: StrictInt | None = None
    temperature: StrictFloat | None = None
    name: str | None = Field(default=None, min_length=1, max_length=64)
    row: StrictInt | None = None
    col: StrictInt | None = None
    value: StrictFloat | None = None

    _tl_name = model_validator(mode="before")(_glassllm_name)


Intervention = InterventionBody  # the name it had first


class PromptRequest(_Request):
    """A prompt: text, encoded with special tokens allowed (as ``glassllm generate`` does)."""

    prompt: str = Field(max_length=MAX_PROMPT_CHARS)

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, v: str):
        if v == "":
            raise ValueError("prompt is empty: type at least one character")
        return v


class SnapshotRequest(PromptRequest):
    """One snapshot of one forward pass, for the heatmap.

    ``name``    a snapshot name without its layer prefix (``attn.softmax``, ``embed``, ``logits``), or the
                TransformerLens hook name of one (``attn.hook_pattern``; ``blocks.2.attn.hook_pattern``
                gives the layer too).
    ``layer``   which block, for names inside the blocks (None otherwise).
    ``head``    which head, for names with a head axis (H or G); None otherwise.
    ``step``    0 = the prompt's forward pass; s >= 1 = the s-th greedy decoding
                step with the KV cache (n = 1 new query against m = prompt + s keys).
    ``grad``    the gradient of the next-token loss with respect to the snapshot
                instead of its value (step 0 only).
    ``target``  the token whose loss is differentiated (default: the model's top choice).
    """

    name: str = Field(min_length=1, max_length=64)
    layer: StrictInt | None = Field(default=None, ge=0)
    head: StrictInt | None = Field(default=None, ge=0)
    step: StrictInt = Field(default=0, ge=0)
    grad: StrictBool = False
    target: StrictInt | None = Field(default=None, ge=0)
    intervention: InterventionBody | None = None

    _tl_name = model_validator(mode="before")(_glassllm_name)


class HeadsRequest(PromptRequest):
    """Every layer's and head's attention weights (``attn.softmax``) of the prompt's pass, for the head grid.

    ``grad``  their gradients instead (``target``: the token whose loss is differentiated,
              default the model's top choice); ``intervention``: under one change of the pass.
    """

    grad: StrictBool = False
    target: StrictInt | None = Field(default=None, ge=0)
    intervention: InterventionBody | None = None


class TimelineRequest(_Request):
    """The training timeline of the model (an empty object: there is one per inspector)."""


class NextRequest(PromptRequest):
    """The next-token distribution after the prompt (``step`` 0) or after decoding step ``step``.

    ``temperature`` (0 = greedy), ``top_k``, ``top_p`` are applied with :mod:`glassllm.sampling`;
    the response lists the surviving ids. With an ``intervention``, the
    response holds the distribution before and after it.
    """

    step: StrictInt = Field(default=0, ge=0)
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=100.0, allow_inf_nan=False)
    top_k: StrictInt | None = Field(default=None, ge=1)
    top_p: StrictFloat | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    intervention: InterventionBody | None = None


class LensRequest(PromptRequest):
    """The logit lens of the prompt's pass over one window of positions.

    ``positions``  ``[start, stop)``: the positions whose columns are computed (checked against the
    prompt by :func:`glassllm.trace.lens_window`); default the last
    :data:`~glassllm.inspector.requests.LENS_WINDOW` positions (all of a shorter prompt).
    """

    positions: tuple[StrictInt, StrictInt] | None = None


class AttributionRequest(PromptRequest):
    """Direct logit attribution of the prompt's pass: each head's and each MLP's share of one logit.

    ``position``  the query position (default: the last); ``token`` the next token whose logit is
    split (default: the model's most likely one there).
    """

    position: StrictInt | None = Field(default=None, ge=0)
    token: StrictInt | None = Field(default=None, ge=0)


def request_key(kind: str, request: _Request) -> str:
    """A canonical string for a request: the export's lookup key, mirrored by ``requestKey`` in
    ``static/js/api.js``.

    Keys hold only the fields that differ from their defaults, sorted, so the
    page can build the same string from its state.
    """
    body = _canon(request.model_dump(exclude_defaults=True))
    return kind + ":" + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canon(x):
    """Whole floats as ints (2.0 -> 2), as JavaScript's JSON.stringify writes them."""
    if isinstance(x, dict):
        return {k: _canon(v) for k, v in x.items()}
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return x


def describe_validation_error(errors: list[dict]) -> str:
    """One line for pydantic / FastAPI validation errors: the first problem, naming field and value."""
    if not errors:
        return "bad request"
    e = errors[0]
    kind = e.get("type", "")
    if kind == "json_invalid":
        detail = (e.get("ctx") or {}).get("error", "")
        return f"request body is not valid JSON{': ' + str(detail) if detail else ''}"
    loc = [str(p) for p in e.get("loc", ()) if p != "body"]
    field = ".".join(loc) or "body"
    msg = str(e.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    if kind == "missing":
        return "request body is missing: send a JSON object" if field == "body" else f"missing field {field!r}"
    if kind == "extra_forbidden":
        return f"unknown field {field!r}"
    if kind == "value_error" and (field == "body" or msg.startswith(field + " ")):
        return msg                         # our own validator's message already names the fields and values
    if kind in ("model_attributes_type", "dict_type") and field == "body":
        return "request body must be a JSON object"
    return f"{field}: {msg} (got {shown(e.get('input'))})"

