"""The snapshot registry: every name the model records, its axes and shape, and name selection.

Every module of :mod:`glassllm.nn` lists the tensors it computes (``SNAPSHOTS``);
walking the modules gives the registry, full name -> axis letters (batch
removed), in the order a forward pass produces them. Everything else -- the
tracer's filters, :meth:`Trace.get`, the trace file's manifest, the table in
``docs/snapshots.md`` -- is derived from it.

Shape legend: n new queries, m keys (m = start + n), H query heads, G
key/value heads, D head dim, C model width, V vocabulary, F MLP width.
"""

from __future__ import annotations

import fnmatch
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..checks import is_int
from ..config import ModelConfig
from ..files import atomic_write
from ..limits import limit
from .explain import DESCRIPTIONS, equation, sites
from .names import match_transformer_lens, transformer_lens_name

STORAGE_DTYPES = ("float16", "float32", "float64")
MAX_LAYERS = limit("layers")   # a config (or trace file) with more layers than this is refused (glassllm.limits)


def registry(model_or_config=None) -> dict[str, tuple[str, ...]]:
    """Every snapshot name -> its axis letters (batch removed), in forward order.

    Takes a model (its modules are walked) or a :class:`ModelConfig` (a
    skeleton of the same depth is walked; names depend only on ``n_layers``).
    """
    if model_or_config is None:
        model_or_config = ModelConfig()
    if isinstance(model_or_config, ModelConfig):
        if model_or_config.n_layers > MAX_LAYERS:
            raise ValueError(f"n_layers={model_or_config.n_layers} exceeds the tracer's limit of {MAX_LAYERS}")
        return dict(_skeleton_registry(model_or_config.n_layers))
    if callable(getattr(model_or_config, "snapshot_axes", None)):
        return dict(model_or_config.snapshot_axes())
    raise TypeError(f"expected a Transformer or a ModelConfig, got {type(model_or_config).__name__}")


@lru_cache(maxsize=8)
def _skeleton_registry(n_layers: int) -> tuple:
    from ..nn import Transformer

    # The smallest model with this many layers: same modules, same names.
    tiny = ModelConfig(vocab_size=1, dim=2, n_layers=n_layers, n_heads=1, n_kv_heads=1, ffn_dim=1, max_seq_len=1)
    return tuple(Transformer(tiny, seed=0).snapshot_axes().items())


def names(model_or_config=None) -> list[str]:
    """The registry's names in forward order (default: the default config)."""
    return list(registry(model_or_config))


def axis_sizes(config: ModelConfig, n: int, m: int) -> dict[str, int]:
    """The size of every axis letter for one forward of n new queries against m keys."""
    return {"n": n, "m": m, "H": config.n_heads, "G": config.n_kv_heads, "D": config.head_dim,
            "C": config.dim, "V": config.vocab_size, "F": config.ffn_dim}


def snapshot_shape(name: str, config=None, n: int = 1, m: int | None = None) -> tuple:
    """The shape (batch removed) of snapshot ``name`` for n new queries against m keys (default m = n).

    ``config``: a :class:`ModelConfig`, or a model (its ``config``); default: the default config.
    """
    config = ModelConfig() if config is None else getattr(config, "config", config)
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig or a model, got {type(config).__name__}")
    axes = registry(config)
    if name not in axes:
        raise ValueError(f"no snapshot is named {name!r}; names are {_summary(axes)}")
    m = n if m is None else m
    n, m = check_index(n, "n"), check_index(m, "m")
    if not 1 <= n <= m:
        raise ValueError(f"need 1 <= n <= m (n new queries read m keys, the cached ones included), got n={n}, m={m}")
    sizes = axis_sizes(config, n, m)
    return tuple(sizes[a] for a in axes[name])


def _summary(axes) -> str:
    """Registry names with layer numbers folded: 'embed, layers.{0..3}.resid_pre, ...'."""
    layers = sorted({int(k.split(".")[1]) for k in axes if k.startswith("layers.")})
    span = f"layers.{{0..{layers[-1]}}}." if layers else "layers.{i}."
    seen = dict.fromkeys(re.sub(r"^layers\.\d+\.", span, k) for k in axes)
    return ", ".join(seen)


