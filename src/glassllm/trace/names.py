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
