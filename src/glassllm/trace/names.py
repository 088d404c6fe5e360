"""glassllm's snapshot names next to TransformerLens' hook names and Hugging Face's outputs.

:func:`transformer_lens_name` maps a snapshot name to the TransformerLens hook
that holds the same numbers (TransformerLens 4, ``TransformerBridge`` on the
Hugging Face export, weights unprocessed), or ``None``; :func:`to_transformer_lens`
converts a snapshot (batch removed) to that hook's layout (batch removed).
The differences:

* heads: glassllm puts the head axis first, (H, n, D); TransformerLens puts
  positions first, (n, H, D) -- except for ``hook_attn_scores`` and
  ``hook_pattern``, (H, n, m) in both;
* q and k: glassllm rotates interleaved feature pairs (2i, 2i+1), Hugging
  Face and TransformerLens split halves (i, i + D/2); the export permutes the
  rows of wq and wk, so ``hook_q``, ``hook_k``, ``hook_rot_q`` and
  ``hook_rot_k`` hold glassllm's features in the order 0, 2, 4, ..., 1, 3, 5, ...
  within each head;
* scores: glassllm's ``attn.scores`` are taken before the mask (``attn.mask``
  says which cells are forbidden); ``hook_attn_scores`` holds -inf there;
* norms: ``rms`` is (n,), ``hook_scale`` (n, 1).

The table in ``docs/snapshots.md`` (:func:`name_map_table`) also names each
snapshot's Hugging Face counterpart.

Called, the module is the registry's list of names: ``glassllm.trace.names()`` is
:func:`glassllm.trace.registry.names` (every snapshot name in forward order).
"""

from __future__ import annotations

import fnmatch
import re

import numpy as np

# Layer-local (or top-level) glassllm name -> TransformerLens hook ("{i}" = the layer), layout note, HF counterpart.
_MAP = {
    "embed": ("hook_embed", "same", "`hidden_states[0]` (`output_hidden_states=True`)"),
    "resid_pre": ("blocks.{i}.hook_resid_pre", "same", "`hidden_states[i]`"),
    "attn_norm.in": ("blocks.{i}.ln1.hook_in", "same", "input of `model.layers[i].input_layernorm`"),
    "attn_norm.rms": ("blocks.{i}.ln1.hook_scale", "(n,) vs (n, 1)", "none (`input_layernorm` computes it inside)"),
    "attn_norm.out": ("blocks.{i}.ln1.hook_out", "same", "output of `input_layernorm`"),
    "attn.q": ("blocks.{i}.attn.hook_q", "(H, n, D) vs (n, H, D); q/k feature order",
               "output of `self_attn.q_proj`, (n, H*D); q/k feature order"),
    "attn.k": ("blocks.{i}.attn.hook_k", "(G, n, D) vs (n, G, D); q/k feature order",
               "output of `self_attn.k_proj`, (n, G*D); q/k feature order"),
    "attn.v": ("blocks.{i}.attn.hook_v", "(G, n, D) vs (n, G, D)", "output of `self_attn.v_proj`, (n, G*D)"),
    "attn.rope_q": ("blocks.{i}.attn.hook_rot_q", "(H, n, D) vs (n, H, D); q/k feature order",
                    "none (inside `self_attn`)"),
    "attn.rope_k": ("blocks.{i}.attn.hook_rot_k", "(G, n, D) vs (n, G, D); q/k feature order",
                    "none (inside `self_attn`)"),
    "attn.cache_k": (None, "", "`past_key_values` (key/value heads, split-halves order)"),
    "attn.cache_v": (None, "", "`past_key_values`"),
    "attn.scores": ("blocks.{i}.attn.hook_attn_scores", "same shape; TransformerLens has -inf in masked cells",
                    "none (inside `self_attn`)"),
    "attn.mask": (None, "", "the causal mask the model builds (True there = allowed)"),
    "attn.softmax": ("blocks.{i}.attn.hook_pattern", "same", "`attentions[i]` (`output_attentions=True`, eager)"),
    "attn.mix": ("blocks.{i}.attn.hook_z", "(H, n, D) vs (n, H, D)", "input of `self_attn.o_proj`, (n, H*D)"),
    "attn.head_out": ("blocks.{i}.attn.hook_result", "(H, n, C) vs (n, H, C); needs `set_use_attn_result(True)`",
                      "none"),
    "attn.out": ("blocks.{i}.hook_attn_out", "same", "output of `self_attn`"),
    "resid_mid": ("blocks.{i}.hook_resid_mid", "same", "none"),
    "mlp_norm.in": ("blocks.{i}.ln2.hook_in", "same", "input of `post_attention_layernorm`"),
    "mlp_norm.rms": ("blocks.{i}.ln2.hook_scale", "(n,) vs (n, 1)", "none"),
    "mlp_norm.out": ("blocks.{i}.ln2.hook_out", "same", "output of `post_attention_layernorm`"),
    "mlp.gate": ("blocks.{i}.mlp.hook_pre", "same", "output of `mlp.gate_proj`"),
    "mlp.up": ("blocks.{i}.mlp.hook_pre_linear", "same", "output of `mlp.up_proj`"),
    "mlp.act": (None, "", "output of `mlp.act_fn`"),
    "mlp.prod": ("blocks.{i}.mlp.hook_post", "same", "input of `mlp.down_proj`"),
    "mlp.out": ("blocks.{i}.hook_mlp_out", "same", "output of `mlp`"),
    "resid_post": ("blocks.{i}.hook_resid_post", "same", "`hidden_states[i + 1]` (not for the last layer: "
                   "there `hidden_states[-1]` is after the final norm)"),
    "norm.in": ("ln_final.hook_in", "same", "none"),
    "norm.rms": ("ln_final.hook_scale", "(n,) vs (n, 1)", "none"),
    "norm.out": ("ln_final.hook_out", "same", "`hidden_states[-1]`"),
    "logits": ("unembed.hook_out", "same", "`logits`"),
    "probs": (None, "", "`logits.softmax(-1)`"),
}

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_TOP = ("embed", "norm", "logits", "probs")          # names outside the blocks