def resolve(pattern, axes: dict, layer=None) -> list[str]:
    """Registry names matched by one pattern, in forward order.

    A pattern is a full name (``layers.2.attn.softmax``), a glob
    (``layers.2.attn.*``) or a layer-local name/glob (``attn.softmax``: every
    layer, or only ``layer`` when given). A TransformerLens hook name stands for
    the snapshot holding its numbers (``blocks.2.attn.hook_pattern``,
    ``attn.hook_pattern``, the short ``pattern``; see
    :func:`glassllm.trace.names.match_transformer_lens`) where no glassllm name matches.
    """
    if not isinstance(pattern, str):
        raise TypeError(f"a snapshot name must be a str, got {type(pattern).__name__}")
    if layer is None and pattern in axes:
        return [pattern]
    given = pattern
    n_layers = len({k.split(".")[1] for k in axes if k.startswith("layers.")})
    if layer is not None:
        layer = check_layer(layer, n_layers)
        head = next((h for h in ("layers.", "blocks.") if pattern.startswith(h)), None)
        if head is None:
            pattern = f"layers.{layer}.{pattern}"
        else:                                   # a name with its layer (glassllm's or TransformerLens'), or a glob
            part, _, rest = pattern[len(head):].partition(".")
            if not fnmatch.fnmatchcase(str(layer), part):
                raise ValueError(f"{pattern!r} names another layer than layer={layer}")
            pattern = f"{head}{layer}.{rest}"
            given = pattern
    found = [k for k in axes if fnmatch.fnmatchcase(k, pattern)]
    if not found and not pattern.startswith("layers."):
        found = [k for k in axes if fnmatch.fnmatchcase(k, "layers.*." + pattern)]
    if not found and not given.startswith("layers."):
        found = match_transformer_lens(given, axes, layer)          # a TransformerLens hook name, as an alias
    if not found:
        bad = re.match(r"layers\.(\d+)\.", pattern)
        if bad and int(bad.group(1)) >= n_layers:
            raise ValueError(f"layer {int(bad.group(1))} in {pattern!r} does not exist: "
                             f"the model has layers 0..{n_layers - 1}")
        raise ValueError(f"no snapshot is named {pattern!r}; names are {_summary(axes)}")
    return found


def resolve_all(patterns, axes: dict) -> list[str]:
    """Registry names matched by any of ``patterns`` (a str or a list of them, as for
    :func:`resolve`), each once, in forward order.

    ``patterns`` may also be a function of a name returning True or False (TransformerLens'
    ``names_filter``): it is asked about every snapshot by its glassllm name and, where it has one,
    by its TransformerLens hook name, and the snapshot is chosen when either answer is True.
    """
    if isinstance(patterns, str):
        patterns = [patterns]
    if callable(patterns):
        return [k for k in axes if _chosen(patterns, k)]
    if isinstance(patterns, (bytes, dict)) or not isinstance(patterns, (list, tuple, set, frozenset)):
        raise TypeError(f"names must be a str, a list of str or a function of a name, got {type(patterns).__name__}")
    patterns = list(patterns)
    chosen = set()
    for p in patterns:
        chosen.update(resolve(p, axes))
    return [k for k in axes if k in chosen]


def _chosen(accept, name: str) -> bool:
    """Does the filter ``accept`` take snapshot ``name`` (by its own name or its TransformerLens hook's)?"""
    hook = transformer_lens_name(name)
    for key in (name, hook) if hook is not None else (name,):
        answer = accept(key)
        if not isinstance(answer, (bool, np.bool_)):
            raise TypeError(f"a names filter must return True or False, got {answer!r} for {key!r}")
        if answer:
            return True
    return False


def head_axis(axes: tuple) -> int | None:
    """The position of the head axis (H for query heads, G for key/value heads) in a
    snapshot's ``axes``, or None if it has none."""
    for letter in ("H", "G"):
        if letter in axes:
            return axes.index(letter)
    return None


def storage_dtype(dtype) -> np.dtype | None:
    """``dtype`` as one of :data:`STORAGE_DTYPES` (None: keep the model's); raises otherwise."""
    if dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be one of {STORAGE_DTYPES}, got {dtype!r}") from None
    if dt.name not in STORAGE_DTYPES:
        raise ValueError(f"dtype must be one of {STORAGE_DTYPES}, got {dt.name!r}")
    return dt


