"""``glassllm trace PROMPT --snapshot NAME``: one snapshot of a forward pass, in the terminal.

::

    glassllm trace "The cat sat" --snapshot attn.softmax --layer 0 --head 1     # a labelled matrix
    glassllm trace "The cat sat" --snapshot attn.softmax --layer 0 --head 1 --json
    glassllm trace "The cat sat" --snapshot logits --npy logits.npy             # the array, for NumPy
    glassllm snapshots                                                          # every name, shape, equation

The matrix has the prompt's tokens on its position axes (queries down, keys
across), numbers rounded to ``--decimals``, ``·`` where the causal mask
forbids a key, and each row's sum at the right. Above it: the equation and the
line of ``nn.py`` that recorded the snapshot (:mod:`glassllm.trace.explain`).
"""

from __future__ import annotations

import io
import json
import sys

import numpy as np

from . import load_model_option

__all__ = ["add_cli", "run", "add_snapshots_cli", "run_snapshots", "format_matrix"]

POSITION_AXES = ("n", "m")


def add_cli(name: str, parser) -> None:
    if name == "snapshots":
        return add_snapshots_cli(name, parser)
    parser.add_argument("prompt", metavar="PROMPT", help="the text the model reads")
    parser.add_argument("--snapshot", required=True, metavar="NAME",
                        help="a snapshot name: attn.softmax (with --layer), layers.0.attn.softmax, logits "
                             "(glassllm snapshots lists them)")
    parser.add_argument("--layer", type=int, default=None, metavar="L", help="the layer of a layer-local name")
    parser.add_argument("--head", type=int, default=None, metavar="H",
                        help="the head of a snapshot with a head axis (query head; key/value head for k, v)")
    parser.add_argument("--model", metavar="FILE", default=None,
                        help="model file (default, or 'bundled': the bundled TinyStories model)")
    parser.add_argument("--decimals", type=int, default=3, metavar="N", help="digits after the point (default: 3)")
    parser.add_argument("--max-columns", type=int, default=12, metavar="N",
                        help="columns shown of a feature axis (C, D, F, V; default: 12); positions are all shown")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: name, layer, head, axes, shape, tokens, values (nested lists)")
    parser.add_argument("--npy", metavar="FILE", default=None, help="also write the array to FILE (.npy)")
    parser.set_defaults(func=run)


def add_snapshots_cli(name: str, parser) -> None:
    parser.add_argument("--model", metavar="FILE", default=None,
                        help="give shapes for this model file (default: the default configuration's sizes)")
    parser.set_defaults(func=run_snapshots)


def select(model, tokens, snapshot: str, layer, head):
    """``(full name, axes, values, mask or None, head)`` of one snapshot of the forward of ``tokens``: the
    tracer's ``get`` with ``layer`` and ``head`` (returned counted from the first: -1 is the last head); the
    mask is the (n, m) causal mask for a matrix over keys."""
    from ..trace import trace
    from ..trace.registry import check_index, head_axis, resolve

    axes = model.snapshot_axes()
    found = resolve(snapshot, axes, layer)
    if len(found) != 1:
        layers = sorted({k.split(".")[1] for k in found if k.startswith("layers.")}, key=int)
        if layer is None and len(layers) > 1:
            raise ValueError(f"{snapshot!r} is in every layer: pass --layer 0..{layers[-1]}")
        raise ValueError(f"{snapshot!r} names {len(found)} snapshots ({', '.join(found[:4])}...): name one")
    full = found[0]
    letters = axes[full]
    h = head_axis(letters)
    if h is not None:
        size = {"H": model.config.n_heads, "G": model.config.n_kv_heads}[letters[h]]
        if head is None:
            raise ValueError(f"{full} has a head axis ({letters[h]} = {size}): pass --head 0..{size - 1}")
        head = check_index(head, "head", size)
    elif head is not None:
        raise ValueError(f"{full} has no head axis (axes {', '.join(letters)}): leave out --head")
    shown = tuple(a for i, a in enumerate(letters) if i != h)
    mask_name = full.rsplit(".", 1)[0] + ".mask"
    masked = shown == ("n", "m") and full.endswith(("attn.scores", "attn.softmax"))
    # Every layer's reference code, as a full trace and the inspector run it: the same numbers to the last bit.
    t = trace(model, tokens, lazy=True)
    values = t.get(full, head=head)
    mask = t.get(mask_name) if masked else None
    return full, shown, values, mask, head


def _cell(v, decimals: int) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "1" if v else "0"
    text = f"{float(v):.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def _label(piece: str, width: int) -> str:
    piece = piece.replace(" ", "␣")
    return piece if len(piece) <= width else piece[:width - 1] + "…"


