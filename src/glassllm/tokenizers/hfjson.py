"""Hugging Face ``tokenizer.json``: glassllm's byte-level BPE written in it and read back.

The ``tokenizers`` library keeps a tokenizer in one JSON document. For glassllm's byte-level
:class:`~glassllm.tokenizers.bpe.Tokenizer` it is a byte-level BPE model: every token spelled with
GPT-2's byte -> character map (:func:`bytes_to_unicode`), the merges in order, the special tokens
as added tokens, and a pre-tokenizer that splits the text as glassllm does. :func:`tokenizer_to_hf`
writes it; :func:`tokenizer_from_hf` reads any byte-level BPE ``tokenizer.json`` glassllm can
reproduce exactly (glassllm's own, GPT-2's, SmolLM2's) and refuses the rest in one line naming
the field. A SentencePiece tokenizer writes and reads its own
(:meth:`~glassllm.tokenizers.sentencepiece.SPTokenizer.to_hf_tokenizer_json`,
:meth:`~glassllm.tokenizers.sentencepiece.SPTokenizer.from_hf_tokenizer_json`);
:func:`is_sentencepiece` tells the two kinds of document apart.

This is a tokenizer file format, so it lives with the tokenizers rather than in
:mod:`glassllm.interop`: it needs nothing of a model, and the export and import of Hugging Face
folders (:mod:`glassllm.interop.hf`) use it as they use the other tokenizer formats.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import unicodedata

import numpy as np

from ..checks import is_int
from .bpe import Tokenizer
from .corpus import WHITE_SPACE
from .sentencepiece import SPTokenizer

__all__ = ["bytes_to_unicode", "tokenizer_to_hf", "tokenizer_from_hf", "byte_level_pattern", "is_sentencepiece",
           "unsupported"]


def unsupported(where: str, key: str, value, expected: str) -> ValueError:
    """The one-line error for a field glassllm cannot reproduce: ``where: key=value is not supported; expected ...``."""
    return ValueError(f"{where}: {key}={value!r} is not supported; expected {expected}")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character (used by HF byte-level BPE).

    Printable Latin-1 bytes map to themselves; the other 68 (controls, space,
    NBSP, soft hyphen) map to U+0100 onwards, in byte order.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def tokenizer_to_hf(tokenizer) -> dict:
    """``tokenizer`` as a Hugging Face ``tokenizers`` document (``tokenizer.json``).

    A SentencePiece tokenizer writes its own
    (:meth:`~glassllm.tokenizers.sentencepiece.SPTokenizer.to_hf_tokenizer_json`). For glassllm's byte-level
    tokenizer: a byte-level BPE model (tokens spelled with GPT-2's byte -> character
    map), our merges, the special tokens as added tokens, and a
    pre-tokenizer that splits with :attr:`~glassllm.tokenizers.bpe.Tokenizer.pattern`
    before mapping bytes. ``tokenizers.Tokenizer.from_str(json.dumps(...))`` then
    gives our ids with every special token allowed; :func:`tokenizer_from_hf` reads it back.

    >>> from glassllm.tokenizers import Tokenizer
    >>> doc = tokenizer_to_hf(Tokenizer.train(["aaabdaaabac"], vocab_size=258))
    >>> doc["model"]["merges"], doc["added_tokens"][0]["content"]
    (['a a'], '<|endoftext|>')
    """
    if isinstance(tokenizer, SPTokenizer):
        return tokenizer.to_hf_tokenizer_json()
    char = bytes_to_unicode()
    merges, specials = tokenizer.merges, tokenizer.special_tokens
    n_ordinary = 256 + len(merges)
    spell = ["".join(char[b] for b in tokenizer.decode_bytes([i])) for i in range(n_ordinary)]
    vocab = {spell[i]: i for i in range(n_ordinary)}
    vocab.update(specials)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": sid, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for name, sid in specials.items()
        ],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": tokenizer.pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{spell[a]} {spell[b]}" for a, b in merges],
        },
    }


@functools.lru_cache(maxsize=4)
def _code_point_class(categories: tuple[str, ...]) -> str:
    """The code points whose Unicode general category starts with one of ``categories``, as the
    inside of a regex class (ranges; ``\\uNNNN`` in the BMP, the characters themselves above it),
    read alike by Python's ``re`` and by Oniguruma."""
    ranges, start, prev = [], None, None
    for cp in range(sys.maxunicode + 1):
        if unicodedata.category(chr(cp)).startswith(categories):
            if start is None:
                start = cp
            prev = cp
        elif start is not None:
            ranges.append((start, prev))
            start = None
    if start is not None:
        ranges.append((start, prev))

    def one(cp: int) -> str:
        return f"\\u{cp:04x}" if cp <= 0xFFFF else chr(cp)
    return "".join(one(a) if a == b else f"{one(a)}-{one(b)}" for a, b in ranges)


