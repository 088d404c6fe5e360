"""Token ids as the pieces of text they stand for, for labels (TransformerLens' ``to_str_tokens``)."""

from __future__ import annotations

import numpy as np


def to_str_tokens(tokenizer, text_or_ids) -> list[str]:
    """The readable piece of every token of ``text_or_ids`` (a str, read as a prompt, or token ids).

    A str is encoded with ``tokenizer.encode_prompt``, as
    :func:`glassllm.generate.generate`, the CLI and the inspector read a prompt
    (``<|endoftext|>`` is one special token). Pieces are ``tokenizer.piece``:
    incomplete UTF-8 shows as ``\\xNN`` escapes, control characters as ``\\n``, ``\\t``.

    >>> from glassllm.tokenizers import Tokenizer
    >>> tok = Tokenizer.train(["the cat sat on the mat. " * 30], vocab_size=262)
    >>> to_str_tokens(tok, "the cat<|endoftext|>")
    ['the', ' c', 'at', '<|endoftext|>']
    """
    if isinstance(text_or_ids, str):
        ids = tokenizer.encode_prompt(text_or_ids)
    else:
        ids = np.asarray(text_or_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise TypeError(f"to_str_tokens takes a str or a 1-D list of token ids, got {text_or_ids!r}")
        ids = ids.tolist()
    return tokenizer.pieces(ids)
