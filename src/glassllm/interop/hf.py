"""Hugging Face interop: export a model file as a ``transformers`` Llama folder, and import one back.

Export (``glassllm export FILE --format hf DIR``) writes a folder that
``LlamaForCausalLM.from_pretrained(DIR)`` and ``AutoTokenizer.from_pretrained(DIR)``
load:

=========================  ==================================================
``config.json``            a ``LlamaConfig`` (no biases, plain RoPE; ``tie_word_embeddings``
                           as the model's ``tie_embeddings``)
``model.safetensors``      the weights under Hugging Face's names (no ``lm_head.weight``
                           when the head is tied: it is the embedding)
``tokenizer.json``         our byte-level BPE for the ``tokenizers`` library
                           (:func:`tokenizer_to_hf`)
``tokenizer_config.json``  tells ``AutoTokenizer`` to use that file, and names
                           ``<|endoftext|>`` as the end-of-sequence token
``generation_config.json`` begin/end/pad token ids for ``generate``
=========================  ==================================================

Import (``glassllm import DIR OUT``, also ``import-hf``) reads such a folder -- any width, depth,
head count, grouping and vocabulary -- and writes a glassllm model file. It
reads ``config.json``, ``tokenizer.json`` and the safetensors weights itself
(neither ``transformers`` nor ``torch`` is needed) and refuses, with one line
naming the key, anything whose logits it could not reproduce exactly: biases,
RoPE scaling, another activation, a head size other than width / heads, a
tokenizer that is neither byte-level BPE nor SentencePiece BPE (in
``tokenizer.json``, or a ``tokenizer.model`` without it: see
:mod:`glassllm.tokenizers.sentencepiece`), a vocabulary that does not match the embedding.
A checkpoint with a tied output head (``tie_word_embeddings: true``) is imported tied
(``ModelConfig.tie_embeddings``): the model file holds the embedding once and no
``output.weight``; an ``lm_head.weight`` stored beside it must equal the embedding.
Pickled ``.bin`` checkpoints are refused: loading never unpickles anything.

Names, key for key (``{i}`` is the layer):

================================================  ========================================
glassllm                                          Hugging Face
================================================  ========================================
``tok_embeddings.weight``                         ``model.embed_tokens.weight``
``layers.{i}.attention_norm.weight``              ``model.layers.{i}.input_layernorm.weight``
``layers.{i}.attention.wq/wk/wv/wo.weight``       ``model.layers.{i}.self_attn.q/k/v/o_proj.weight``
``layers.{i}.ffn_norm.weight``                    ``model.layers.{i}.post_attention_layernorm.weight``
``layers.{i}.feed_forward.w1/w3/w2.weight``       ``model.layers.{i}.mlp.gate/up/down_proj.weight``
``norm.weight``                                   ``model.norm.weight``
``output.weight``                                 ``lm_head.weight`` (neither, when tied)
================================================  ========================================

RoPE layout, and why wq and wk are permuted
-------------------------------------------
RoPE turns pairs of features of every query and key head by a position-dependent
angle. *Which* features form a pair is a convention. glassllm (like the RoPE
paper and Meta's original code) pairs neighbours: features (2i, 2i+1) of a head
turn together at frequency ``theta**(-2i/D)``. Hugging Face's Llama pairs the
two halves instead: feature i turns with feature i + D/2 (its ``rotate_half``).
Both are the same rotation once the features are listed in another order, and
the features of q and k are just the rows of wq and wk. So export reorders the
rows inside each head -- our rows 0, 2, 4, ..., D-2 become the first half and
rows 1, 3, ..., D-1 the second half (:func:`interleaved_to_halves`) -- and import
undoes it (:func:`halves_to_interleaved`). Scores q.k are sums over all features,
so listing them in another order changes nothing; wv and wo are untouched.
Forgetting the permutation leaves position 0 right (angle 0 is no rotation) and
goes wrong as positions grow, which is why the tests compare 300 positions.

Vocabulary order
----------------
A glassllm vocabulary is laid out as the 256 bytes, then one id per merge in
merge order, then the special tokens. A byte-level BPE ``tokenizer.json`` may
number its tokens differently; import then renumbers the tokens into our layout
and permutes the rows of the embedding and of the output head the same way, so
the model computes exactly the same function of the text (``import_hf`` returns
the permutation, and ``glassllm import-hf`` says when it applied one).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..checkpoint import is_model_file, load_model, save_model
from ..checks import is_int
from ..config import ModelConfig
from ..files import (atomic_write, encode_safetensors, file_in_folder, make_folder, read_file, read_safetensors,
                     refuse_to_replace)
from ..limits import MAX_JSON_BYTES, check_count, expect, parse_json
from ..nn import Transformer, model_dtype
from ..tokenizers.hfjson import is_sentencepiece, tokenizer_from_hf, tokenizer_to_hf
from ..tokenizers.hfjson import unsupported as _bad
from ..tokenizers.sentencepiece import SPTokenizer, load_sentencepiece_model

__all__ = [
    "interleaved_to_halves", "halves_to_interleaved", "rotated_heads", "hf_config", "config_from_hf",
    "to_hf_state", "from_hf_state", "tokenizer_to_hf", "tokenizer_from_hf", "export_hf", "import_hf", "load_hf",
    "read_safetensors_dir",
]


# ----------------------------------------------------------------------------
# RoPE row order
# ----------------------------------------------------------------------------

def interleaved_to_halves(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder the rows of wq or wk (n_heads*D, C) from interleaved pairs to split halves.

    Inside each head, our row 2i becomes row i and row 2i+1 becomes row D/2 + i.

    >>> interleaved_to_halves(np.arange(8)[:, None], n_heads=2)[:, 0].tolist()
    [0, 2, 1, 3, 4, 6, 5, 7]
    """
    rows, C = w.shape
    D = rows // n_heads
    return w.reshape(n_heads, D // 2, 2, C).transpose(0, 2, 1, 3).reshape(rows, C)  # (H*D, C)


def halves_to_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of :func:`interleaved_to_halves`: split halves back to interleaved pairs.

    >>> halves_to_interleaved(np.array([0, 2, 1, 3, 4, 6, 5, 7])[:, None], 2)[:, 0].tolist()
    [0, 1, 2, 3, 4, 5, 6, 7]
    """
    rows, C = w.shape
    D = rows // n_heads
    return w.reshape(n_heads, 2, D // 2, C).transpose(0, 2, 1, 3).reshape(rows, C)  # (H*D, C)


# ----------------------------------------------------------------------------
# Names and configs
# ----------------------------------------------------------------------------

_LAYER_NAMES = {  # ours -> Hugging Face, inside layer i
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
}
_TOP_NAMES = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


def hf_names(n_layers: int, tied: bool = False) -> dict[str, str]:
    """Our parameter name -> Hugging Face's, for a model of ``n_layers`` layers (``tied``: with no
    output head of its own)."""
    names = {k: v for k, v in _TOP_NAMES.items() if not (tied and k == "output.weight")}
    for i in range(n_layers):
        for ours, theirs in _LAYER_NAMES.items():
            names[f"layers.{i}.{ours}"] = f"model.layers.{i}.{theirs}"
    return names


def hf_config(config: ModelConfig, tokenizer, dtype: str = "float32") -> dict:
    """The ``config.json`` of a ``LlamaForCausalLM`` with the shape of ``config``.

    RoPE's base is written both ways (``rope_parameters`` for transformers 5,
    ``rope_theta`` for 4.x), and so is the dtype (``dtype`` / ``torch_dtype``).
    """
    bos, eos = _bos_eos(tokenizer)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.dim,
        "intermediate_size": config.ffn_dim,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": float(config.norm_eps),        # transformers 5 insists on floats here
        "rope_theta": float(config.rope_theta),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(config.rope_theta)},
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": config.tie_embeddings,
        "pretraining_tp": 1,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": None,
        "dtype": dtype,
        "torch_dtype": dtype,
    }


def config_from_hf(doc: dict, where: str = "config.json") -> tuple[ModelConfig, bool]:
    """Our :class:`ModelConfig` for a Hugging Face Llama ``config.json``, and whether the head is tied
    (``tie_word_embeddings``, which becomes the config's ``tie_embeddings``).

    Raises ValueError naming the first key that glassllm cannot reproduce exactly.
    """
    if not isinstance(doc, dict):
        raise ValueError(f"{where} is not a JSON object")
    arch = doc.get("architectures") or []
    if doc.get("model_type") != "llama" and "LlamaForCausalLM" not in arch:
        raise ValueError(f"{where}: model_type={doc.get('model_type')!r} (architectures={arch!r}) is not a Llama "
                         "checkpoint; expected model_type 'llama'")
    if arch and any(a != "LlamaForCausalLM" for a in arch):
        raise _bad(where, "architectures", arch, "['LlamaForCausalLM']")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if key not in doc:
            raise ValueError(f"{where} has no {key!r}; expected a Llama config")
        if not is_int(doc[key]) or doc[key] < 1:                  # "32", 4.0, true: not a size
            raise _bad(where, key, doc[key], "an int >= 1")
    for key in ("attention_bias", "mlp_bias"):
        if doc.get(key, False):
            raise _bad(where, key, doc[key], "false (glassllm has no biases)")
    if doc.get("hidden_act", "silu") != "silu":
        raise _bad(where, "hidden_act", doc.get("hidden_act"), "'silu' (SwiGLU)")

    # RoPE: only the plain kind, with its base wherever this transformers version put it.
    theta = doc.get("rope_theta", 10000.0)
    scaling = doc.get("rope_scaling")
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else scaling
        if kind != "default" or set(scaling) - {"rope_type", "type", "rope_theta"}:
            raise _bad(where, "rope_scaling", scaling, "null (plain RoPE, no scaling)")
        theta = scaling.get("rope_theta", theta)
    params = doc.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise _bad(where, "rope_parameters", params, "an object such as {'rope_type': 'default', 'rope_theta': "
                                                        "10000.0}")
        if params.get("rope_type", "default") != "default":
            raise _bad(where, "rope_parameters.rope_type", params.get("rope_type"), "'default' (plain RoPE)")
        extra = sorted(set(params) - {"rope_type", "rope_theta"})
        if extra:
            raise _bad(where, f"rope_parameters.{extra[0]}", params[extra[0]], "no such key (plain RoPE)")
        theta = params.get("rope_theta", theta)
    if doc.get("partial_rotary_factor", 1.0) != 1.0:
        raise _bad(where, "partial_rotary_factor", doc["partial_rotary_factor"], "1.0")

    dim, heads = doc["hidden_size"], doc["num_attention_heads"]
    head_dim = doc.get("head_dim")
    if head_dim is not None and (not is_int(dim) or not is_int(heads) or heads < 1
                                 or head_dim * heads != dim):
        raise _bad(where, "head_dim", head_dim, f"hidden_size / num_attention_heads = {dim}/{heads}")
    tied = doc.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise _bad(where, "tie_word_embeddings", tied, "true or false")
    kv_heads = doc.get("num_key_value_heads")
    try:
        config = ModelConfig(
            vocab_size=doc["vocab_size"], dim=dim, n_layers=doc["num_hidden_layers"], n_heads=heads,
            n_kv_heads=heads if kv_heads is None else kv_heads, ffn_dim=doc["intermediate_size"],
            max_seq_len=doc.get("max_position_embeddings", 2048),
            norm_eps=doc.get("rms_norm_eps", 1e-6), rope_theta=theta, tie_embeddings=tied,
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    return config, tied


# ----------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------

def rotated_heads(name: str, config: ModelConfig) -> int | None:
    """The heads of weight ``name`` (ours) if RoPE rotates what it computes (``wq``: H, ``wk``: G), whose
    rows Hugging Face keeps in split-halves order and glassllm in interleaved pairs; None for the others."""
    if name.endswith("attention.wq.weight"):
        return config.n_heads
    if name.endswith("attention.wk.weight"):
        return config.n_kv_heads
    return None


def to_hf_state(state: dict[str, np.ndarray], config: ModelConfig) -> dict[str, np.ndarray]:
    """Our state dict -> Hugging Face's: renamed, wq/wk rows in split-halves order (a tied head has
    no ``lm_head.weight``: ``tie_word_embeddings`` says it is the embedding)."""
    out = {}
    for ours, theirs in hf_names(config.n_layers, config.tie_embeddings).items():
        w, heads = np.asarray(state[ours]), rotated_heads(ours, config)
        out[theirs] = np.ascontiguousarray(w if heads is None else interleaved_to_halves(w, heads))
    return out


def from_hf_state(tensors: dict[str, np.ndarray], config: ModelConfig,
                  where: str = "checkpoint") -> dict[str, np.ndarray]:
    """Hugging Face's tensors -> our state dict, checking every name and shape.

    With ``config.tie_embeddings`` the checkpoint shares the embedding with the output head: the
    state has no ``output.weight``, and an ``lm_head.weight`` in the checkpoint (transformers may
    save one) must equal the embedding.
    """
    names = hf_names(config.n_layers, config.tie_embeddings)
    theirs_to_ours = {v: k for k, v in names.items()}
    tensors = {k: v for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}  # a buffer, not a weight
    if config.tie_embeddings and "lm_head.weight" in tensors:
        if not np.array_equal(tensors.pop("lm_head.weight"), tensors.get("model.embed_tokens.weight")):
            raise _bad(where, "tie_word_embeddings", True, "lm_head.weight equal to model.embed_tokens.weight")
    unexpected = sorted(set(tensors) - set(theirs_to_ours))
    if unexpected:
        hint = " (glassllm has no biases)" if unexpected[0].endswith(".bias") else ""
        raise ValueError(f"{where}: unexpected tensor {unexpected[0]!r}{hint}; expected only Llama weights")
    missing = [k for k in names.values() if k not in tensors]
    if missing:
        raise ValueError(f"{where}: missing tensor {missing[0]!r}")
    shapes = config.param_shapes()
    state = {}
    for ours, theirs in names.items():
        w = tensors[theirs]
        if tuple(w.shape) != shapes[ours]:
            raise ValueError(f"{where}: tensor {theirs!r} has shape {tuple(w.shape)}, expected {shapes[ours]}")
        heads = rotated_heads(ours, config)
        state[ours] = np.ascontiguousarray(w if heads is None else halves_to_interleaved(w, heads))
    return state


def weight_files(folder) -> list[tuple[Path, set[str] | None]]:
    """The safetensors files of a Hugging Face folder and the tensors to read from each (None: all):
    ``model.safetensors``, or the shards its index names (the index checked field by field)."""
    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return [(single, None)]
    if index.is_file():
        doc = _read_json(index, "a safetensors index")
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict):
            raise ValueError(f"{str(index)!r} is not a safetensors index: its 'weight_map' must be an object "
                             f"of tensor names to shard files, got {type(weight_map).__name__}")
        check_count("weight_map", len(weight_map), "tensors", repr(str(index)))
        bad = next(((k, v) for k, v in weight_map.items() if not isinstance(v, str)), None)
        if bad:
            raise ValueError(f"{str(index)!r}: weight_map[{bad[0][:40]!r}] must be a shard file name, "
                             f"got {type(bad[1]).__name__}")
        out = []
        for shard in sorted(set(weight_map.values())):
            path = folder / shard
            if not path.is_file() or path.parent != folder:
                raise ValueError(f"{str(index)!r} names shard {shard[:60]!r}, which is not in the folder")
            out.append((path, {k for k, v in weight_map.items() if v == shard}))
        return out
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise ValueError(f"{str(folder)!r} holds only pickled weights (.bin/.pt); glassllm reads safetensors "
                         "only (save the model with safe_serialization=True)")
    raise ValueError(f"{str(folder)!r} has no model.safetensors (nor model.safetensors.index.json)")


def read_safetensors_dir(folder) -> dict[str, np.ndarray]:
    """The weights of a Hugging Face folder: ``model.safetensors``, or the shards its index names."""
    tensors = {}
    for path, wanted in weight_files(folder):
        tensors.update(read_safetensors(path, wanted))
    return tensors


# ----------------------------------------------------------------------------
# Export and import
# ----------------------------------------------------------------------------

def _bos_eos(tokenizer) -> tuple[int | None, int | None]:
    """The begin and end ids a Hugging Face config names: ``<s>``/``</s>`` for a SentencePiece
    tokenizer, ``<|endoftext|>`` for both in glassllm's own."""
    specials = tokenizer.special_tokens
    if "<s>" in specials and "</s>" in specials:
        return specials["<s>"], specials["</s>"]
    eot = specials.get("<|endoftext|>")
    return eot, eot