def byte_level_pattern(digits: str | None = None) -> str:
    """The split of a ``ByteLevel(use_regex=true)`` pre-tokenizer (GPT-2's regex,
    ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``) as one Python regex.

    ``digits``: ``"individual"`` or ``"contiguous"`` when a ``Digits`` pre-tokenizer runs first
    (``individual_digits`` true or false). It cuts the text around numbers (each digit, or each run
    of them) before GPT-2's regex runs on each piece, so a number never takes a leading space and a
    run of spaces ends where a number starts: in one regex, numbers are their own alternative and a
    digit counts as the end of the text in the lookahead. ``\\p{L}``, ``\\p{N}`` are the letter and
    number categories of this Python's Unicode tables; ``\\s`` is Unicode White_Space (as in
    Oniguruma, which ``tokenizers`` uses).
    """
    space = WHITE_SPACE
    letters, numbers = _code_point_class(("L",)), _code_point_class(("N",))
    contractions = "'s|'t|'re|'ve|'m|'ll|'d"
    word = f" ?[{letters}]+"
    other = f" ?[^{space}{letters}{numbers}]+"
    if digits is None:
        return (f"{contractions}|{word}| ?[{numbers}]+|{other}"
                f"|[{space}]+(?![^{space}])|[{space}]+")
    number = f"[{numbers}]" if digits == "individual" else f"[{numbers}]+"
    return (f"{number}|{contractions}|{word}|{other}"
            f"|[{space}]+(?![^{space}{numbers}])|[{space}]+")


_PRE_TOKENIZER_LAYOUTS = ("a Sequence of Split (regex) then ByteLevel(use_regex=false), as glassllm exports; "
                          "ByteLevel(use_regex=true) alone (GPT-2); or Digits then ByteLevel(use_regex=true) "
                          "(SmolLM2)")


