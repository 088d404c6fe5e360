"""Byte-level BPE: how glassllm turns text into the ids the model predicts.

The vocabulary (1,024 ids by default) has three parts, in this order:

- ids 0..255 are the 256 byte values, so every string (and every byte string)
  can be encoded: nothing is ever "unknown";
- ids 256.. are learned merges: merge ``i`` joins two existing tokens ``(a, b)``
  into the new token ``256 + i`` whose bytes are ``bytes(a) + bytes(b)``;
- the special tokens take the last ids. ``<|endoftext|>`` separates stories,
  and is id 1023 in the default vocabulary.

Example (the classic "aaabdaaabac" of the BPE literature, worked by hand in
``tests/test_tokenizer.py``):

>>> tok = Tokenizer.train(["aaabdaaabac"], vocab_size=261)
>>> tok.merges
[(97, 97), (97, 98), (256, 257), (97, 99)]
>>> ids = tok.encode("aaabdaaabac<|endoftext|>", allowed_special="all")
>>> ids, tok.pieces(ids)
([258, 100, 258, 259, 260], ['aaab', 'd', 'aaab', 'ac', '<|endoftext|>'])
>>> tok.decode(ids)
'aaabdaaabac<|endoftext|>'

Pre-tokenisation
----------------
Before BPE sees the text, :data:`PATTERN` cuts it into chunks, and merges never
cross a chunk boundary. In the style of GPT-2, a chunk is one of (first
alternative that matches wins):

1. a contraction: ``'s 't 'm 'd 'll 've 're`` (also with the curly ``’``);
2. a word: one optional leading space, then a run of *letters*;
3. a number: one optional leading space, then ASCII digits;
4. punctuation: one optional leading space, then a run of *punctuation*;
5. a run of whitespace that leaves its last character to the next chunk, so
   ``"a  b"`` splits as ``"a", " ", " b"``;
6. any remaining whitespace (at the end of the text, or before a digit etc.).

The character classes are spelled out as code-point ranges, so the pattern
means exactly the same thing in Python's ``re`` (the only engine the runtime
needs) and in the Oniguruma engine of Hugging Face ``tokenizers`` (the
export), whatever Unicode version either of them knows:

- *whitespace* is the Unicode ``White_Space`` set (25 characters);
- *punctuation* is ASCII control characters and punctuation, the C1 controls,
  the Latin-1 signs ``¡ … ¿ × ÷`` (but not the letters ``ª µ º``) and the
  General Punctuation block U+2010..U+205E (dashes, curly quotes, ``…``);
- *digits* are ``0-9``;
- *letters* are everything else: all scripts, combining marks (so a decomposed
  ``é`` stays in its word), CJK, emoji and other symbols.

Training
--------
:meth:`Tokenizer.train` streams the text once and counts how often each
distinct chunk occurs (memory grows with the number of *distinct* chunks, not
with the size of the text). Then it repeats: pick the most frequent adjacent
pair of tokens, weighted by chunk counts; add it as the next merge; rewrite
only the chunks that contain it, updating the pair counts by the difference.
An index pair -> chunks finds those chunks, and a heap finds the best pair.

Ties are broken deterministically, with no dependence on hashing or on the
machine: among pairs of equal count, the pair ``(a, b)`` with the smallest
``a`` wins, then the smallest ``b``. A pair whose joined bytes already are a
token (``"a"+"bc"`` after ``"ab"+"c"``) is skipped, so every id has its own
distinct bytes.

Encoding a chunk applies the merges in the order they were learned; the result
of each distinct chunk is cached, which makes encoding fast on real text.

File format (version 1)
-----------------------
A UTF-8 JSON object, one merge per line so that it reads (and diffs) well::

    {
      "format": "glassllm-tokenizer",
      "version": 1,
      "kind": "byte-bpe",
      "vocab_size": 1024,
      "pattern": "['\\\\u2019](?:[sdmt]|ll|ve|re)| ?...",
      "special_tokens": {"<|endoftext|>": 1023},
      "merges": [
        [32, 116, " t"],
        [104, 101, "he"],
        ...
      ]
    }

``merges[i] = [a, b, piece]`` creates id ``256 + i`` from ids ``a`` and ``b``
(both smaller than ``256 + i``); ``piece`` is the readable text of the new
token, for people only, and is ignored when loading. ``vocab_size`` must equal
``256 + len(merges) + len(special_tokens)`` and the special tokens must hold
the last ids. Any other ``format``, a newer ``version``, or a file that breaks
these rules is refused with a one-line ``ValueError``. ``kind`` tells this
document from a SentencePiece one (:mod:`glassllm.tokenizers.sentencepiece`); a document
without it is byte-level.
"""

