"""SentencePiece BPE: the tokenizer of Llama 2, llama2.c and most GGUF Llamas.

glassllm's own tokenizer (:mod:`glassllm.tokenizers.bpe`) starts from the 256 byte
values. A SentencePiece BPE starts from *characters* instead, and its
vocabulary is a list of pieces, each with a score and a type:

=========  ============================================================
type       pieces
=========  ============================================================
unknown    ``<unk>``: a run of characters the vocabulary cannot spell
           (only without byte fallback)
control    ``<s>`` (begin of text) and ``</s>`` (end of text): never
           produced from text, and decode to nothing
byte       ``<0x00>`` .. ``<0xFF>``: **byte fallback**, the UTF-8 bytes
           of a character that has no piece of its own
normal     characters (``e``, ``é``, ``日``, ``▁``) and the pieces merged
           from them (``▁t``, ``he``, ``▁the``)
unused     kept in the vocabulary, never produced
=========  ============================================================

Encoding ``"Hi there"``, step by step
-------------------------------------
1. **Spaces become** ``▁`` (U+2581), and one ``▁`` is put in front of the text
   (the *dummy prefix*), so that a word looks the same at the start of a text
   as after a space: ``"▁Hi▁there"``.
2. **Every character is a symbol**: ``▁ H i ▁ t h e r e``. A multi-byte
   character (``é``, ``日``) is one symbol, like any other.
3. **Merge by score.** Look at every pair of neighbouring symbols whose
   concatenation is a normal piece; merge the pair whose piece has the highest
   score (on a tie, the leftmost); repeat until no pair is a piece. With the
   scores of a tiny vocabulary::

       ▁ H i ▁ t h e r e          pieces: "he" -1, "▁t" -2, "▁the" -3, "re" -4, "Hi" -9
       ▁ H i ▁ t he r e           "he" has the best score
       ▁ H i ▁t he r e            then "▁t"
       ▁ H i ▁the r e             then "▁the" (from "▁t" + "he")
       ▁ H i ▁the re              then "re"
       ▁ Hi ▁the re               then "Hi"; "▁Hi" is not a piece: done

   A merge is not a rule "a + b" learned in order, as in the byte-level
   tokenizer: any two symbols whose concatenation is a piece may merge, so one
   piece can be reached by two merges (``▁t + he`` or ``▁th + e``).
   :attr:`SPTokenizer.merges` lists every such pair, best score first.
4. **Ids.** Each symbol that is a normal piece becomes its id. One that is not
   (an emoji the vocabulary never saw) becomes the ids of its UTF-8 bytes,
   ``<0xF0> <0x9F> <0x98> <0x80>`` (byte fallback), or ``<unk>`` without it:
   one ``<unk>`` for a whole run of such symbols (``"😀😀"`` is one ``<unk>``,
   ``"😀 😀"`` two, the ``▁`` between them being a piece), as ``sentencepiece``
   does; it decodes to `` ⁇ `` however many characters it stood for.

This is what the ``sentencepiece`` library does for a BPE model with the
"identity" normaliser (no Unicode normalisation), what Hugging Face
``tokenizers`` does with such a ``tokenizer.json``, and what llama2.c's
``run.c`` does; the tests check all three on the same text.

Text is cut into words before step 3 only where no piece could span the cut
(before a ``▁`` that follows another character, when no piece holds a
character followed by ``▁``), so the result is the same as merging the whole
text at once; each distinct word is merged once and remembered.

The model's rule for ``<s>``
----------------------------
A Llama reads ``<s>`` before its text (llama2.c trains every story as
``<s>`` + story). :meth:`SPTokenizer.encode` gives the ids of the text alone,
like ``sentencepiece``; :meth:`SPTokenizer.encode_prompt` puts ``<s>`` first
when the model's ``add_bos`` says so, which is what every glassllm tool feeds
the model.

Decoding
--------
Each id gives bytes: a normal piece its text with ``▁`` as a space, a byte
piece its byte, ``<s>`` and ``</s>`` nothing, ``<unk>`` `` ⁇ `` (as
``sentencepiece`` shows it). The dummy prefix is taken back once:
:meth:`SPTokenizer.decode` drops the leading space of the first piece that is
not a control piece, wherever the control pieces are, as ``sentencepiece``
does, so ``<s> ▁Once ▁upon <s> ▁a ▁time`` decodes to ``"Once upon a time"``.
So ``decode(encode(text)) == text`` for any text without ``▁`` itself
(``▁`` in the text decodes as a space, in ``sentencepiece`` too). Byte pieces
that do not make UTF-8 become U+FFFD, one for each broken character, as
Python decodes bytes; ``sentencepiece`` writes one for each byte, and ends a
run of byte pieces at a control piece.

:meth:`SPTokenizer.token_bytes` gives one id's bytes after the id before it,
for text that arrives a token at a time (generation, the bytes an evaluation
counts). It follows run.c: a piece at the start or right after ``<s>`` loses
its leading space, because ``<s>`` begins a new text. The two differ only
around control pieces other than one ``<s>`` at the start, which generation
never produces: it stops at ``</s>`` and at ``<s>``.

Which token ends generation
---------------------------
``</s>`` is the end of text in Hugging Face's config, but the TinyStories
models of llama2.c never saw it: their stories are separated by ``<s>``, and
``run.c`` stops when the model predicts ``<s>``. :attr:`SPTokenizer.end_ids`
is therefore both: generation stops at ``</s>`` or at ``<s>`` (a new text
beginning is the end of this one).

Special tokens in text
----------------------
``sentencepiece`` reads ``<s>`` in text as the characters ``< s >``. With
``allowed_special="all"`` (prompts), the names of the control and unknown
pieces become their ids instead; the text between them is encoded as above,
the dummy prefix going only at the very start of the text.

File format
-----------
Inside a model file, as the ``tokenizer`` metadata field (one piece a line)::

    {
      "format": "glassllm-tokenizer",
      "version": 1,
      "kind": "sentencepiece-bpe",
      "vocab_size": 512,
      "add_bos": true,
      "add_dummy_prefix": true,
      "byte_fallback": true,
      "pieces": [
        ["<unk>", 0.0, "unknown"],
        ["<s>", 0.0, "control"],
        ...
        ["▁t", -1.0, "normal"],
        ...
      ]
    }
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import numpy as np

from ..files import atomic_write, read_file
from .base import CONTROL_ESCAPES, TextTokenizer
from .corpus import EOT, stories
from .document import FORMAT, parse_tokenizer_json
from .protobuf import fields

__all__ = ["SPTokenizer", "SPACE", "TYPES", "KIND", "BYTE_PIECE", "load_sentencepiece_model"]

KIND = "sentencepiece-bpe"
SPACE = "\u2581"                     # ▁, how SentencePiece writes a space
UNKNOWN_TEXT = " \u2047 "            # how sentencepiece decodes <unk>
TYPES = ("normal", "unknown", "control", "user_defined", "unused", "byte")   # SentencePiece's ids 1..6
BYTE_PIECE = re.compile(r"<0x([0-9A-F]{2})>")  # a byte-fallback piece, <0x0A>: group 1 is the byte in hex
DOC_SEPARATOR = EOT                 # how glassllm's text files separate stories (see encode_corpus)


class SPTokenizer(TextTokenizer):
    """A SentencePiece BPE tokenizer: pieces with scores and types (see the module docstring).

    ``pieces``: list of ``(piece, score, type)``, the id being the position;
    ``type`` one of ``normal unknown control byte unused``. ``add_bos``: the
    model reads ``<s>`` before its text. ``add_dummy_prefix``: a ``▁`` goes in
    front of the text. ``byte_fallback``: unknown characters become ``<0xNN>``
    pieces (all 256 must then be present).
    """

    kind = KIND
    _CACHE_LIMIT = 1 << 18

    def __init__(self, pieces, add_bos: bool = True, add_dummy_prefix: bool = True, byte_fallback: bool = True):
        if isinstance(pieces, (str, bytes)) or not isinstance(pieces, Iterable):
            raise TypeError(f"pieces must be a list of (piece, score, type), got {type(pieces).__name__}")
        for name, flag in (("add_bos", add_bos), ("add_dummy_prefix", add_dummy_prefix),
                           ("byte_fallback", byte_fallback)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        self._pieces: list[str] = []
        self._scores: list[float] = []
        self._types: list[str] = []
        self._id: dict[str, int] = {}
        for i, entry in enumerate(pieces):
            if not (isinstance(entry, (tuple, list)) and len(entry) == 3):
                raise ValueError(f"piece {i} is {entry!r:.60}, expected (piece, score, type)")
            piece, score, kind = entry
            if not isinstance(piece, str) or not piece:
                raise ValueError(f"piece {i} is {piece!r:.60}, expected a non-empty str")
            if isinstance(score, bool) or not isinstance(score, (int, float)) or score != score:
                raise ValueError(f"piece {i} ({piece!r}) has score {score!r}, expected a number")
            if kind not in TYPES or kind == "user_defined":
                raise ValueError(f"piece {i} ({piece!r}) has type {kind!r}, expected one of "
                                 "normal, unknown, control, byte, unused")
            if kind == "byte" and not BYTE_PIECE.fullmatch(piece):
                raise ValueError(f"byte piece {i} is {piece!r}, expected <0xNN> with NN in 00..FF")
            if piece in self._id:
                raise ValueError(f"pieces {self._id[piece]} and {i} are both {piece!r}; expected distinct pieces")
            try:
                piece.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"piece {i} is {piece!r}, which is not valid Unicode") from None
            self._id[piece] = i
            self._pieces.append(piece)
            self._scores.append(float(score))
            self._types.append(kind)
        V = len(self._pieces)
        if not 1 <= V <= 1 << 16:
            raise ValueError(f"a vocabulary of {V} pieces is not supported, expected 1 to 65536")

        # The pieces merging may produce, with their scores (step 3).
        self._score = {p: s for p, s, t in zip(self._pieces, self._scores, self._types) if t == "normal"}
        # Byte fallback: byte value -> id.
        self._byte_id = {int(m.group(1), 16): i for i, (p, t) in enumerate(zip(self._pieces, self._types))
                         if t == "byte" and (m := BYTE_PIECE.fullmatch(p))}
        if byte_fallback and len(self._byte_id) != 256:
            missing = next(b for b in range(256) if b not in self._byte_id)
            raise ValueError(f"byte_fallback needs all 256 byte pieces; <0x{missing:02X}> is missing")
        unknown = [i for i, t in enumerate(self._types) if t == "unknown"]
        if len(unknown) > 1:
            raise ValueError(f"pieces {unknown[0]} and {unknown[1]} are both of type unknown; expected one")
        self._unk_id = unknown[0] if unknown else None
        if not byte_fallback and self._unk_id is None:
            raise ValueError("a tokenizer without byte fallback needs an <unk> piece (type unknown)")
        self._bos = self._id.get("<s>") if self._types[self._id.get("<s>", 0)] == "control" else None
        self._eos = self._id.get("</s>") if self._types[self._id.get("</s>", 0)] == "control" else None
        if add_bos and self._bos is None:
            raise ValueError("add_bos needs a control piece <s>")
        self._add_bos, self._add_prefix, self._byte_fallback = add_bos, add_dummy_prefix, byte_fallback
        self._special = {p: i for i, (p, t) in enumerate(zip(self._pieces, self._types))
                         if t in ("control", "unknown")}
        names = sorted(self._special, key=lambda s: (-len(s), s))
        self._special_re = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None
        # Words may be merged one at a time if no piece holds a character followed by ▁.
        self._words = None if any(re.search(f"[^{SPACE}]{SPACE}", p) for p in self._score) else \
            re.compile(f"{SPACE}+[^{SPACE}]*|[^{SPACE}]+").findall
        self._cache: dict[str, tuple[int, ...]] = {}

    # -- encoding ----------------------------------------------------------------

    def _merge(self, symbols: list[str]) -> list[str]:
        """Step 3: merge the best-scoring neighbouring pair (leftmost on a tie) until none is a piece."""
        score = self._score
        while len(symbols) > 1:
            best, at = None, -1
            for k in range(len(symbols) - 1):
                s = score.get(symbols[k] + symbols[k + 1])
                if s is not None and (best is None or s > best):
                    best, at = s, k
            if best is None:
                break
            symbols[at:at + 2] = [symbols[at] + symbols[at + 1]]
        return symbols

    def _ids(self, symbols: list[str]) -> list[int]:
        """Step 4: pieces to ids; a symbol that is no normal piece falls back to bytes or <unk>."""
        out = []
        for s in symbols:
            if s in self._score:
                out.append(self._id[s])
            elif self._byte_fallback:
                out.extend(self._byte_id[b] for b in s.encode("utf-8"))
            else:
                out.append(self._unk_id)
        return out

    def _encode_word(self, word: str) -> tuple[int, ...]:
        ids = self._cache.get(word)
        if ids is None:
            if len(self._cache) > self._CACHE_LIMIT:
                self._cache.clear()
            ids = self._cache[word] = tuple(self._ids(self._merge(list(word))))
        return ids

    def _encode_ordinary(self, text: str, at_start: bool, out: list[int]) -> None:
        """Steps 1-4 for text without special tokens; the dummy prefix only ``at_start``."""
        if not text:
            return
        text = text.replace(" ", SPACE)                                    # step 1
        if at_start and self._add_prefix:
            text = SPACE + text
        if self._words is None:                                            # a piece spans words: all at once
            ids = self._ids(self._merge(list(text)))
        else:
            ids = [i for word in self._words(text) for i in self._encode_word(word)]
        unk = self._unk_id
        if not self._byte_fallback and ids.count(unk) > 1:                 # a run of unknowns is one <unk>
            ids = [i for k, i in enumerate(ids) if i != unk or k == 0 or ids[k - 1] != unk]
        out.extend(ids)

    def encode(self, text: str, allowed_special="none") -> list[int]:
        """The ids of ``text`` (no ``<s>``: see :meth:`encode_prompt`).

        ``allowed_special``: ``"none"`` (``<s>`` in the text is ordinary text, as in
        ``sentencepiece``), ``"all"``, or a set of names of control/unknown pieces.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"text has a lone surrogate {text[e.start]!r} at index {e.start}, "
                             "which is not valid Unicode") from None
        allowed = self.allowed(allowed_special)
        out: list[int] = []
        if not allowed:
            self._encode_ordinary(text, True, out)
            return out
        pattern = re.compile("(" + "|".join(map(re.escape, sorted(allowed, key=lambda s: (-len(s), s)))) + ")")
        for k, part in enumerate(pattern.split(text)):
            if k % 2:
                out.append(allowed[part])
            else:
                self._encode_ordinary(part, k == 0, out)
        return out

    def encode_prompt(self, text: str) -> list[int]:
        """What the model reads for ``text``: ``<s>`` first if the model says so, special tokens allowed.

        A text that already starts with ``<s>`` does not get a second one.
        """
        ids = self.encode(text, allowed_special="all")
        if self._add_bos and (not ids or ids[0] != self._bos):
            ids.insert(0, self._bos)
        return ids

    def encode_corpus(self, text_or_paths) -> np.ndarray:
        """A corpus as a uint16 array, one document after another, each read as the model reads a text.

        ``text_or_paths``: a str of text, a path, or a list of them. Every file
        and str is a document; inside one, a line ``<|endoftext|>`` (glassllm's
        story separator) also ends a document. Each document is stripped of
        surrounding whitespace and encoded with :meth:`encode_prompt`'s rule
        (``<s>`` first), as llama2.c prepared its training stories.
        """
        out: list[int] = []
        for doc in stories(text_or_paths):
            doc = doc.strip()
            if doc:
                if self._add_bos:
                    out.append(self._bos)
                self._encode_ordinary(doc, True, out)
        return np.array(out, dtype=np.uint16)

    # -- decoding ------------------------------------------------------------------

    def _piece_bytes(self, i: int, starts_text: bool) -> bytes:
        """The bytes of id ``i``; a piece that ``starts_text`` loses the dummy prefix's space."""
        kind = self._types[i]
        if kind == "byte":
            return bytes([int(self._pieces[i][3:5], 16)])
        if kind == "control":
            return b""
        if kind == "unknown":
            return UNKNOWN_TEXT.encode("utf-8")
        text = self._pieces[i].replace(SPACE, " ")
        if self._add_prefix and starts_text and text.startswith(" "):
            text = text[1:]
        return text.encode("utf-8")

    def token_bytes(self, token_id: int, after: int | None = None) -> bytes:
        """The bytes ``token_id`` adds to the text after the id ``after`` (None: at the start).

        The dummy prefix is taken back: a piece at the start or right after
        ``<s>`` loses one leading space (run.c's rule for a stream of tokens).
        """
        (i,) = self.check_ids([token_id])
        return self._piece_bytes(i, after is None or after == self._bos)

    def decode_bytes(self, ids) -> bytes:
        """The bytes of ``ids``, as ``sentencepiece`` decodes them: control pieces give nothing wherever
        they are, and the first piece that is not one loses the dummy prefix's space."""
        ids = self.check_ids(ids)
        first = next((k for k, i in enumerate(ids) if self._types[i] != "control"), None)
        return b"".join(self._piece_bytes(i, k == first) for k, i in enumerate(ids))

    def piece(self, token_id: int) -> str:
        """The piece of one id as the vocabulary spells it (``▁the``, ``<0x0A>``, ``<s>``), control
        characters shown as escapes (``\\n``) so that they neither move the cursor nor vanish."""
        (i,) = self.check_ids([token_id])
        return self._pieces[i].translate(CONTROL_ESCAPES)

    def pieces(self, ids) -> list[str]:
        return [self._pieces[i].translate(CONTROL_ESCAPES) for i in self.check_ids(ids)]

    # -- properties ------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def special_tokens(self) -> dict[str, int]:
        """The control and unknown pieces: name -> id (a copy)."""
        return dict(self._special)

    @property
    def bos_id(self) -> int | None:
        """The id the model reads first (``<s>``), or None if the model reads none."""
        return self._bos if self._add_bos else None

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Generation ends at ``</s>`` or ``<s>`` (see the module docstring)."""
        return tuple(i for i in (self._eos, self._bos) if i is not None)

    @property
    def eot_id(self) -> int:
        """The id of ``</s>``."""
        if self._eos is None:
            raise ValueError("this tokenizer has no </s> control piece")
        return self._eos

    @property
    def add_bos(self) -> bool:
        return self._add_bos

    @property
    def add_dummy_prefix(self) -> bool:
        return self._add_prefix

    @property
    def byte_fallback(self) -> bool:
        return self._byte_fallback

    def score(self, token_id: int) -> float:
        (i,) = self.check_ids([token_id])
        return self._scores[i]

    def piece_type(self, token_id: int) -> str:
        (i,) = self.check_ids([token_id])
        return self._types[i]

    def piece_id(self, piece: str) -> int | None:
        """The id of ``piece``, or None."""
        return self._id.get(piece)

    @property
    def merges(self) -> list[tuple[str, str, str]]:
        """Every merge ``(left, right, piece)``: two pieces whose concatenation is a normal piece,
        best score first (then by the ids of left and right)."""
        out = []
        for piece, s in sorted(self._score.items(), key=lambda kv: (-kv[1], self._id[kv[0]])):
            pairs = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                     if piece[:k] in self._id and piece[k:] in self._id]
            out += [(a, b, piece) for a, b in sorted(pairs, key=lambda ab: (self._id[ab[0]], self._id[ab[1]]))]
        return out

    def __repr__(self) -> str:
        n = sum(t == "normal" for t in self._types)
        return (f"SPTokenizer(vocab_size={self.vocab_size}, normal={n}, bytes={len(self._byte_id)}, "
                f"add_bos={self._add_bos})")

    # -- files -------------------------------------------------------------------------

    def to_json(self) -> str:
        """The document stored in a model file (see the module docstring)."""
        head = {"format": FORMAT, "version": 1, "kind": KIND, "vocab_size": self.vocab_size,
                "add_bos": self._add_bos, "add_dummy_prefix": self._add_prefix, "byte_fallback": self._byte_fallback}
        lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
        rows = [json.dumps([p, s, t], ensure_ascii=False) for p, s, t in zip(self._pieces, self._scores, self._types)]
        lines.append('  "pieces": [\n    ' + ",\n    ".join(rows) + "\n  ]")
        return "\n".join(lines) + "\n}\n"

    @classmethod
    def from_json(cls, text) -> "SPTokenizer":
        """Rebuild a tokenizer from :meth:`to_json`'s output; ``ValueError`` if it is not one."""
        doc = parse_tokenizer_json(text)
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            raise ValueError(f"not a SentencePiece tokenizer document (kind is "
                             f"{doc.get('kind') if isinstance(doc, dict) else None!r}, expected {KIND!r})")
        if doc.get("version") != 1:
            raise ValueError(f"tokenizer format version {doc.get('version')!r} is not supported, expected 1")
        for key in ("add_bos", "add_dummy_prefix", "byte_fallback"):
            if not isinstance(doc.get(key), bool):
                raise ValueError(f"tokenizer field {key!r} is {doc.get(key)!r:.40}, expected true or false")
        if not isinstance(doc.get("pieces"), list):
            raise ValueError("tokenizer field 'pieces' is missing, expected a list of [piece, score, type]")
        tok = cls(doc["pieces"], doc["add_bos"], doc["add_dummy_prefix"], doc["byte_fallback"])
        if tok.vocab_size != doc.get("vocab_size"):
            raise ValueError(f"vocab_size is {doc.get('vocab_size')!r}, but there are {tok.vocab_size} pieces")
        return tok

    def save(self, path) -> None:
        atomic_write(path, self.to_json())

    # -- other formats -------------------------------------------------------------------

    def to_hf_tokenizer_json(self) -> dict:
        """This tokenizer as a Hugging Face ``tokenizers`` document, as ``transformers`` writes a Llama's.

        A BPE model with byte fallback, a ``Metaspace`` pre-tokenizer (the dummy
        prefix on the first part only), every merge of :attr:`merges`, and a
        post-processor that puts ``<s>`` first when :attr:`add_bos`.
        """
        bos = [{"SpecialToken": {"id": "<s>", "type_id": 0}}] if self._add_bos else []
        added = [{"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True} for p, i in self._special.items()]
        return {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": SPACE,
                              "prepend_scheme": "first" if self._add_prefix else "never", "split": False},
            "post_processor": {"type": "TemplateProcessing",
                               "single": bos + [{"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": bos + [{"Sequence": {"id": "A", "type_id": 0}},
                                              {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {"<s>": {"id": "<s>", "ids": [self._bos], "tokens": ["<s>"]}}
                               if self._add_bos else {}},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                *([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if self._add_prefix else [])]},
            "model": {"type": "BPE", "dropout": None,
                      "unk_token": self._pieces[self._unk_id] if self._unk_id is not None else None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                      "byte_fallback": self._byte_fallback, "ignore_merges": False,
                      "vocab": {p: i for i, p in enumerate(self._pieces)},
                      "merges": [[a, b] for a, b, _ in self.merges]},
        }

    @classmethod
    def from_hf_tokenizer_json(cls, doc: dict, where: str = "tokenizer.json") -> "SPTokenizer":
        """Read a Hugging Face ``tokenizer.json`` of a SentencePiece BPE (as ``transformers`` converts one).

        Ids stay as they are. Merge priority comes from the order of ``model.merges``:
        a piece's score is minus the rank of its first merge. That is SentencePiece's
        rule only if the merges are every pair of pieces whose concatenation is a piece,
        each piece's merges side by side, which is checked; anything else is refused
        in one line naming the field.
        """
        def bad(key, value, expected):
            return ValueError(f"{where}: {key}={value!r:.80} is not supported; expected {expected}")

        model = doc.get("model") if isinstance(doc, dict) else None
        if not isinstance(model, dict) or model.get("type") != "BPE":
            raise bad("model.type", model.get("type") if isinstance(model, dict) else None, "'BPE'")
        for key in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key) not in (None, ""):
                raise bad(f"model.{key}", model[key], "null")
        if model.get("ignore_merges", False):
            raise bad("model.ignore_merges", True, "false")
        byte_fallback = bool(model.get("byte_fallback", False))
        # The dummy prefix: a Metaspace pre-tokenizer, or the older Prepend + Replace normaliser.
        pre, norm = doc.get("pre_tokenizer"), doc.get("normalizer")
        if isinstance(pre, dict) and pre.get("type") == "Metaspace" and norm is None:
            if pre.get("replacement", SPACE) != SPACE or pre.get("split", False):
                raise bad("pre_tokenizer.Metaspace", pre, f"replacement {SPACE!r} and split=false")
            scheme = pre.get("prepend_scheme", "always" if pre.get("add_prefix_space", True) else "never")
            if scheme not in ("first", "always", "never"):
                raise bad("pre_tokenizer.prepend_scheme", scheme, "'first', 'always' or 'never'")
            prefix = scheme != "never"
        elif pre is None and isinstance(norm, dict) and norm.get("type") == "Sequence":
            steps = [(n.get("type"), n.get("prepend"), n.get("content"), (n.get("pattern") or {}).get("String"))
                     for n in norm.get("normalizers", []) if isinstance(n, dict)]
            if steps not in ([("Prepend", SPACE, None, None), ("Replace", None, SPACE, " ")],
                             [("Replace", None, SPACE, " ")]):
                raise bad("normalizer", [s[0] for s in steps], f"Prepend {SPACE!r} then Replace ' ' -> {SPACE!r}")
            prefix = steps[0][0] == "Prepend"
        else:
            raise bad("pre_tokenizer", (pre or {}).get("type") if isinstance(pre, dict) else pre,
                      "a Metaspace pre-tokenizer, or a Prepend/Replace normalizer (SentencePiece)")
        # <s> before the text: the post-processor's template.
        post = doc.get("post_processor")
        add_bos = False
        if post is not None:
            single = post.get("single") if isinstance(post, dict) and post.get("type") == "TemplateProcessing" else None
            if not isinstance(single, list):
                raise bad("post_processor", (post or {}).get("type"), "null or a TemplateProcessing")
            names = [next(iter(x.values())).get("id") if "SpecialToken" in x else "$A" for x in single]
            if names not in (["$A"], ["<s>", "$A"]):
                raise bad("post_processor.single", names, "['<s>', '$A'] or ['$A'] (nothing after the text)")
            add_bos = names[0] == "<s>"

        vocab = model.get("vocab")
        if not isinstance(vocab, dict) or not vocab:
            raise bad("model.vocab", type(vocab).__name__, "an object piece -> id")
        V = len(vocab)
        if sorted(vocab.values()) != list(range(V)):
            raise ValueError(f"{where}: model.vocab ids are not 0..{V - 1} without gaps or repeats")
        piece_of = {i: p for p, i in vocab.items()}
        specials = {}
        for t in doc.get("added_tokens") or []:
            if not isinstance(t, dict) or t.get("id") not in piece_of or piece_of[t["id"]] != t.get("content"):
                raise bad("added_tokens", t, "tokens that are pieces of model.vocab, at their ids")
            if t["content"] not in ("<unk>", "<s>", "</s>") or not t.get("special", False):
                raise bad("added_tokens", t.get("content"), "only <unk>, <s> and </s>, as special tokens")
            specials[t["content"]] = "unknown" if t["content"] == "<unk>" else "control"
        unk = model.get("unk_token")
        if unk not in (None, "<unk>"):
            raise bad("model.unk_token", unk, "'<unk>' or null")
        # Scores from merge ranks, checking that the merges are SentencePiece's.
        first_rank: dict[str, int] = {}
        listed = set()
        last = None
        for k, m in enumerate(model.get("merges") or []):
            parts = m.split(" ") if isinstance(m, str) else m
            if not (isinstance(parts, list) and len(parts) == 2 and all(isinstance(p, str) for p in parts)):
                raise bad(f"model.merges[{k}]", m, "two pieces")
            a, b = parts
            if a not in vocab or b not in vocab or a + b not in vocab:
                raise bad(f"model.merges[{k}]", m, "two pieces of model.vocab whose concatenation is one")
            if a + b != last and a + b in first_rank:
                raise bad(f"model.merges[{k}]", m, "the merges of one piece side by side (SentencePiece's order)")
            first_rank.setdefault(a + b, k)
            listed.add((a, b))
            last = a + b
        pieces = []
        for i in range(V):
            p = piece_of[i]
            kind = specials.get(p) or ("byte" if byte_fallback and BYTE_PIECE.fullmatch(p) else "normal")
            pieces.append((p, -float(first_rank.get(p, V + i)) if kind == "normal" else 0.0, kind))
        normal = {p for p, _, t in pieces if t == "normal"}
        for p in normal:
            for k in range(1, len(p)):
                if p[:k] in vocab and p[k:] in vocab and (p[:k], p[k:]) not in listed:
                    raise bad("model.merges", f"{p[:k]} {p[k:]}", f"every pair that makes a piece to be a merge "
                              f"(SentencePiece merges any two pieces that make {p!r})")
        try:
            return cls(pieces, add_bos=add_bos, add_dummy_prefix=prefix, byte_fallback=byte_fallback)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None

    @classmethod
    def from_sentencepiece_model(cls, data: bytes, where: str = "tokenizer.model",
                                 add_bos: bool = True) -> "SPTokenizer":
        """Read a SentencePiece ``.model`` file (a protobuf ``ModelProto``) without the library.

        Only BPE models with the identity normaliser and no extra-whitespace
        removal can be encoded exactly; anything else is refused in one line.
        """
        try:
            top = fields(data)
            pieces = []
            for raw in top.get(1, []):
                f = fields(raw)
                piece = f.get(1, [b""])[0].decode("utf-8")
                score = float(np.frombuffer(f.get(2, [b"\0\0\0\0"])[0], "<f4")[0]) if 2 in f else 0.0
                kind = f.get(3, [1])[0]
                if not 1 <= kind <= 6:
                    raise ValueError(f"piece {piece!r} has type {kind}")
                pieces.append((piece, score, TYPES[kind - 1]))
            trainer = fields(top[2][0]) if 2 in top else {}
            norm = fields(top[3][0]) if 3 in top else {}
        except (ValueError, IndexError, KeyError, UnicodeDecodeError) as e:
            raise ValueError(f"{where} is not a SentencePiece model ({e})") from None
        model_type = trainer.get(3, [1])[0]
        if model_type != 2:
            kinds = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
            raise ValueError(f"{where}: model_type={kinds.get(model_type, model_type)!r} is not supported; "
                             "expected 'bpe'")
        name = norm.get(1, [b"identity"])[0].decode("utf-8", "replace")
        if name != "identity" or norm.get(2, [b""])[0]:
            raise ValueError(f"{where}: normalizer {name!r} is not supported; expected 'identity' "
                             "(no Unicode normalisation)")
        if norm.get(4, [1])[0]:
            raise ValueError(f"{where}: remove_extra_whitespaces=true is not supported; expected false")
        if not norm.get(5, [1])[0]:
            raise ValueError(f"{where}: escape_whitespaces=false is not supported; expected true")
        user = [p for p, _, t in pieces if t == "user_defined"]
        if user:
            raise ValueError(f"{where}: user-defined piece {user[0]!r} is not supported; expected none")
        fallback = bool(trainer.get(35, [0])[0])
        return cls(pieces, add_bos=add_bos, add_dummy_prefix=bool(norm.get(3, [1])[0]), byte_fallback=fallback)


def load_sentencepiece_model(path, add_bos: bool = True) -> SPTokenizer:
    """:meth:`SPTokenizer.from_sentencepiece_model` of a file."""
    return SPTokenizer.from_sentencepiece_model(read_file(path), str(path), add_bos)