def _dtype_name(model) -> str:
    return {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64"}[np.dtype(model.dtype)]


def export_hf(model_file, out_dir) -> Path:
    """Write the model file ``model_file`` as a Hugging Face Llama folder ``out_dir``.

    Each file is written atomically; other files already in ``out_dir`` are left alone.
    A folder whose ``model.safetensors`` is ``model_file`` itself, or that holds a
    glassllm training run, is refused (the export would replace that file).
    Returns the folder.
    """
    model, tokenizer, meta = load_model(model_file)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"export target {str(out)!r} exists and is not a folder")
    target = out / "model.safetensors"
    if target.exists() and os.path.samefile(target, model_file):
        raise ValueError(f"cannot export into {str(out)!r}: its model.safetensors is the input file; "
                         "choose another folder")
    if (out / "train_state.safetensors").exists():
        raise ValueError(f"cannot export into {str(out)!r}: it holds a glassllm training run, whose "
                         "model.safetensors the export would replace; choose another folder")
    make_folder(out)
    c = model.config
    tensors = to_hf_state(model.state_dict(), c)
    bos, eos = _bos_eos(tokenizer)
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": c.max_seq_len,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": tokenizer.bos_id is not None,
        "add_eos_token": False,
    }
    names = {i: p for p, i in tokenizer.special_tokens.items()}
    if eos is not None:
        tok_config.update(eos_token=names[eos], bos_token=names[bos])
    if "<unk>" in names.values():
        tok_config.update(unk_token="<unk>")
    gen_config = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos, "do_sample": False}
    dump = lambda d: json.dumps(d, indent=2, ensure_ascii=False) + "\n"  # noqa: E731
    atomic_write(out / "model.safetensors", encode_safetensors(tensors, {"format": "pt"}))
    atomic_write(out / "config.json", dump(hf_config(c, tokenizer, _dtype_name(model))))
    atomic_write(out / "tokenizer.json", dump(tokenizer_to_hf(tokenizer)))
    atomic_write(out / "tokenizer_config.json", dump(tok_config))
    atomic_write(out / "generation_config.json", dump(gen_config))
    return out


