"""Reading a corpus: text and text files, streamed in blocks, as documents for the tokenizers.

A corpus is what :meth:`~glassllm.tokenizers.base.TextTokenizer.encode_corpus` and
:meth:`~glassllm.tokenizers.bpe.Tokenizer.train` take: a str of text, a path, or an iterable of
them (:func:`glassllm.files.texts_and_files` tells text from paths, and a folder stands for its
``*.txt`` files). Files are read as UTF-8 in blocks of about a million characters; bytes that
are not UTF-8 come through as lone surrogates (``surrogateescape``), so they encode back to the
same bytes. A block ends only where the text may be cut without changing how it is tokenised:
at a newline or space that follows a character that is not :data:`WHITE_SPACE`, never inside a
special token (the pre-tokenisation of :mod:`glassllm.tokenizers.bpe` starts a new chunk there;
:func:`stories` joins a story cut by a block end again).

Stories in a glassllm text file are separated by a line ``<|endoftext|>`` (:data:`EOT`):
:func:`documents` gives the blocks of every file and each str as they come, :func:`stories`
gives each story on its own.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from ..files import open_file, reading, texts_and_files

__all__ = ["EOT", "WHITE_SPACE", "read_blocks", "documents", "stories"]

EOT = "<|endoftext|>"     # how glassllm's text files separate stories

# The inside of a regex class of Unicode White_Space (25 characters). Python's own \s also counts
# U+001C..U+001F and Oniguruma's does not: one reason the class is spelled out. Escapes are \xNN for
# ASCII and \uNNNN above it, read alike by both engines.
WHITE_SPACE = r"\t\n\x0b\x0c\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_SPACE_CHARS = frozenset(re.findall("[" + WHITE_SPACE + "]", "".join(map(chr, range(0x3001)))))

_BLOCK_CHARS = 1 << 20  # characters read from a file at a time
_MAX_CARRY = 1 << 26  # give up looking for a clean cut past this many characters


def _safe_cut(text: str, specials: tuple[str, ...]) -> int:
    """The last position where ``text`` can be cut without changing its chunks.

    A newline or space right after a non-space character always starts a new
    chunk, and the chunks before it never look past it (see
    :data:`glassllm.tokenizers.bpe.PATTERN`). The cut must not fall inside a
    special token. Returns 0 if there is none.
    """
    for sep in ("\n", " "):
        i = len(text)
        while (i := text.rfind(sep, 0, i)) > 0:
            if text[i - 1] not in _SPACE_CHARS and not any(
                    s in text[max(0, i - len(s) + 1): i + len(s) - 1] for s in specials):
                return i
    return 0


def read_blocks(path: Path, specials: tuple[str, ...]) -> Iterator[str]:
    """Yield a file's text in blocks cut where :func:`_safe_cut` allows.

    The file is read as UTF-8; bytes that are not UTF-8 come through as lone
    surrogates (``surrogateescape``) and are encoded back to the same bytes.
    Newlines are kept as they are in the file. A file that cannot be read is one
    ``ValueError`` line (:func:`glassllm.files.reading`).
    """
    with open_file(path, "r", encoding="utf-8", errors="surrogateescape", newline="") as f, reading(path):
        carry = ""
        while block := f.read(_BLOCK_CHARS):
            text = carry + block
            cut = _safe_cut(text, specials)
            if cut == 0 and len(text) > _MAX_CARRY:
                cut = len(text)  # a huge run without a clean cut: split it anyway
            if cut:
                yield text[:cut]
            carry = text[cut:]
        if carry:
            yield carry


def documents(source, specials: tuple[str, ...]) -> Iterator[tuple[str, bool]]:
    """Yield ``(text, from_file)`` pieces from a str, a path, or an iterable of them.

    Each piece is pre-tokenised on its own: a str as it is, a file in its
    :func:`read_blocks`. Items are text, or paths: any ``os.PathLike``, or a
    ``str`` that :func:`glassllm.files.is_path` accepts.
    """
    for item in texts_and_files(source):
        if isinstance(item, Path):
            for block in read_blocks(item, specials):
                yield block, True
        else:
            yield item, False


def stories(source) -> Iterator[str]:
    """The documents of a str, a path, or an iterable of them: each file or str, cut at ``<|endoftext|>``.

    Files are read in blocks (:func:`read_blocks`); a story that runs across two blocks is
    joined again before it is yielded.
    """
    for item in texts_and_files(source):
        if isinstance(item, Path):
            pending = ""
            for block in read_blocks(item, (EOT,)):
                parts = (pending + block).split(EOT)
                pending = parts.pop()                                # may continue in the next block
                yield from parts
            yield pending
        else:
            yield from item.split(EOT)