def format_matrix(values: np.ndarray, axes: tuple, tokens: list[str], decimals: int = 3,
                  mask: np.ndarray | None = None, max_columns: int = 12) -> str:
    """A 1-D or 2-D snapshot as text: token labels on position axes, numbers rounded to ``decimals``,
    ``·`` where ``mask`` is True, and a row-sum column (``Σ``) for a matrix."""
    values = np.asarray(values)
    if values.ndim == 1:
        values, axes, single = values[:, None], (axes[0], "value"), True
    else:
        single = False
    rows, cols = values.shape
    shown_cols = cols if axes[1] in POSITION_AXES or single else min(cols, max_columns)
    width = max(decimals + 4, max(len(_cell(v, decimals)) for v in values[:, :shown_cols].ravel()) + 1)

    def axis_labels(axis: str, size: int) -> list[str]:
        if axis in POSITION_AXES:
            return [f"{j} {_label(tokens[j], width + 4)}" if j < len(tokens) else str(j) for j in range(size)]
        return [str(j) for j in range(size)]

    row_labels = axis_labels(axes[0], rows)
    lw = max(len(s) for s in row_labels) + 1
    lines = []
    if single:
        for label, v in zip(row_labels, values[:, 0]):
            lines.append(f"{label:<{lw}}{_cell(v, decimals):>{width}}")
        return "\n".join(lines) + "\n"
    sums = [_cell(s, decimals) for s in values.astype(np.float64).sum(axis=1)]
    sw = max(len(s) for s in sums) + 3
    head_idx = "".join(f"{j:>{width}}" for j in range(shown_cols))
    lines.append(f"{axes[0] + ' ↓  ' + axes[1] + ' →':<{lw}}{head_idx}{'Σ':>{sw}}")
    if axes[1] in POSITION_AXES:
        lines.append(" " * lw + "".join(f"{_label(tokens[j], width - 1):>{width}}" if j < len(tokens) else " " * width
                                        for j in range(shown_cols)))
    for i in range(rows):
        cells = []
        for j in range(shown_cols):
            cells.append(f"{'·':>{width}}" if mask is not None and mask[i, j] else f"{_cell(values[i, j], decimals):>{width}}")
        more = " …" if shown_cols < cols else ""
        lines.append(f"{row_labels[i]:<{lw}}{''.join(cells)}{more}{sums[i]:>{sw - len(more)}}")
    if shown_cols < cols:
        lines.append(f"(columns 0..{shown_cols - 1} of {cols} shown: --max-columns; Σ is over all {cols})")
    return "\n".join(lines) + "\n"


def run(args) -> int:
    from ..files import atomic_write
    from ..trace.explain import explain

    if not 0 <= args.decimals <= 12:
        raise ValueError(f"--decimals {args.decimals}: expected 0..12")
    if args.max_columns < 1:
        raise ValueError(f"--max-columns {args.max_columns}: expected 1 or more")
    from ..generate import prompt_ids

    model, tokenizer, _ = load_model_option(args.model)
    tokens = prompt_ids(args.prompt, model, tokenizer)                   # as generate reads it, and refuses ''
    full, axes, values, mask, head = select(model, tokens, args.snapshot, args.layer, args.head)
    pieces = tokenizer.pieces(tokens)
    layer = int(full.split(".")[1]) if full.startswith("layers.") else None
    if args.npy:
        buf = io.BytesIO()
        np.save(buf, values)
        atomic_write(args.npy, buf.getvalue())
    if args.json:
        json.dump({"name": full, "layer": layer, "head": head, "axes": list(axes), "shape": list(values.shape),
                   "tokens": pieces, "values": values.tolist()}, sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
        return 0
    info = explain(full)
    where = f", head {head}" if head is not None else ""
    shape = ", ".join(f"{a}={s}" for a, s in zip(axes, values.shape))
    out = sys.stdout
    out.write(f"{full}{where}   {info['equation']['text']}   ({shape})\n")
    out.write(f"recorded at {info['path']}:{info['line']}   {info['code'].splitlines()[info['line'] - info['first']].strip()}\n\n")
    out.write(format_matrix(values, axes, pieces, args.decimals, mask, args.max_columns))
    if args.npy:
        out.write(f"wrote {args.npy}\n")
    return 0


def run_snapshots(args) -> int:
    from ..config import ModelConfig
    from ..trace.explain import equation
    from ..trace.registry import generic_names

    config = ModelConfig() if args.model is None else load_model_option(args.model)[0].config
    rows = [(g, "(" + ", ".join(f"{a}={s}" if a != s else a for a, s in zip(axes, shape)) + ")",
             equation(g)["text"]) for g, axes, shape, _ in generic_names(config)]
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    for name, shape, eq in rows:
        print(f"{name:<{w0}}  {shape:<{w1}}  {eq}")
    return 0