def _check_pre_tokenizer(pre, where: str) -> str:
    """The split regex of a byte-level pre-tokenizer we can reproduce; ValueError otherwise.

    Three layouts are read: ``Split`` (an ``Isolated`` regex) then ``ByteLevel(use_regex=false)``
    (glassllm's export); ``ByteLevel(use_regex=true)`` alone (GPT-2's file); ``Digits`` then
    ``ByteLevel(use_regex=true)`` (SmolLM2's). ``add_prefix_space`` must be false. Every other
    layout is refused naming the step: another step type (``Whitespace``, ``Metaspace``,
    ``Punctuation``...), more steps, a ``Split`` with another behaviour or an inverted one.
    """
    steps = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    if not isinstance(steps, list):
        raise unsupported(where, "pre_tokenizer.pretokenizers", type(steps).__name__, "a list")
    types = [s.get("type") if isinstance(s, dict) else None for s in steps]
    if types not in (["Split", "ByteLevel"], ["ByteLevel"], ["Digits", "ByteLevel"]):
        raise unsupported(where, "pre_tokenizer", types if len(types) > 1 else types[0], _PRE_TOKENIZER_LAYOUTS)
    byte_level = steps[-1]
    if byte_level.get("add_prefix_space", False):
        raise unsupported(where, "pre_tokenizer.ByteLevel.add_prefix_space", byte_level["add_prefix_space"], "false")
    regex = byte_level.get("use_regex", True)            # the tokenizers default
    if types[0] == "ByteLevel" or types[0] == "Digits":
        if regex is not True:
            raise unsupported(where, "pre_tokenizer.ByteLevel.use_regex", regex,
                       "true (without a Split before it, ByteLevel must split the text itself)")
        if types[0] == "ByteLevel":
            return byte_level_pattern()
        individual = steps[0].get("individual_digits", False)
        if not isinstance(individual, bool):
            raise unsupported(where, "pre_tokenizer.Digits.individual_digits", individual, "true or false")
        return byte_level_pattern("individual" if individual else "contiguous")
    split = steps[0]
    pattern = split.get("pattern", {}).get("Regex") if isinstance(split.get("pattern"), dict) else None
    if not isinstance(pattern, str):
        raise unsupported(where, "pre_tokenizer.Split.pattern", split.get("pattern"), "a {'Regex': ...} pattern")
    if split.get("behavior") != "Isolated" or split.get("invert", False):
        raise unsupported(where, "pre_tokenizer.Split.behavior", split.get("behavior"), "'Isolated' with invert=false")
    if regex:
        raise unsupported(where, "pre_tokenizer.ByteLevel.use_regex", regex, "false (after a Split)")
    try:
        re.compile(pattern)
    except re.error as e:
        raise unsupported(where, "pre_tokenizer.Split.pattern", pattern[:60], f"a regex Python's re reads ({e})") from None
    return pattern