def _split(name: str) -> tuple[str, int | None]:
    if not isinstance(name, str):
        raise TypeError(f"a snapshot name must be a str, got {type(name).__name__}")
    found = _LAYER.match(name)
    local, layer = (found.group(2), int(found.group(1))) if found else (name, None)
    top = local.split(".")[0] in _TOP
    if local not in _MAP or (layer is None) != top:
        raise ValueError(f"no snapshot is named {name!r}; give a full name such as 'layers.0.attn.softmax'")
    return local, layer


def transformer_lens_name(name: str) -> str | None:
    """The TransformerLens hook holding the numbers of snapshot ``name``, or None where there is none.

    >>> transformer_lens_name("layers.2.attn.softmax"), transformer_lens_name("layers.0.mlp.prod")
    ('blocks.2.attn.hook_pattern', 'blocks.0.mlp.hook_post')
    >>> transformer_lens_name("layers.1.attn.mask") is None
    True
    """
    local, layer = _split(name)
    hook = _MAP[local][0]
    return None if hook is None else hook.replace("{i}", str(layer))


# TransformerLens' short names (``cache["pattern", 0]``, ``utilities.get_act_name``): which part of a block
# holds the hook, and the other words it accepts for some of them.
_SHORT_PART = {**dict.fromkeys(("q", "k", "v", "z", "rot_q", "rot_k", "result", "pattern", "attn_scores"), "attn"),
               **dict.fromkeys(("pre", "post", "mid", "pre_linear"), "mlp")}
_SHORT_ALIAS = {"attn": "pattern", "attn_logits": "attn_scores", "key": "k", "query": "q", "value": "v",
                "mlp_pre": "pre", "mlp_mid": "mid", "mlp_post": "post"}
_LN_PART = {"ln1": "ln1", "ln2": "ln2", "a": "ln1", "m": "ln2"}


def transformer_lens_hook(name: str, layer: int | None = None, layer_type: str | None = None) -> str:
    """A TransformerLens hook name from its short form, as ``transformer_lens.utilities.get_act_name`` builds it.

    A name with a dot or starting with ``hook_`` is already a hook name and is returned as it is.

    >>> transformer_lens_hook("pattern", 2), transformer_lens_hook("resid_pre", 0), transformer_lens_hook("embed")
    ('blocks.2.attn.hook_pattern', 'blocks.0.hook_resid_pre', 'hook_embed')
    >>> transformer_lens_hook("scale", 1, "ln2"), transformer_lens_hook("scale")
    ('blocks.1.ln2.hook_scale', 'ln_final.hook_scale')
    """
    if ("." in name or name.startswith("hook_")) and layer is None and layer_type is None:
        return name
    name = _SHORT_ALIAS.get(name, name)
    part = _SHORT_PART.get(name) or _LN_PART.get(layer_type or "", layer_type or "")
    hook = (f"{part}." if part else "") + f"hook_{name}"
    if layer is not None:
        return f"blocks.{layer}.{hook}"
    return f"ln_final.{hook}" if name in ("scale", "normalized") else hook


