"""Every check of a request's parameters against the model and the :class:`~glassllm.inspector.schema.Limits`.

:mod:`glassllm.inspector.schema` checks a request's shape and types; the functions here check
what only the model can tell (a layer it has, a head the chosen snapshot has, a name from the
tracer's registry, a prompt that fits the context, a snapshot that is not too large), before any
forward pass runs. An intervention is checked by the library's
:func:`glassllm.trace.interventions.from_fields`, the one place its rules are written. Each
check raises a ``ValueError`` with one line that the server answers as HTTP 400.
"""

from __future__ import annotations

import re

import numpy as np

from ..trace.interventions import HEAD_AXES, from_fields
from ..trace.lens import lens_window
from ..trace.registry import axis_sizes

__all__ = ["HEAD_AXES", "local_names", "full_name", "heads_of", "check_prompt", "check_snapshot", "check_cells",
           "check_values", "check_step_zero", "check_target", "check_intervention", "check_top_k", "check_attribution",
           "LENS_WINDOW", "LENS_MAX_POSITIONS", "check_lens_window", "lens_neighbours"]

LENS_WINDOW = 16            # the positions a logit-lens answer holds unless asked: the last 16 (the panel's width)
LENS_MAX_POSITIONS = 32     # the widest window one request may ask for: (L+1) x 32 rows through the output matrix

def local_names(axes: dict) -> list[str]:
    """Snapshot names as the page lists them: layer 0's names without ``layers.0.``, then the rest."""
    out = []
    for full in axes:
        if full.startswith("layers.0."):
            out.append(full.removeprefix("layers.0."))
        elif not full.startswith("layers."):
            out.append(full)
    return out


def full_name(axes: dict, n_layers: int, name: str, layer: int | None, known: list[str]) -> str:
    """``attn.softmax`` + layer 2 -> ``layers.2.attn.softmax``; checks both against the registry ``axes``
    (``known``: the names an unknown one is told to choose from)."""
    if name in axes and not name.startswith("layers."):
        if layer is not None:
            raise ValueError(f"snapshot {name!r} is outside the layers; send layer null, got layer {layer}")
        return name
    if f"layers.0.{name}" not in axes:
        raise ValueError(f"unknown snapshot {name[:64]!r}; expected one of: {', '.join(known)}")
    L = n_layers
    if layer is None:
        raise ValueError(f"snapshot {name!r} is inside the layers: send a layer in 0..{L - 1}")
    if not 0 <= layer < L:
        raise ValueError(f"layer {layer} is out of range: this model has layers 0..{L - 1}")
    return f"layers.{layer}.{name}"


def heads_of(letters, config) -> tuple[str | None, int]:
    """A snapshot's head axis ("H" query heads, "G" key/value heads, or None) and how many heads it has."""
    head_axis = next((a for a in letters if a in HEAD_AXES), None)
    return head_axis, {"H": config.n_heads, "G": config.n_kv_heads}.get(head_axis, 0)


def check_prompt(ids: list[int], limits, config) -> list[int]:
    """A prompt's ids: at least one, at most ``limits.max_prompt_tokens``."""
    limit = limits.max_prompt_tokens
    if not ids:
        raise ValueError("prompt is empty: type at least one character")
    if len(ids) > limit:
        raise ValueError(f"prompt has {len(ids)} tokens; this inspector takes at most {limit} "
                         f"(--max-prompt-tokens, at most the context {config.max_seq_len} - 1)")
    return ids


def check_snapshot(req, letters, config) -> None:
    """A snapshot request's head (one the snapshot has, or None), and gradients and interventions at step 0."""
    head_axis, heads = heads_of(letters, config)
    if head_axis is None and req.head is not None:
        raise ValueError(f"snapshot {req.name!r} has no head axis (axes {letters}); send head null")
    if head_axis is not None:
        if req.head is None:
            raise ValueError(f"snapshot {req.name!r} has {heads} heads: send a head in 0..{heads - 1}")
        if not 0 <= req.head < heads:
            raise ValueError(f"head {req.head} is out of range: {req.name!r} has heads 0..{heads - 1}")
    if req.grad and req.step:
        raise ValueError(f"gradients are shown for the prompt's pass only (step 0), got step {req.step}")
    check_step_zero(req)