from __future__ import annotations

import heapq
import json
import re
from array import array
from collections import Counter, defaultdict
from itertools import chain, repeat

import numpy as np

from ..checks import is_int
from ..files import atomic_write
from .base import CONTROL_ESCAPES, TextTokenizer
from .corpus import EOT, WHITE_SPACE, documents
from .document import FORMAT, VERSION, parse_tokenizer_json, read_tokenizer_file

__all__ = ["Tokenizer", "PATTERN", "FORMAT", "VERSION", "EOT", "merge_pair", "WHITE_SPACE"]

# ----------------------------------------------------------------------------
# The pre-tokenisation pattern
# ----------------------------------------------------------------------------
# Escapes are \xNN for ASCII and \uNNNN above it: both engines read them the
# same way (Oniguruma reads \x80..\xff as raw bytes, so those are avoided).

# Unicode White_Space (:data:`glassllm.tokenizers.corpus.WHITE_SPACE`, where a corpus may be cut).
_SPACE = WHITE_SPACE
_PUNCT = (
    r"\x00-\x08\x0e-\x1f!-/:-@\[-`{-~\x7f"  # ASCII controls and punctuation
    r"\u0080-\u0084\u0086-\u009f"  # C1 controls (U+0085 is whitespace)
    r"\u00a1-\u00a9\u00ab-\u00b4\u00b6-\u00b9\u00bb-\u00bf\u00d7\u00f7"  # Latin-1 signs
    r"\u2010-\u2027\u2030-\u205e"  # General Punctuation: dashes, quotes, bullets, ...
)
PATTERN = (
    r"['\u2019](?:[sdmt]|ll|ve|re)"  # 1. contractions
    r"| ?[^" + _SPACE + _PUNCT + r"0-9]+"  # 2. a word
    r"| ?[0-9]+"  # 3. a number
    r"| ?[" + _PUNCT + r"]+"  # 4. punctuation
    r"|[" + _SPACE + r"]+(?![^" + _SPACE + r"])"  # 5. spaces, minus the last before a word
    r"|[" + _SPACE + r"]+"  # 6. other spaces
)

# ----------------------------------------------------------------------------
# The one merge primitive, shared by training and encoding
# ----------------------------------------------------------------------------


def merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``ids`` by ``new_id``, left to right.

    Occurrences do not overlap: ``merge_pair([7, 7, 7], (7, 7), 9) == [9, 7]``.
    """
    a, b = pair
    out = []
    i, n = 0, len(ids)
    while i < n:
        if ids[i] == a and i + 1 < n and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _learn_merges(chunk_counts: dict[str, int], n_merges: int, taken: set[bytes]) -> list[tuple[int, int]]:
    """The training loop: ``n_merges`` merges learned from ``{chunk: count}``.

    ``taken`` holds the bytes of tokens that merges must not recreate (the
    special tokens); see the module docstring for the rules.
    """
    # Each distinct chunk becomes a "word": its list of byte ids, and its count.
    words, freqs = [], []
    for chunk, n in chunk_counts.items():
        data = chunk.encode("utf-8", "surrogateescape")
        if len(data) >= 2:
            words.append(list(data))
            freqs.append(n)

    # Pair counts over the whole text, and which words hold each pair.
    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for w, ids in enumerate(words):
        for pair in zip(ids, ids[1:]):
            pair_counts[pair] += freqs[w]
            where[pair].add(w)

    # A max-heap by count through negated counts; equal counts fall back to the
    # smallest (a, b). Entries go stale when a count changes: a fresh entry is
    # pushed, and a popped entry is used only if it still equals the live count.
    heap = [(-n, a, b) for (a, b), n in pair_counts.items()]
    heapq.heapify(heap)

    token_bytes = [bytes([i]) for i in range(256)]
    known = set(token_bytes) | taken
    skipped: set[tuple[int, int]] = set()
    merges: list[tuple[int, int]] = []
    while len(merges) < n_merges:
        # 1. The most frequent pair whose bytes are not a token yet.
        while heap:
            neg, a, b = heapq.heappop(heap)
            if pair_counts.get((a, b)) != -neg or (a, b) in skipped:
                continue  # stale entry
            if token_bytes[a] + token_bytes[b] in known:
                skipped.add((a, b))
                continue
            break
        else:
            raise ValueError(
                f"the training text allows only {len(merges)} merges, but {n_merges} are needed "
                f"for this vocab_size; give more text or a smaller vocab_size"
            )
        pair, new_id = (a, b), 256 + len(merges)
        merges.append(pair)
        token_bytes.append(token_bytes[a] + token_bytes[b])
        known.add(token_bytes[-1])

        # 2. Rewrite only the words that hold the pair; collect how each pair's
        #    count changes: minus the old word's pairs, plus the new word's.
        delta: dict[tuple[int, int], int] = defaultdict(int)
        for w in where.pop(pair):
            old = words[w]
            new = merge_pair(old, pair, new_id)
            if len(new) == len(old):
                continue  # the pair left this word in an earlier merge
            f = freqs[w]
            for p in zip(old, old[1:]):
                delta[p] -= f
            for p in zip(new, new[1:]):
                delta[p] += f
                if new_id in p:  # pairs without the new id were indexed already
                    where[p].add(w)
            words[w] = new

        # 3. Apply the changes and push the fresh counts.
        for p, d in delta.items():
            if d == 0:
                continue
            n = pair_counts[p] + d
            if n > 0:
                pair_counts[p] = n
                if p not in skipped:
                    heapq.heappush(heap, (-n, p[0], p[1]))
            else:
                del pair_counts[p]
        assert pair not in pair_counts, "a merge must consume every occurrence of its pair"
    return merges


def _check_text(text: str) -> None:
    """Refuse strs that are not Unicode text (lone surrogates have no UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        if 0xDC80 <= code <= 0xDCFF:  # how Python carries a byte that was not UTF-8 (surrogateescape)
            raise ValueError(f"text is not valid UTF-8: byte 0x{code - 0xDC00:02x} at character {e.start} "
                             "(Tokenizer.encode_bytes takes raw bytes)") from None
        raise ValueError(f"text has a lone surrogate {text[e.start]!r} at index {e.start}, "
                         "which is not valid Unicode; use encode_bytes for raw bytes") from None


# ----------------------------------------------------------------------------
# Readable pieces
# ----------------------------------------------------------------------------


def _readable(data: bytes) -> str:
    """Display text for some bytes: UTF-8 where it is, ``\\xNN`` for the rest."""
    return data.decode("utf-8", "backslashreplace").translate(CONTROL_ESCAPES)


# ----------------------------------------------------------------------------
# The tokenizer
# ----------------------------------------------------------------------------


class Tokenizer(TextTokenizer):
    """A byte-level BPE tokenizer: 256 bytes, learned merges, then special tokens.

    Build one with :meth:`train` or :meth:`load`/:meth:`from_json`; the
    constructor takes the merges and special tokens directly and checks them.
    """

    kind = "byte-bpe"
    _CACHE_LIMIT = 1 << 18  # distinct chunks remembered by the encoder

    def __init__(self, merges, special_tokens=None, pattern: str = PATTERN):
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
        try:
            self._regex = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"pattern is not a valid regular expression: {e}") from None
        self._split = self._regex.findall
        self._pattern = pattern
        # PATTERN splits any text into chunks that cover it; another pattern (a damaged file,
        # say) might skip characters, which encoding would then silently drop: check it then.
        self._check_cover = pattern != PATTERN
        if self._check_cover:
            probe = "".join(map(chr, range(0x3001))).encode("utf-8", "replace").decode("utf-8", "replace")
            if sum(map(len, self._split(probe))) != len(probe):
                self._uncovered(probe)

        # Merges: merge i makes id 256 + i from two earlier ids.
        self._merges: list[tuple[int, int]] = []
        self._bytes: list[bytes] = [bytes([i]) for i in range(256)]
        self._ranks: dict[tuple[int, int], int] = {}  # pair -> the id it makes
        for i, m in enumerate(merges):
            new_id = 256 + i
            if not (isinstance(m, (tuple, list)) and len(m) == 2):
                raise ValueError(f"merge {i} is {m!r}, expected two ids below {new_id}")
            a, b = m                                     # (no generator per merge: vocabularies of 50k load fast)
            if not (type(a) is int and type(b) is int and 0 <= a < new_id and 0 <= b < new_id):
                raise ValueError(f"merge {i} is {m!r}, expected two ids below {new_id}")
            pair = (a, b)
            if pair in self._ranks:
                raise ValueError(f"merge {i} repeats the pair {pair}")
            self._merges.append(pair)
            self._ranks[pair] = new_id
            self._bytes.append(self._bytes[pair[0]] + self._bytes[pair[1]])

        # Special tokens: the last ids, in order.
        special_tokens = {} if special_tokens is None else special_tokens
        if not isinstance(special_tokens, dict):
            raise TypeError(f"special_tokens must be a dict name -> id, got {type(special_tokens).__name__}")
        self._special: dict[str, int] = {}
        for name, sid in special_tokens.items():
            expected = len(self._bytes)
            if not isinstance(name, str) or not name:
                raise ValueError(f"special token name {name!r} must be a non-empty str")
            if sid != expected or type(sid) is not int:
                raise ValueError(f"special token {name!r} has id {sid!r}, expected {expected} "
                                 "(special tokens take the ids right after the merges)")
            _check_text(name)
            self._special[name] = sid
            self._bytes.append(name.encode("utf-8"))
        if len(set(self._bytes)) != len(self._bytes):
            seen = {}
            for i, b in enumerate(self._bytes):
                if b in seen:
                    raise ValueError(f"ids {seen[b]} and {i} have the same bytes {_readable(b)!r}; "
                                     "expected every token to be distinct")
                seen[b] = i
        if len(self._bytes) > 1 << 16:
            raise ValueError(f"vocabulary has {len(self._bytes)} ids, expected at most 65536 (uint16)")

        # Special tokens are found before pre-tokenisation, longest first.
        self._special_re = self._special_regex(self._special)
        self._cache: dict[str, tuple[int, ...]] = {}

    # -- training ------------------------------------------------------------

    @classmethod
    def train(cls, texts, vocab_size: int = 1024, special_tokens=(EOT,)) -> "Tokenizer":
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from ``texts``.

        ``texts`` is a str, a path, or an iterable of strs and paths. Paths
        (``os.PathLike``, or a one-line str that ends in ``.txt``, is a file,
        or holds a ``/`` and exists) name text files or folders (every ``*.txt`` below,
        sorted); files are streamed in blocks. Each file and each str is a
        separate document. Special tokens found in the text are boundaries:
        never merged across, never learned. Raises ``ValueError`` if the text
        has too few pairs for ``vocab_size``.
        """
        if isinstance(special_tokens, str):
            raise TypeError(f"special_tokens must be a sequence of str, got the str {special_tokens!r}")
        if not isinstance(special_tokens, (list, tuple)):
            # (a set would number its tokens in hash order)
            raise TypeError(f"special_tokens must be a list or tuple of str (ids follow its order), "
                            f"got {type(special_tokens).__name__}")
        specials = tuple(special_tokens)
        if not is_int(vocab_size):
            raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
        vocab_size = int(vocab_size)
        for s in specials:
            if not isinstance(s, str) or len(s.encode("utf-8", "surrogatepass")) < 2:
                raise ValueError(f"special token {s!r} must be a str of at least 2 bytes "
                                 "(single bytes are tokens already)")
            try:
                s.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"special token {s!r} is not valid text (a lone surrogate)") from None
        if len(set(specials)) != len(specials):
            raise ValueError(f"special tokens {specials!r} must be distinct")
        n_merges = vocab_size - 256 - len(specials)
        if n_merges < 0 or vocab_size > 1 << 16:
            raise ValueError(f"vocab_size={vocab_size} must be between {256 + len(specials)} "
                             f"(256 bytes + {len(specials)} special tokens) and 65536")

        # 1. Count the distinct chunks, cutting the text at special tokens.
        split = re.compile(PATTERN).findall
        special_re = cls._special_regex(dict.fromkeys(specials))
        counts: Counter[str] = Counter()
        for text, from_file in documents(texts, specials):
            if not from_file:
                _check_text(text)
            parts = special_re.split(text) if special_re else [text]
            for part in parts[::2]:  # the odd parts are the special tokens themselves
                counts.update(split(part))

        # 2. Learn the merges, and lay out the vocabulary.
        taken = {s.encode("utf-8") for s in specials}
        merges = _learn_merges(counts, n_merges, taken)
        first = 256 + n_merges
        return cls(merges, {s: first + i for i, s in enumerate(specials)}, PATTERN)

    # -- encoding ------------------------------------------------------------

    def _encode_chunk(self, chunk: str) -> tuple[int, ...]:
        """BPE on one chunk: apply the merges in the order they were learned."""
        ids = list(chunk.encode("utf-8", "surrogateescape"))
        ranks, merges, never = self._ranks, self._merges, len(self._bytes)
        while len(ids) >= 2:
            # The present pair learned first is the one whose new id is smallest.
            new_id = min(map(ranks.get, zip(ids, ids[1:]), repeat(never)))
            if new_id == never:
                break  # no pair of this chunk is a merge
            ids = merge_pair(ids, merges[new_id - 256], new_id)
        return tuple(ids)

    def _encode_ordinary(self, text: str, out) -> None:
        """Append the ids of ``text`` (no special tokens) to ``out``."""
        cache = self._cache
        if len(cache) > self._CACHE_LIMIT:
            cache.clear()
        chunks = self._split(text)
        if self._check_cover and sum(map(len, chunks)) != len(text):
            self._uncovered(text)
        # Run BPE once per distinct chunk that is new, then look every chunk up.
        for chunk in set(chunks).difference(cache):
            cache[chunk] = self._encode_chunk(chunk)
        out += chain.from_iterable(map(cache.__getitem__, chunks))

    def _uncovered(self, text: str) -> None:
        """Raise naming the first character of ``text`` that no chunk of the pattern covers."""
        at = 0
        for m in self._regex.finditer(text):
            if m.start() != at:
                break
            at = m.end()
        if at >= len(text):   # every character matched, but findall returned groups, not whole chunks
            raise ValueError("this tokenizer's pattern has capturing groups, so its chunks do not cover the text; "
                             "the pattern is not glassllm's (a damaged tokenizer file?)")
        raise ValueError(f"this tokenizer's pattern matches no chunk at {text[at]!r} (index {at}), so encoding "
                         "would drop it; the pattern is not glassllm's (a damaged tokenizer file?)")

    def _encode_with_specials(self, text: str, allowed: dict[str, int], out) -> None:
        """Append the ids of ``text``, turning the ``allowed`` special tokens into their ids."""
        if not allowed:
            self._encode_ordinary(text, out)
            return
        pattern = self._special_re if allowed is self._special else self._special_regex(allowed)
        parts = pattern.split(text)
        for i, part in enumerate(parts):
            if i % 2:
                out.append(allowed[part])
            elif part:
                self._encode_ordinary(part, out)

    def encode(self, text: str, allowed_special="none") -> list[int]:
        """The ids of ``text``.

        Special tokens become their ids only if ``allowed_special`` allows them
        (``"all"``, or a set of names); otherwise their text is ordinary text.

        Note the default, ``"none"``: text typed as ``<|endoftext|>`` stays
        ordinary text here. Prompts given to :func:`glassllm.generate.generate`,
        the CLI, the inspector and :func:`glassllm.trace.to_str_tokens` are read
        with :meth:`encode_prompt`, which allows every special token (the
        special id); use it to get their ids.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}"
                            + ("; use encode_bytes for bytes" if isinstance(text, (bytes, bytearray)) else ""))
        _check_text(text)
        out: list[int] = []
        self._encode_with_specials(text, self.allowed(allowed_special), out)
        return out

    def encode_prompt(self, text: str) -> list[int]:
        """What the model reads for ``text``: its ids with every special token allowed (nothing is put
        before them: a glassllm model starts a fresh story after ``<|endoftext|>``)."""
        return self.encode(text, allowed_special="all")

    def encode_bytes(self, data: bytes) -> list[int]:
        """The ids of arbitrary bytes (never special tokens); inverse of :meth:`decode_bytes`."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"encode_bytes expects bytes, got {type(data).__name__}")
        # Non-UTF-8 bytes become lone surrogates, which the chunks encode back.
        out: list[int] = []
        self._encode_ordinary(bytes(data).decode("utf-8", "surrogateescape"), out)
        return out

    def encode_corpus(self, text_or_paths) -> np.ndarray:
        """Encode a big corpus fast, with every special token allowed: a uint16 array.

        ``text_or_paths`` is a str of text, a path, or an iterable of them (as
        for :meth:`train`); files are streamed, and their ids are concatenated.
        ``<|endoftext|>`` lines between stories become :attr:`eot_id`.
        """
        out = array("H")
        for text, from_file in documents(text_or_paths, tuple(self._special)):
            if not from_file:
                _check_text(text)
            ids: list[int] = []
            self._encode_with_specials(text, self._special, ids)
            out.extend(ids)
        return np.frombuffer(out, dtype=np.uint16).copy()

    # -- decoding and display ------------------------------------------------

    def decode_bytes(self, ids) -> bytes:
        """The bytes of ``ids`` (special tokens give their text's bytes)."""
        table = self._bytes
        return b"".join([table[i] for i in self.check_ids(ids)])

    def decode(self, ids) -> str:
        """The text of ``ids``; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int, after: int | None = None) -> bytes:
        """The bytes of one id (whatever comes before it: ``after`` is ignored)."""
        (i,) = self.check_ids([token_id])
        return self._bytes[i]

    def piece(self, token_id: int) -> str:
        """Readable text of one id, for display only.

        Bytes that are not complete UTF-8 show as ``\\xNN`` escapes, control
        characters as ``\\n``, ``\\t``, ``\\xNN``; special tokens as their name.
        """
        (i,) = self.check_ids([token_id])
        if i >= 256 + len(self._merges):
            return self._bytes[i].decode("utf-8")  # a special token: its name
        return _readable(self._bytes[i])

    def pieces(self, ids) -> list[str]:
        """:meth:`piece` of each id."""
        return [self.piece(i) for i in self.check_ids(ids)]

    # -- properties ------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of ids: 256 + merges + special tokens."""
        return len(self._bytes)

    @property
    def eot_id(self) -> int:
        """The id of ``<|endoftext|>``."""
        if EOT not in self._special:
            raise ValueError(f"this tokenizer has no {EOT} token; its special tokens are {sorted(self._special)}")
        return self._special[EOT]

    @property
    def special_tokens(self) -> dict[str, int]:
        """Special token name -> id (a copy)."""
        return dict(self._special)

    @property
    def bos_id(self) -> None:
        """None: nothing is put before a text."""
        return None

    @property
    def end_ids(self) -> tuple[int, ...]:
        """Generation ends at ``<|endoftext|>`` (nothing, for a tokenizer without it)."""
        return (self._special[EOT],) if EOT in self._special else ()

    @property
    def merges(self) -> list[tuple[int, int]]:
        """The merges ``(a, b)`` in order; merge ``i`` made id ``256 + i``."""
        return list(self._merges)

    @property
    def pattern(self) -> str:
        """The pre-tokenisation regex (see the module docstring)."""
        return self._pattern

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self._merges)}, special_tokens={self._special})"

    @staticmethod
    def _special_regex(specials) -> re.Pattern | None:
        """A regex with one capture group matching any special token, longest first."""
        if not specials:
            return None
        names = sorted(specials, key=lambda s: (-len(s), s))
        return re.compile("(" + "|".join(map(re.escape, names)) + ")")

    # -- files -----------------------------------------------------------------

    def to_json(self) -> str:
        """The tokenizer as a JSON document (format in the module docstring)."""
        head = {"format": FORMAT, "version": VERSION, "kind": self.kind, "vocab_size": self.vocab_size,
                "pattern": self._pattern, "special_tokens": self._special}
        lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()]
        merges = [json.dumps([a, b, self.piece(256 + i)], ensure_ascii=False)
                  for i, (a, b) in enumerate(self._merges)]
        lines.append('  "merges": [' + ("\n    " + ",\n    ".join(merges) + "\n  " if merges else "") + "]")
        return "\n".join(lines) + "\n}\n"

    @classmethod
    def from_json(cls, text) -> "Tokenizer":
        """Rebuild a tokenizer from :meth:`to_json`'s output; ``ValueError`` if it is not one."""
        doc = parse_tokenizer_json(text)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"not a glassllm tokenizer: format is {found!r}, expected {FORMAT!r}")
        if doc.get("kind", "byte-bpe") != "byte-bpe":
            raise ValueError(f"tokenizer kind {doc.get('kind')!r} is not a byte-level tokenizer, expected 'byte-bpe'")
        if doc.get("version") != VERSION:
            raise ValueError(f"tokenizer format version {doc.get('version')!r} is not supported, expected {VERSION}")
        for key, kind in (("pattern", str), ("special_tokens", dict), ("merges", list), ("vocab_size", int)):
            if not isinstance(doc.get(key), kind):
                raise ValueError(f"tokenizer field {key!r} is {doc.get(key)!r:.60}, expected a {kind.__name__}")
        merges = []
        for i, m in enumerate(doc["merges"]):
            if not (isinstance(m, list) and len(m) in (2, 3)):
                raise ValueError(f"merge {i} is {m!r:.60}, expected [id_a, id_b, piece]")
            merges.append(tuple(m[:2]))
        tok = cls(merges, doc["special_tokens"], doc["pattern"])
        if tok.vocab_size != doc["vocab_size"]:
            raise ValueError(f"vocab_size is {doc['vocab_size']}, but the merges and special tokens "
                             f"make {tok.vocab_size}")
        return tok

    def save(self, path) -> None:
        """Write :meth:`to_json` to ``path`` atomically (temporary file, then rename)."""
        atomic_write(path, self.to_json())

    @classmethod
    def load(cls, path) -> "Tokenizer":
        """Read a file written by :meth:`save`; every problem is one ``ValueError`` naming the file."""
        return read_tokenizer_file(path, cls.from_json)