def from_transformer_lens(hook: str) -> tuple[str, int | None] | None:
    """A TransformerLens hook name (full, without its block, or short) as glassllm's ``(local name, layer)``.

    ``layer`` is None when the hook name does not say it (outside the blocks, or given without
    ``blocks.{i}.``); None when ``hook`` is no TransformerLens name of a snapshot.

    >>> from_transformer_lens("blocks.2.attn.hook_pattern"), from_transformer_lens("z")
    (('attn.softmax', 2), ('attn.mix', None))
    >>> from_transformer_lens("unembed.hook_out"), from_transformer_lens("attn.softmax") is None
    (('logits', None), True)
    """
    if not isinstance(hook, str):
        return None
    found = re.match(r"^blocks\.(\d+)\.(.+)$", hook)
    layer, rest = (int(found.group(1)), found.group(2)) if found else (None, hook)
    for candidate in dict.fromkeys((rest, transformer_lens_hook(rest))):
        for local, (template, _, _) in _MAP.items():
            if template is None:
                continue
            inside = template.removeprefix("blocks.{i}.")
            if candidate == inside and (layer is None or inside != template):
                return local, layer
    return None


def match_transformer_lens(pattern: str, names, layer: int | None = None) -> list[str]:
    """The snapshot names among ``names`` whose TransformerLens hook ``pattern`` names, in their order.

    ``pattern``: a full hook name (``blocks.2.attn.hook_pattern``), a glob of them (``blocks.*.attn.hook_z``),
    a hook name without its block (``attn.hook_pattern``: every layer, or only ``layer``), or a short name
    (``pattern``, ``resid_pre``, ``z``; see :func:`transformer_lens_hook`). Empty when nothing matches.

    >>> match_transformer_lens("blocks.1.attn.hook_pattern", ["layers.0.attn.softmax", "layers.1.attn.softmax"])
    ['layers.1.attn.softmax']
    >>> match_transformer_lens("pattern", ["layers.0.attn.softmax", "layers.1.attn.softmax"], layer=0)
    ['layers.0.attn.softmax']
    """
    hooks = {}
    for name in names:
        try:
            hook = transformer_lens_name(name)
        except ValueError:                       # a name this table does not know
            continue
        if hook is not None:
            hooks[name] = hook
    tries = [pattern]
    if not pattern.startswith("blocks."):
        tries.append(transformer_lens_hook(pattern) if layer is None else transformer_lens_hook(pattern, layer))
    block = "blocks.*." if layer is None else f"blocks.{layer}."
    for p in tries:
        inside = not p.startswith("blocks.")
        for glob in ([p] if layer is None or not inside else []) + ([block + p, block + "*." + p] if inside else []):
            found = [k for k, hook in hooks.items() if fnmatch.fnmatchcase(hook, glob)]
            if found:
                return found
    return []


def _halves(x: np.ndarray) -> np.ndarray:
    """Features of the last axis from interleaved pairs to split halves: 0, 2, 4, ..., 1, 3, 5, ..."""
    D = x.shape[-1]
    return x.reshape(*x.shape[:-1], D // 2, 2).swapaxes(-1, -2).reshape(x.shape)   # (..., D)


def to_transformer_lens(name: str, value: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Snapshot ``name``'s ``value`` (batch removed) in the layout of its TransformerLens hook (batch removed).

    ``attn.scores`` needs its ``attn.mask`` (n, m): TransformerLens stores -inf
    in the forbidden cells. Raises ValueError for a name with no counterpart.
    """
    local, _ = _split(name)
    if _MAP[local][0] is None:
        raise ValueError(f"{name!r} has no TransformerLens counterpart")
    value = np.asarray(value)
    if local in ("attn.q", "attn.k", "attn.rope_q", "attn.rope_k"):
        value = _halves(value)
    if local.endswith(".rms"):
        return value[:, None]                                          # (n, 1)
    if local == "attn.scores":
        if mask is None:
            raise ValueError("attn.scores needs its attn.mask to be converted (TransformerLens puts -inf there)")
        return np.where(mask[None], -np.inf, value)                    # (H, n, m)
    if local.startswith("attn.") and local not in ("attn.softmax", "attn.out"):
        return value.swapaxes(0, 1)                                    # (n, heads, ...)
    return value


def name_map_table() -> str:
    """The Markdown table of every snapshot with its TransformerLens and Hugging Face counterparts."""
    rows = ["| glassllm | TransformerLens | layout (glassllm vs TransformerLens) | Hugging Face Llama |",
            "|---|---|---|---|"]
    for local, (hook, layout, hf) in _MAP.items():
        name = local if local.split(".")[0] in _TOP else f"layers.{{i}}.{local}"
        rows.append(f"| `{name}` | {f'`{hook}`' if hook else 'none'} | {layout or '-'} | {hf} |")
    return "\n".join(rows) + "\n"