def check_step_zero(req) -> None:
    """Interventions change the prompt's pass only."""
    if req.intervention is not None and req.step:
        raise ValueError(f"interventions apply to the prompt's pass only (step 0), got step {req.step}")


def check_cells(full: str, letters, config, limits, n_prompt: int, step: int) -> None:
    """Refuse a view larger than --max-cells from the shapes alone, before the model runs."""
    n, m = (n_prompt, n_prompt) if not step else (1, n_prompt + step)
    sizes = axis_sizes(config, n, m)
    cells = int(np.prod([sizes[a] for a in letters if a not in HEAD_AXES]))
    if cells > limits.max_cells:
        shape = " x ".join(str(sizes[a]) for a in letters if a not in HEAD_AXES)
        raise ValueError(f"snapshot {full!r} has {shape} = {cells} values; this inspector "
                         f"sends at most {limits.max_cells} (--max-cells)")


def check_values(full: str, rows: int, cols: int, limits) -> None:
    """Refuse a computed view larger than --max-cells."""
    if rows * cols > limits.max_cells:
        raise ValueError(f"snapshot {full!r} has {rows} x {cols} = {rows * cols} values; this inspector "
                         f"sends at most {limits.max_cells} (--max-cells)")


def check_target(req, config) -> None:
    """A gradient request's target: only with ``grad``, and a token id of the vocabulary."""
    if req.target is not None and not req.grad:
        raise ValueError(f"target {req.target} is only used with grad true (the token whose loss is differentiated)")
    if req.target is not None and req.target >= config.vocab_size:
        raise ValueError(f"target {req.target} is out of range [0, {config.vocab_size})")


def check_intervention(iv, axes: dict, config, n: int) -> None:
    """Refuse an intervention body this model and an n-token prompt cannot take, naming the bad field
    (a :class:`~glassllm.checks.ParameterError` from :func:`glassllm.trace.interventions.from_fields`)."""
    if iv is None:
        return
    try:
        from_fields(**iv.model_dump(), axes=axes, config=config, n=n)
    except ValueError as e:              # the API takes indices >= 0: no "-4..-1 from the end" offered
        e.args = (re.sub(r" \(or -\d+\.\.-1 from the end\)", "", str(e)),)
        raise


def check_top_k(req, config) -> None:
    """A next-token request's top_k: at most the vocabulary."""
    V = config.vocab_size
    if req.top_k is not None and req.top_k > V:
        raise ValueError(f"top_k {req.top_k} is out of range: this vocabulary has {V} ids")


def check_attribution(req, n: int, config) -> int:
    """An attribution request's position (default the last of ``n``) and token; returns the position."""
    V = config.vocab_size
    position = n - 1 if req.position is None else req.position
    if position >= n:
        raise ValueError(f"position {position} is out of range: the prompt has positions 0..{n - 1}")
    if req.token is not None and req.token >= V:
        raise ValueError(f"token {req.token} is out of range: token ids are 0..{V - 1}")
    return position


def check_lens_window(req, n: int) -> tuple[int, int]:
    """The logit lens's window ``(start, stop)`` of an ``n``-token prompt: ``req.positions``, checked
    once here, before any forward (ParameterError naming the value and the range), or by default the
    last :data:`LENS_WINDOW` positions."""
    if req.positions is None:
        return max(0, n - LENS_WINDOW), n
    return lens_window(list(req.positions), n, most=LENS_MAX_POSITIONS)


def lens_neighbours(start: int, stop: int, n: int) -> tuple[list[int] | None, list[int] | None]:
    """The windows before and after ``[start, stop)`` that the page's earlier/later buttons ask for
    (None at either end), each as wide as this one or :data:`LENS_WINDOW`, whichever is wider. From the
    default window they tile the prompt from its end: ``[n-16, n)``, ``[n-32, n-16)``, ... down to
    ``[0, k)``, each position in one window."""
    w = max(stop - start, LENS_WINDOW)
    earlier = [max(0, start - w), start] if start > 0 else None
    later = [stop, min(n, stop + w)] if stop < n else None
    return earlier, later
