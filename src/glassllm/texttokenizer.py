"""The one tokenizer interface, :class:`TextTokenizer`, that every glassllm tokenizer implements.

:mod:`glassllm.tokenizing` describes what it promises and reads any tokenizer
document; the byte-level :class:`~glassllm.tokenizer.Tokenizer` and the
SentencePiece :class:`~glassllm.sptokenizer.SPTokenizer` derive from it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

__all__ = ["TextTokenizer", "KINDS"]

KINDS = ("byte-bpe", "sentencepiece-bpe")


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
