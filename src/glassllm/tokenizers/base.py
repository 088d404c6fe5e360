"""The one tokenizer interface, :class:`TextTokenizer`, that every glassllm tokenizer implements.

:mod:`glassllm.tokenizers` describes what it promises; the byte-level
:class:`~glassllm.tokenizers.bpe.Tokenizer` and the SentencePiece
:class:`~glassllm.tokenizers.sentencepiece.SPTokenizer` derive from it.
:data:`CONTROL_ESCAPES` is how both show a control character in a readable piece.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Set

import numpy as np

from ..checks import is_int

__all__ = ["TextTokenizer", "KINDS", "CONTROL_ESCAPES"]

KINDS = ("byte-bpe", "sentencepiece-bpe")

# Control characters would move the cursor or vanish: readable pieces show them as escapes.
CONTROL_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7f, 0xa0))}
CONTROL_ESCAPES.update({ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"})


class TextTokenizer(ABC):
    """What every glassllm tokenizer offers (see the module docstring)."""

    kind: str = ""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def encode(self, text: str, allowed_special="none") -> list[int]: ...

    @abstractmethod
    def encode_prompt(self, text: str) -> list[int]: ...

    @abstractmethod
    def encode_corpus(self, text_or_paths): ...

    @abstractmethod
    def token_bytes(self, token_id: int, after: int | None = None) -> bytes: ...

    @abstractmethod
    def decode_bytes(self, ids) -> bytes: ...

    def decode(self, ids) -> str:
        """The text of ``ids``; bytes that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    @abstractmethod
    def piece(self, token_id: int) -> str: ...

    def pieces(self, ids) -> list[str]:
        """:meth:`piece` of each id."""
        return [self.piece(i) for i in ids]

    @property
    @abstractmethod
    def special_tokens(self) -> dict[str, int]: ...

    def check_ids(self, ids) -> list[int]:
        """``ids`` as a list of ints, each a valid id of this tokenizer; a ``TypeError`` or ``ValueError``
        line for anything else (a set or a dict has no order of its own, so it is refused)."""
        n = self.vocab_size
        if type(ids) is list and all(type(i) is int and 0 <= i < n for i in ids):
            return ids  # the common case (one decoding step's [id]), checked without the general walk
        if isinstance(ids, np.ndarray):
            if ids.ndim != 1 or ids.dtype.kind not in "iu":
                raise TypeError(f"ids must be a 1-D integer array, got {ids.ndim}-D {ids.dtype}")
            ids = ids.tolist()
        elif isinstance(ids, (str, bytes, Set, Mapping)) or not isinstance(ids, Iterable):
            raise TypeError(f"ids must be a list of ints, got {type(ids).__name__}")
        ids = list(ids)
        for i in ids:
            if not is_int(i):
                raise TypeError(f"token id {i!r} is a {type(i).__name__}, expected an int")
            if not 0 <= i < n:
                raise ValueError(f"token id {i} is out of range, expected 0 <= id < {n}")
        return [int(i) for i in ids]

    def allowed(self, allowed_special) -> dict[str, int]:
        """The special tokens ``encode`` may match for ``allowed_special``: ``"none"``, ``"all"`` or a
        set of their names (name -> id); a name the tokenizer lacks is one ``ValueError`` line."""
        special = self.special_tokens
        if isinstance(allowed_special, str):
            if allowed_special == "none":
                return {}
            if allowed_special == "all":
                return dict(special)
            raise ValueError(f"allowed_special={allowed_special!r}, expected 'none', 'all' or a set of names")
        if not isinstance(allowed_special, (set, frozenset, list, tuple)):
            raise TypeError(f"allowed_special must be 'none', 'all' or a set, got {type(allowed_special).__name__}")
        for name in allowed_special:
            if name not in special:
                raise ValueError(f"{name!r} is not a special token of this tokenizer, "
                                 f"expected one of {sorted(special)}")
        return {name: special[name] for name in allowed_special}

    @property
    @abstractmethod
    def bos_id(self) -> int | None: ...

    @property
    @abstractmethod
    def end_ids(self) -> tuple[int, ...]: ...

    @property
    @abstractmethod
    def eot_id(self) -> int: ...

    @abstractmethod
    def to_json(self) -> str: ...