def _read_json(path: Path, what: str, kind=None):
    """The JSON document ``path`` (:func:`glassllm.limits.parse_json`: bounded size and depth), and with
    ``kind``, of that type (``dict``); one ``ValueError`` line naming the file otherwise."""
    if path.is_dir():
        raise ValueError(f"{str(path)!r} is a folder; expected {what}")
    if not path.exists():
        raise ValueError(f"{str(path.parent)!r} has no {path.name}; expected {what}")
    doc = parse_json(read_file(path, max_bytes=MAX_JSON_BYTES, limit_of="a JSON document"), repr(str(path)))
    return expect(doc, kind, f"{str(path)!r} (the whole document)") if kind is not None else doc


def folder_tokenizer(folder: Path):
    """The tokenizer of a Hugging Face folder: ``(tokenizer, perm, path)``.

    ``tokenizer.json`` is read as glassllm's byte-level BPE or, when it is one, as a
    SentencePiece BPE (:meth:`~glassllm.tokenizers.sentencepiece.SPTokenizer.from_hf_tokenizer_json`,
    ids unchanged); without it, a SentencePiece ``tokenizer.model`` is read, and
    ``tokenizer_config.json``'s ``add_bos_token`` (default true) says whether ``<s>`` goes first.
    """
    tok_path = folder / "tokenizer.json"
    if tok_path.is_file():
        doc = _read_json(tok_path, "a tokenizer")
        model = doc.get("model") if isinstance(doc, dict) else None
        for key, name in (("vocab", "vocabulary"), ("merges", "array")):   # before a tokenizer is built of them
            if isinstance(model, dict) and isinstance(model.get(key), (dict, list)):
                check_count(f"model.{key} (entries)", len(model[key]), name, repr(str(tok_path)))
        if is_sentencepiece(doc):
            tokenizer = SPTokenizer.from_hf_tokenizer_json(doc, str(tok_path))
            return tokenizer, np.arange(tokenizer.vocab_size), tok_path
        tokenizer, perm = tokenizer_from_hf(doc, str(tok_path))
        return tokenizer, perm, tok_path
    sp_path = folder / "tokenizer.model"
    if sp_path.is_file():
        cfg_path = folder / "tokenizer_config.json"
        add_bos = (_read_json(cfg_path, "a tokenizer config", dict).get("add_bos_token", True)
                   if cfg_path.is_file() else True)
        tokenizer = load_sentencepiece_model(sp_path, add_bos=bool(add_bos))
        return tokenizer, np.arange(tokenizer.vocab_size), sp_path
    raise ValueError(f"{str(folder)!r} has no tokenizer.json or tokenizer.model; expected the checkpoint's "
                     "tokenizer beside config.json")


