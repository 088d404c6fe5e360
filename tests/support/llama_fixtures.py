"""Fixtures for SentencePiece Llamas, made on the spot (no downloads).

- :func:`sp_training_text`: story-like text with accents, CJK, digits and punctuation;
- :func:`train_sentencepiece`: a small SentencePiece BPE with byte fallback, trained by
  the ``sentencepiece`` package on that text (identity normaliser, spaces kept, as Llama 2's);
- :func:`hf_tokenizer_json`: the same tokenizer as ``transformers`` converts it (``tokenizer.json``);
- :func:`random_llama`: a random ``LlamaForCausalLM`` of a given shape, saved as a folder with that
  tokenizer (``tokenizer.json`` and ``tokenizer.model``);
- :func:`write_gguf`, :func:`write_llama2c`: the same weights as a GGUF file (``gguf``'s writer)
  and as a llama2.c ``.bin`` + ``tokenizer.bin`` (the layouts of llama2.c's ``export.py`` and
  ``tokenizer.py``, written here independently of glassllm's reader).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np

WORDS = ("once upon a time there was a little girl named lily she loved to play with her dog max in the "
         "big green park every day they ran fast and jumped high one sunny morning mom said we will bake "
         "a cake together the cat sat on the mat and looked at the bird happy sad funny brave kind "
         "café naïve über crème brûlée señor 日本 語 こんにちは москва 1 2 3 42 2024").split()
PUNCT = (".", ",", "!", "?", "", "", "", "")


def sp_training_text(n_lines: int = 600, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n_lines):
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=int(rng.integers(4, 16)))]
        words[0] = words[0].capitalize()
        lines.append(" ".join(words) + PUNCT[int(rng.integers(0, len(PUNCT)))])
    return "\n".join(lines) + "\n"


def train_sentencepiece(folder: Path, vocab_size: int = 512, text: str | None = None) -> Path:
    """Train a SentencePiece BPE with byte fallback; returns the ``.model`` path."""
    import sentencepiece as spm

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sp_train.txt").write_text(text or sp_training_text(), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(folder / "sp_train.txt"), model_prefix=str(folder / "sp"), model_type="bpe",
        vocab_size=vocab_size, byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, character_coverage=1.0, add_dummy_prefix=True, split_digits=True,
        allow_whitespace_only_pieces=True, hard_vocab_limit=True, minloglevel=2, num_threads=1,
    )
    return folder / "sp.model"


def hf_tokenizer_json(model_path: Path, folder: Path, add_bos: bool = True) -> Path:
    """``transformers``' own conversion of the SentencePiece model: the folder's ``tokenizer.json``."""
    from transformers import LlamaTokenizer

    src = Path(folder) / "_sp_src"
    src.mkdir(parents=True, exist_ok=True)
    shutil.copy(model_path, src / "tokenizer.model")
    tok = LlamaTokenizer.from_pretrained(str(src), add_bos_token=add_bos, add_eos_token=False)
    tok.save_pretrained(str(folder))
    shutil.rmtree(src)
    return Path(folder) / "tokenizer.json"


def random_llama(folder: Path, sp_model: Path, L=2, C=32, H=4, G=2, F=64, ctx=64, seed=0, tied=False):
    """A random LlamaForCausalLM (float32) with the SentencePiece tokenizer, saved as a HF folder."""
    import sentencepiece as spm
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    V = spm.SentencePieceProcessor(model_file=str(sp_model)).vocab_size()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L,
                         num_attention_heads=H, num_key_value_heads=G, max_position_embeddings=ctx,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied,
                         bos_token_id=1, eos_token_id=2, pad_token_id=None)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():                        # norms away from 1, so that they matter
            if p.ndim == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.2)
    folder = Path(folder)
    model.save_pretrained(str(folder))
    hf_tokenizer_json(sp_model, folder)
    shutil.copy(sp_model, folder / "tokenizer.model")
    return model


def hf_tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _permute_to_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: HF's split-halves rows back to Meta's interleaved pairs."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(folder: Path, sp_model: Path, out: Path, qtype: str = "F32", add_bos=True, pad_sentinel=True) -> Path:
    """The HF folder's weights and tokenizer as GGUF, written with ``gguf``'s own writer."""
    import gguf
    import sentencepiece as spm

    cfg = json.loads((Path(folder) / "config.json").read_text())
    t = hf_tensors(folder)
    L, H, G = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(G)
    w.add_rope_dimension_count(cfg["hidden_size"] // H)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    sp = spm.SentencePieceProcessor(model_file=str(sp_model))
    types = []
    for i in range(sp.vocab_size()):
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
                     else 5 if sp.is_unused(i) else 1)
    w.add_tokenizer_model("llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(sp.vocab_size())])
    w.add_token_scores([sp.get_score(i) for i in range(sp.vocab_size())])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if pad_sentinel:
        w.add_pad_token_id(4294967295)                     # "no padding token", as some GGUFs in the wild say
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(False)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
           "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(L):
        for theirs, ours in per.items():
            names[f"model.layers.{i}.{theirs}.weight"] = f"blk.{i}.{ours}.weight"
    for hf_name, g_name in names.items():
        if hf_name not in t:
            continue
        a = t[hf_name].astype(np.float32)
        if hf_name.endswith("q_proj.weight"):
            a = _permute_to_interleaved(a, H)
        elif hf_name.endswith("k_proj.weight"):
            a = _permute_to_interleaved(a, G)
        if a.ndim == 1 or qtype == "F32":
            w.add_tensor(g_name, np.ascontiguousarray(a))
        elif qtype == "F16":
            w.add_tensor(g_name, a.astype(np.float16))
        else:
            q = getattr(gguf.GGMLQuantizationType, qtype)
            data = gguf.quants.quantize(a, q)
            w.add_tensor(g_name, data, raw_shape=data.shape, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


def write_llama2c(folder: Path, sp_model: Path, out: Path, version: int = 0) -> tuple[Path, Path]:
    """The HF folder's weights as a llama2.c checkpoint (legacy ``version=0`` or ``version=1``),
    and ``tokenizer.bin`` beside it, laid out as llama2.c's ``export.py`` and ``tokenizer.py`` write them."""
    import sentencepiece as spm

    cfg = json.loads((Path(folder) / "config.json").read_text())
    t = {k: v.astype(np.float32) for k, v in hf_tensors(folder).items()}
    L, H, G = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    C, F, V, T = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["max_position_embeddings"]
    D = C // H
    layer = lambda i, name: t[f"model.layers.{i}.{name}.weight"]  # noqa: E731
    wq = [_permute_to_interleaved(layer(i, "self_attn.q_proj"), H) for i in range(L)]
    wk = [_permute_to_interleaved(layer(i, "self_attn.k_proj"), G) for i in range(L)]
    emb = t["model.embed_tokens.weight"]
    head = t.get("lm_head.weight", emb)
    shared = np.array_equal(head, emb)
    with open(out, "wb") as f:
        if version == 0:
            f.write(struct.pack("7i", C, F, L, H, G, V if shared else -V, T))
            parts = [emb, *[layer(i, "input_layernorm") for i in range(L)], *wq, *wk,
                     *[layer(i, "self_attn.v_proj") for i in range(L)],
                     *[layer(i, "self_attn.o_proj") for i in range(L)],
                     *[layer(i, "post_attention_layernorm") for i in range(L)],
                     *[layer(i, "mlp.gate_proj") for i in range(L)], *[layer(i, "mlp.down_proj") for i in range(L)],
                     *[layer(i, "mlp.up_proj") for i in range(L)], t["model.norm.weight"]]
            freqs = 1.0 / (10000.0 ** (np.arange(0, D, 2)[: D // 2] / D))
            angles = np.outer(np.arange(T), freqs)
            parts += [np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)]
        else:
            f.write(struct.pack("I", 0x616B3432) + struct.pack("i", version))
            f.write(struct.pack("7i", C, F, L, H, G, V, T) + struct.pack("B", int(shared)))
            f.write(b"\0" * (256 - f.tell()))
            parts = [*[layer(i, "input_layernorm") for i in range(L)],
                     *[layer(i, "post_attention_layernorm") for i in range(L)], t["model.norm.weight"], emb,
                     *wq, *wk, *[layer(i, "self_attn.v_proj") for i in range(L)],
                     *[layer(i, "self_attn.o_proj") for i in range(L)], *[layer(i, "mlp.gate_proj") for i in range(L)],
                     *[layer(i, "mlp.down_proj") for i in range(L)], *[layer(i, "mlp.up_proj") for i in range(L)]]
        if not shared:
            parts.append(head)
        for p in parts:
            f.write(np.ascontiguousarray(p, dtype="<f4").tobytes())
    # tokenizer.bin: max_token_length, then (score, length, bytes) per piece; ▁ written as a space.
    sp = spm.SentencePieceProcessor(model_file=str(sp_model))
    tokens, scores = [], []
    for i in range(sp.vocab_size()):
        piece = sp.id_to_piece(i)
        if i == sp.bos_id():
            piece = "\n<s>\n"
        elif i == sp.eos_id():
            piece = "\n</s>\n"
        tokens.append(piece.replace("\u2581", " ").encode("utf-8"))
        scores.append(sp.get_score(i))
    tok_path = Path(out).with_name("tokenizer.bin")
    with open(tok_path, "wb") as f:
        f.write(struct.pack("I", max(len(b) for b in tokens)))
        for b, s in zip(tokens, scores):
            f.write(struct.pack("fI", s, len(b)) + b)
    return Path(out), tok_path


def numpy_llama(folder: Path, sp_model: Path, L=5, C=64, H=8, G=4, F=172, ctx=512, seed=0) -> Path:
    """A random Llama as a Hugging Face folder (``config.json`` + ``model.safetensors``), made with NumPy
    alone (no torch): the defaults are the shape of llama2.c's stories260K (vocabulary from ``sp_model``).
    :func:`write_gguf` turns it into a GGUF file."""
    import sentencepiece as spm
    from safetensors.numpy import save_file

    V = spm.SentencePieceProcessor(model_file=str(sp_model)).vocab_size()
    rng = np.random.default_rng(seed)
    D = C // H
    shapes = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,), "lm_head.weight": (V, C)}
    for i in range(L):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                       p + "self_attn.q_proj.weight": (C, C), p + "self_attn.k_proj.weight": (G * D, C),
                       p + "self_attn.v_proj.weight": (G * D, C), p + "self_attn.o_proj.weight": (C, C),
                       p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C),
                       p + "mlp.down_proj.weight": (C, F)})
    tensors = {k: (1 + 0.1 * rng.standard_normal(s) if len(s) == 1 else 0.1 * rng.standard_normal(s)).astype(np.float32)
               for k, s in shapes.items()}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
        "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": G,
        "max_position_embeddings": ctx, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2}))
    return folder