def check_index(value, what: str, size: int | None = None) -> int:
    """``value`` as an int index in [0, size); with ``size``, negative values count from the end, as in
    Python. ``what`` names it in the one-line error (``TypeError`` for a non-int, ``ValueError`` out of range)."""
    if not is_int(value):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if size is not None and -size <= value < 0:
        return int(value) + size
    if value < 0 or (size is not None and value >= size):
        where = f"0..{size - 1} (or -{size}..-1 from the end)" if size else "an int >= 0"
        raise ValueError(f"{what}={value} is out of range: expected {where}")
    return int(value)


def check_layer(layer, n_layers: int) -> int:
    """A layer number in [0, n_layers); -1 is the last layer, as in Python."""
    if not is_int(layer):
        raise ValueError(f"layer {layer!r} does not exist: the model has layers 0..{n_layers - 1}")
    if not -n_layers <= layer < n_layers:
        raise ValueError(f"layer {layer!r} does not exist: the model has layers 0..{n_layers - 1} "
                         f"(or -{n_layers}..-1 from the end)")
    return int(layer) % n_layers



# ----------------------------------------------------------------------------
# The documented table (docs/snapshots.md)
# ----------------------------------------------------------------------------

DOC_BEGIN = "<!-- BEGIN GENERATED: python -m glassllm.trace docs/snapshots.md -->"
DOC_END = "<!-- END GENERATED -->"


def generic_names(config: ModelConfig | None = None) -> list[tuple[str, tuple[str, ...], tuple, str]]:
    """Every snapshot once, in forward order, with ``layers.{i}.`` standing for every block:
    ``(generic name, axis letters, shape for config with n and m symbolic, description)``."""
    config = ModelConfig() if config is None else config
    sizes = {**axis_sizes(config, 0, 0), "n": "n", "m": "m"}
    out, seen = [], set()
    for name, axes in registry(config).items():
        generic = re.sub(r"^layers\.\d+\.", "layers.{i}.", name)
        if generic not in seen:
            seen.add(generic)
            out.append((generic, axes, tuple(sizes[a] for a in axes),
                        DESCRIPTIONS[generic.removeprefix("layers.{i}.")]))
    return out


def snapshot_table(config: ModelConfig | None = None) -> str:
    """The Markdown table of every snapshot: name, axes, shape for ``config`` (n, m symbolic), equation,
    meaning, and the function whose ``self.snap`` call records it (:mod:`glassllm.trace.explain`)."""
    where = sites()
    rows = ["| name | axes | shape | equation | what it is | recorded in |", "|---|---|---|---|---|---|"]
    for generic, axes, shape, description in generic_names(config):
        rows.append(f"| `{generic}` | {_tuple(axes)} | {_tuple(shape)} | {equation(generic)['text']} | "
                    f"{description} | `{where[generic].function}` |")
    return "\n".join(rows) + "\n"


def _tuple(items) -> str:
    items = [str(i) for i in items]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


NAME_MAP_BEGIN = "<!-- BEGIN GENERATED NAME MAP: python -m glassllm.trace docs/snapshots.md -->"


def write_snapshot_doc(path) -> None:
    """Replace the generated blocks of ``path`` (between the markers): :func:`snapshot_table`, and
    :func:`glassllm.trace.names.name_map_table` when the page has its markers."""
    from .names import name_map_table

    text = Path(path).read_text(encoding="utf-8")
    if DOC_BEGIN not in text or DOC_END not in text:
        raise ValueError(f"{str(path)!r} lacks the markers {DOC_BEGIN!r} ... {DOC_END!r}")
    text = _replace_block(text, DOC_BEGIN, snapshot_table())
    if NAME_MAP_BEGIN in text:
        text = _replace_block(text, NAME_MAP_BEGIN, name_map_table())
    atomic_write(path, text)


def _replace_block(text: str, begin: str, table: str) -> str:
    head, rest = text.split(begin, 1)
    if DOC_END not in rest:
        raise ValueError(f"the block {begin!r} has no end marker {DOC_END!r}")
    _, tail = rest.split(DOC_END, 1)
    return f"{head}{begin}\n{table}{DOC_END}{tail}"