def tokenizer_from_hf(doc: dict, where: str = "tokenizer.json"):
    """A glassllm :class:`~glassllm.tokenizers.bpe.Tokenizer` for a byte-level BPE ``tokenizer.json``.

    Returns ``(tokenizer, perm)`` where ``perm[our_id]`` is the Hugging Face id of
    the same token (``perm`` is ``arange(V)`` when the layouts already agree).
    Raises ValueError naming the first field glassllm cannot reproduce.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise ValueError(f"{where} is not a tokenizers document (no 'model' object)")
    model = doc["model"]
    if model.get("type") != "BPE":
        raise unsupported(where, "model.type", model.get("type"), "'BPE' (byte-level)")
    for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "unk_token"):
        if model.get(key) not in (None, ""):
            raise unsupported(where, f"model.{key}", model[key], "null")
    for key in ("byte_fallback", "ignore_merges"):
        if model.get(key, False):
            raise unsupported(where, f"model.{key}", model[key], "false")

    # Optional object fields, by their "type": none may change the text, and glassllm adds no tokens around it.
    for key, allowed, expected in (("normalizer", (), "null"),
                                   ("post_processor", ("ByteLevel", "TemplateProcessing"),
                                    "null, ByteLevel or a TemplateProcessing of the text alone (no tokens added)"),
                                   ("decoder", ("ByteLevel",), "'ByteLevel'")):
        value = doc.get(key)
        if value is not None and not isinstance(value, dict):
            raise unsupported(where, key, type(value).__name__, "an object or null")
        if value is not None and value.get("type") not in allowed:
            raise unsupported(where, key, value.get("type"), expected)
    post = doc.get("post_processor")
    if post is not None and post.get("type") == "TemplateProcessing":   # as transformers 5 saves one: the text alone
        single = post.get("single")
        if single != [{"Sequence": {"id": "A", "type_id": 0}}]:
            raise unsupported(where, "post_processor.single", single, "[$A] alone (no tokens added around the text)")
    pattern = _check_pre_tokenizer(doc.get("pre_tokenizer"), where)

    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise unsupported(where, "model.vocab", type(vocab).__name__, "an object token -> id")
    added = doc.get("added_tokens") or []
    if not isinstance(added, list) or not all(isinstance(t, dict) for t in added):
        raise unsupported(where, "added_tokens", type(added).__name__, "a list of objects")
    added = sorted(added, key=lambda t: t["id"] if is_int(t.get("id")) else -1)
    for t in added:
        if not isinstance(t.get("content"), str) or not is_int(t.get("id")):
            raise unsupported(where, "added_tokens", t, "objects with a str content and an int id")
        if not t.get("special", False):
            raise unsupported(where, f"added_tokens[{t.get('content')!r}].special", False,
                       "true (glassllm has special tokens only)")
        for key in ("lstrip", "rstrip", "single_word", "normalized"):
            if t.get(key, False):  # these change which text matches the token
                raise unsupported(where, f"added_tokens[{t.get('content')!r}].{key}", t[key], "false")

    # Byte-level spelling -> bytes.
    char_to_byte = {c: b for b, c in bytes_to_unicode().items()}
    special_names = {t["content"] for t in added}
    hf_id_of: dict[bytes, int] = {}
    for token, hf_id in vocab.items():
        if not is_int(hf_id):
            raise unsupported(where, f"model.vocab[{token!r}]", hf_id, "an int id")
        if token in special_names:
            continue
        try:
            data = bytes(char_to_byte[c] for c in token)
        except KeyError:
            raise unsupported(where, "model.vocab", token, "tokens spelled in the byte-level alphabet") from None
        hf_id_of[data] = hf_id
    missing = [b for b in range(256) if bytes([b]) not in hf_id_of]
    if missing:
        raise ValueError(f"{where}: no token for byte 0x{missing[0]:02x}; expected all 256 bytes in model.vocab")

    # Merges in order: merge k makes our id 256 + k.
    our_id = {bytes([b]): b for b in range(256)}
    merges = []
    for k, m in enumerate(model.get("merges") or []):
        parts = m.split(" ") if isinstance(m, str) else m
        if not (isinstance(parts, list) and len(parts) == 2 and all(isinstance(p, str) for p in parts)):
            raise unsupported(where, f"model.merges[{k}]", m, "two tokens")
        try:
            a, b = (bytes(char_to_byte[c] for c in p) for p in parts)
        except KeyError:
            raise unsupported(where, f"model.merges[{k}]", m, "tokens spelled in the byte-level alphabet") from None
        if a not in our_id or b not in our_id:
            raise unsupported(where, f"model.merges[{k}]", m, "merges of tokens made by earlier merges")
        if a + b in our_id:
            raise unsupported(where, f"model.merges[{k}]", m, "each token made by one merge only")
        if a + b not in hf_id_of:
            raise unsupported(where, f"model.merges[{k}]", m, "a merge whose result is in model.vocab")
        our_id[a + b] = 256 + k
        merges.append((our_id[a], our_id[b]))
    extra = sorted(set(hf_id_of) - set(our_id), key=lambda d: hf_id_of[d])
    if extra:
        raise unsupported(where, "model.vocab", extra[0].decode("utf-8", "replace"),
                   "every token to be a byte or made by a merge")

    n_ordinary = 256 + len(merges)
    specials = {t["content"]: n_ordinary + i for i, t in enumerate(added)}
    perm = np.empty(n_ordinary + len(added), dtype=np.int64)
    for data, i in our_id.items():
        perm[i] = hf_id_of[data]
    for i, t in enumerate(added):
        perm[n_ordinary + i] = t["id"]
    if sorted(perm.tolist()) != list(range(len(perm))):
        raise ValueError(f"{where}: token ids are not 0..{len(perm) - 1} without gaps or repeats")
    try:
        tokenizer = Tokenizer(merges, specials, pattern)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    return tokenizer, perm



def is_sentencepiece(doc) -> bool:
    """Does a ``tokenizer.json`` describe a SentencePiece BPE (byte fallback, Metaspace, a ▁ prefix)?"""
    if not isinstance(doc, dict):
        return False
    model, pre, norm = doc.get("model"), doc.get("pre_tokenizer"), doc.get("normalizer")
    return ((isinstance(model, dict) and bool(model.get("byte_fallback")))
            or (isinstance(pre, dict) and pre.get("type") == "Metaspace")
            or (isinstance(norm, dict) and "\u2581" in json.dumps(norm)))