def load_hf(folder, dtype=None):
    """Read a Hugging Face Llama folder: ``(model, tokenizer, perm)`` (see :func:`tokenizer_from_hf`).

    ``dtype``: the model's float type; None keeps the checkpoint's precision (float64 when
    its tensors are F64, else float32: F16 and BF16 weights are widened to float32).
    """
    if dtype is not None:
        dtype = model_dtype(dtype)
    folder = Path(folder)
    config_path = file_in_folder(folder, "config.json", "a Hugging Face Llama checkpoint folder",
                                 f"{str(folder)!r} is not a Llama checkpoint: it has no config.json")
    config, tied = config_from_hf(_read_json(config_path, "a Llama config", dict), str(config_path))
    tokenizer, perm, tok_path = folder_tokenizer(folder)
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(f"{str(tok_path)!r} has {tokenizer.vocab_size} tokens but config.json says "
                         f"vocab_size={config.vocab_size}; expected them equal")
    # Can the weight files hold the config's weights (2 bytes each at least: F16, BF16)? Asked before
    # any tensor is read, so that a config of a few bytes cannot claim a model of gigabytes.
    files = weight_files(folder)
    total = sum(path.stat().st_size for path, _ in files)
    config.check_weights_fit(total, 2, str(folder))
    config.check_tables(total, str(folder))
    state = from_hf_state(read_safetensors_dir(folder), config, str(folder))
    if not np.array_equal(perm, np.arange(len(perm))):
        for key in [k for k in ("tok_embeddings.weight", "output.weight") if k in state]:  # (a tied head: one)
            state[key] = np.ascontiguousarray(state[key][perm])                  # (V, C), our id order
    for key, w in state.items():
        if not np.all(np.isfinite(w)):
            raise ValueError(f"{str(folder)!r}: tensor for {key!r} contains NaN or infinite values")
    if dtype is None:
        dtype = np.float64 if any(w.dtype == np.float64 for w in state.values()) else np.float32
    model = Transformer(config, dtype=dtype, init=False)
    model.load_state_dict(state, copy=False)   # float32/float64 tensors stay mapped (read_safetensors)
    return model, tokenizer, perm


def import_hf(folder, out_file, dtype=None):
    """Convert the Hugging Face Llama folder ``folder`` into the glassllm model file ``out_file``.

    Returns ``(model, tokenizer, perm)``; ``perm[our_id]`` is the original id.
    ``out_file`` may not be inside the folder (it would overwrite or sit among the
    checkpoint's own files). ``dtype``: as :func:`load_hf`.
    """
    out = Path(out_file)
    if Path(folder).is_dir() and out.resolve().is_relative_to(Path(folder).resolve()):
        raise ValueError(f"cannot write {str(out)!r} into the checkpoint folder {str(folder)!r} being read; "
                         "choose a file outside it")
    refuse_to_replace(out, "the output", "a glassllm model file", is_model_file)
    model, tokenizer, perm = load_hf(folder, dtype)
    save_model(out_file, model, tokenizer, {"source": f"hf:{Path(folder).name}"})
    return model, tokenizer, perm
