"""Held-out loss, perplexity and bits per byte, over windows or document by document.

:func:`evaluate` cuts the token stream of the held-out text into
non-overlapping windows: window i reads ids[iT : iT+T] and predicts
ids[iT+1 : iT+T+1] (the last window may be shorter), so every token but the
first is predicted exactly once, each from at most T tokens of context.
:func:`evaluate_documents` scores each document alone instead, from its start
token, as the model reads a story it writes: every position counts from the
story's beginning, and the loss is also reported by position band, so a model
that fails past the length it was trained on shows it at once. Under
``no_grad``, in float64 log-softmax::

    loss        = nats / tokens            (mean nats per predicted token)
    perplexity  = exp(loss)
    bits/byte   = nats / (ln 2 * bytes)    bytes = UTF-8 bytes of the documents' text
                                                   that the predicted tokens carry

The bytes are counted the same way for every tokenizer (:func:`text_bytes`):
what separates documents is not text of theirs, so ``<s>``, ``<|endoftext|>``
and the newline either side of an ``<|endoftext|>`` (the separator line
``\n<|endoftext|>\n`` of a story file) count 0 bytes, while predicting them
still costs nats. Bits per byte divides by the length of the text rather than
the number of tokens, so models with different tokenizers can be compared.
When no byte of the documents' text is predicted (a text of separators only,
or too few tokens of each document scored), there is no bits per byte to give:
the functions refuse, naming what to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..autograd import logsumexp_np, no_grad
from ..checks import ParameterError, is_int
from ..nn import Transformer

__all__ = ["EvalResult", "DocumentEval", "BANDS", "evaluate", "evaluate_text", "evaluate_documents", "text_bytes",
           "start_context", "document_ids", "token_nats"]

BANDS = ((0, 127), (128, 255), (256, 383), (384, 511))   # position bands of the per-document loss (inclusive)
REFERENCE = (0, 255)    # the positions a band is compared with, in the same documents (DocumentEval.same_documents)
NO_DOCUMENT = ("the text holds no document to score (no text, or only separators: <|endoftext|> lines, <s>, </s>); "
               "give text with at least one story")


@dataclass(frozen=True)
class EvalResult:
    """Held-out figures (see the module docstring for the exact definitions)."""

    loss: float           # nats per predicted token
    perplexity: float     # exp(loss)
    bits_per_byte: float  # nats / (ln 2 * bytes)
    nats: float           # summed over predicted tokens
    tokens: int           # predicted tokens
    bytes: int            # UTF-8 bytes of the documents' text that the predicted tokens carry
    windows: int

    def line(self) -> str:
        return (f"loss {self.loss:.4f}  perplexity {self.perplexity:.3f}  bits/byte {self.bits_per_byte:.4f}  "
                f"({_count(self.tokens, 'token')}, {_count(self.bytes, 'byte')}, {_count(self.windows, 'window')})")


def _count(n: int, noun: str) -> str:
    """``1 window``, ``996 windows``, ``254,915 tokens``."""
    return f"{n:,} {noun}{'s' * (n != 1)}"


def evaluate(model: Transformer, ids, tokenizer, seq_len: int = 256, batch_size: int = 16,
             max_windows: int | None = None) -> EvalResult:
    """Loss, perplexity and bits per byte of ``model`` on the token stream ``ids``.

    Non-overlapping windows of ``seq_len`` (see the module docstring); with
    ``max_windows`` only the first that many windows count (None or 0: all).
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or len(ids) < 2:
        raise ValueError(f"evaluation needs at least 2 tokens, got {len(ids) if ids.ndim == 1 else ids.shape}")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"evaluation needs integer token ids, got dtype {ids.dtype}")
    for name, value, low in (("seq_len", seq_len, 1), ("batch_size", batch_size, 1), ("max_windows", max_windows, 0)):
        if value is None and name == "max_windows":
            continue
        if not is_int(value) or value < low:
            raise ParameterError(name, f"must be an int >= {low}, got {value!r}")
    if seq_len > model.config.max_seq_len:
        raise ParameterError("seq_len", f"must be in [1, {model.config.max_seq_len}], got {seq_len}")
    n_windows = math.ceil((len(ids) - 1) / seq_len)
    if max_windows:
        n_windows = min(n_windows, int(max_windows))
    end = min(len(ids), n_windows * seq_len + 1)            # ids[:end] are read; ids[1:end] predicted
    full = (end - 1) // seq_len                              # windows of exactly seq_len
    starts = np.arange(full) * seq_len
    n_bytes = int(text_bytes(tokenizer, np.asarray(ids[:end], dtype=np.int64))[1:].sum())
    if n_bytes == 0:
        if end < len(ids) and text_bytes(tokenizer, np.asarray(ids, dtype=np.int64))[1:].any():
            raise ParameterError("max_windows", f"must be > {max_windows} for this text: its first windows "
                                 "predict no byte of the documents' text, so there is no bits per byte to give")
        raise ValueError(NO_DOCUMENT)
    nats = 0.0
    with no_grad():
        for lo in range(0, full, batch_size):
            rows = starts[lo:lo + batch_size, None] + np.arange(seq_len + 1)   # (B, T+1)
            chunk = np.asarray(ids[rows], dtype=np.int64)
            nats += _nats(model, chunk[:, :-1], chunk[:, 1:])
        if full * seq_len + 1 < end:                                           # the short last window
            tail = np.asarray(ids[full * seq_len:end], dtype=np.int64)[None]   # (1, t+1)
            nats += _nats(model, tail[:, :-1], tail[:, 1:])
    if not math.isfinite(nats):
        raise ValueError(f"the model's loss on this text is {nats} (not finite): its numbers overflow; "
                         "check the model file (glassllm.train.find_non_finite names the first bad snapshot)")
    tokens = end - 1
    loss = nats / tokens
    perplexity = math.exp(loss) if loss < 709.0 else math.inf   # e^709 is near float64's largest number
    return EvalResult(loss=loss, perplexity=perplexity, bits_per_byte=nats / (math.log(2) * n_bytes),
                      nats=nats, tokens=int(tokens), bytes=int(n_bytes), windows=int(n_windows))


def _nats(model: Transformer, x: np.ndarray, y: np.ndarray) -> float:
    """Summed negative log-likelihood of targets ``y`` (B, T), in float64."""
    return float(token_nats(model, x, y).sum())


def token_nats(model: Transformer, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of each target of ``y`` (B, T), in float64: (B, T)."""
    z = model(x).data.astype(np.float64)                                # (B, T, V)
    lse = logsumexp_np(z, axis=-1)                                      # (B, T)
    picked = np.take_along_axis(z, y[..., None], axis=-1)[..., 0]        # (B, T)
    return lse - picked


def evaluate_text(model: Transformer, tokenizer, text_or_paths, seq_len: int = 256,
                  batch_size: int = 16, from_start: bool = False) -> EvalResult:
    """:func:`evaluate` on text (a str, a path, or a list of them) encoded with ``encode_corpus``.

    ``from_start``: read the text after the tokenizer's :func:`start_context` (when it does not
    already begin so), so that every byte of the first document is predicted too.
    """
    ids = np.asarray(tokenizer.encode_corpus(text_or_paths), dtype=np.int64)
    head = start_context(tokenizer)
    if from_start and head and ids[:len(head)].tolist() != head[:len(ids)]:
        ids = np.concatenate([np.array(head, dtype=np.int64), ids])
    if len(ids) < 2 and not text_bytes(tokenizer, ids).any():     # no text, or a start token alone
        raise ValueError(NO_DOCUMENT)
    return evaluate(model, ids, tokenizer, seq_len, batch_size)


# ----------------------------------------------------------------------------
# Documents and their bytes
# ----------------------------------------------------------------------------

def start_context(tokenizer) -> list[int]:
    """What the model reads before a document starts: ``[<s>]`` for a tokenizer that puts it first;
    for glassllm's tokenizer ``<|endoftext|>`` and the newline after it, as in a story file; else []."""
    from ..data import doc_start_id

    start = doc_start_id(tokenizer)
    if start is None:
        return []
    if getattr(tokenizer, "bos_id", None) is not None:
        return [start]
    return [start] + [int(i) for i in tokenizer.encode("\n")]


def text_bytes(tokenizer, ids) -> np.ndarray:
    """For each id of a token sequence, the UTF-8 bytes of document text it carries (int64 array).

    Special tokens (``<s>``, ``</s>``, ``<|endoftext|>``) carry none, nor does the newline
    right before or after an ``<|endoftext|>`` (the story file's separator line); every other
    byte a token decodes to is the documents' own. For a SentencePiece tokenizer a token's
    bytes depend on the one before it (the dummy prefix), so the sequence is read in order.
    """
    ids = np.asarray(ids, dtype=np.int64)
    specials = np.array(sorted(set(tokenizer.special_tokens.values())), dtype=np.int64)
    if getattr(tokenizer, "bos_id", None) is not None or not hasattr(tokenizer, "eot_id"):
        out = np.zeros(len(ids), dtype=np.int64)
        prev = None
        for k, i in enumerate(ids.tolist()):
            out[k] = len(tokenizer.token_bytes(i, prev))
            prev = i
        out[np.isin(ids, specials)] = 0
        return out
    table = _byte_table(tokenizer)
    out = table[ids].copy()
    out[np.isin(ids, specials)] = 0
    eot = tokenizer.special_tokens.get("<|endoftext|>")
    if eot is not None and len(ids) > 1:
        nl_end, nl_start = _newline_ends(tokenizer)
        at = ids == eot
        before = np.flatnonzero(at[1:])                               # ids[k] right before an <|endoftext|>
        before = before[~at[before]]
        out[before] -= nl_end[ids[before]]
        after = np.flatnonzero(at[:-1]) + 1                           # ids[k] right after one
        after = after[~at[after]]
        out[after] -= nl_start[ids[after]]
        np.maximum(out, 0, out=out)              # a lone "\n" between two <|endoftext|> is one separator byte
    return out


def _byte_table(tokenizer) -> np.ndarray:
    cached = getattr(tokenizer, "_glassllm_byte_table", None)
    if cached is None:
        cached = np.array([len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size)], dtype=np.int64)
        try:
            tokenizer._glassllm_byte_table = cached
        except AttributeError:                                         # a tokenizer with __slots__
            pass
    return cached


def _newline_ends(tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Per id: does its text end with a newline, does it start with one (0 or 1)."""
    pieces = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
    return (np.array([p.endswith(b"\n") for p in pieces], dtype=np.int64),
            np.array([p.startswith(b"\n") for p in pieces], dtype=np.int64))


def document_ids(tokenizer, text_or_paths) -> list[np.ndarray]:
    """The documents of a text (a str, a path, or a list of them), each as the model reads it alone.

    A document runs from its start token (:func:`start_context`) to the next one, inclusive: the
    model predicts each token of the story and then its end. Documents without text are dropped.
    """
    head = start_context(tokenizer)
    if not head:
        raise ValueError("scoring document by document needs a tokenizer with a document-start token "
                         "(<s> or <|endoftext|>); this one has neither")
    ids = np.asarray(tokenizer.encode_corpus(text_or_paths), dtype=np.int64)
    if ids[:len(head)].tolist() != head:
        ids = np.concatenate([np.array(head, dtype=np.int64), ids])
    start = head[0]
    cuts = np.flatnonzero(ids == start).tolist() + [len(ids)]
    docs = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        doc = ids[lo:hi + 1] if hi < len(ids) else np.concatenate([ids[lo:], [start]])
        if text_bytes(tokenizer, doc).sum() > 0:
            docs.append(doc)
    return docs


@dataclass(frozen=True)
class DocumentEval:
    """Per-document held-out figures: each document scored alone from its start token."""

    loss: float
    perplexity: float
    bits_per_byte: float
    nats: float
    tokens: int           # predicted tokens
    bytes: int            # UTF-8 bytes of the documents' text that the predicted tokens carry
    documents: int
    truncated: int        # documents longer than the context: only their first ``context`` tokens are predicted
    context: int
    bands: tuple          # ((first, last, tokens, loss), ...): the loss of the predictions made at input
                          # positions first..last (position 0 is the start token)
    same_documents: tuple = ()   # ((first, last, documents, loss), ...), one per band: the documents that reach
                                 # the band's first position, and their loss at positions REFERENCE. Only the
                                 # longer documents reach a late band, so compare a band with this, not with
                                 # the first bands (which average over every document, short ones too).

    def line(self) -> str:
        return (f"loss {self.loss:.4f}  perplexity {self.perplexity:.3f}  bits/byte {self.bits_per_byte:.4f}  "
                f"({_count(self.tokens, 'token')}, {_count(self.bytes, 'byte')}, "
                f"{_count(self.documents, 'document')}, {self.truncated:,} cut at {self.context} tokens)")

    def band_lines(self) -> list[str]:
        lines = []
        same = self.same_documents or [None] * len(self.bands)
        for (lo, hi, n, loss), ref in zip(self.bands, same):
            line = f"  positions {lo:>3}-{hi:<3} loss {'-' if n == 0 else f'{loss:.4f}':>7}  ({_count(n, 'token')})"
            if n and ref is not None and lo > REFERENCE[1]:
                line += (f"; the same {_count(ref[2], 'document')} at {REFERENCE[0]}-{REFERENCE[1]}: {ref[3]:.4f}, "
                         f"this band {loss / ref[3] - 1:+.1%}")
            lines.append(line)
        return lines


def evaluate_documents(model: Transformer, tokenizer, text_or_paths, context: int | None = None,
                       batch_size: int = 16, bands=BANDS) -> DocumentEval:
    """Score each document of ``text_or_paths`` alone (:func:`document_ids`), up to ``context`` tokens
    of it predicted (default: the model's ``max_seq_len``), in float64, with the loss by position band."""
    limit = model.config.max_seq_len
    context = limit if context is None else context
    if not is_int(context) or not 1 <= context <= limit:
        raise ParameterError("context", f"must be an int in [1, {limit}], got {context!r}")
    if not is_int(batch_size) or batch_size < 1:
        raise ParameterError("batch_size", f"must be an int >= 1, got {batch_size!r}")
    docs = document_ids(tokenizer, text_or_paths)
    if not docs:
        raise ValueError(NO_DOCUMENT)
    truncated = sum(len(d) > context + 1 for d in docs)
    docs = [d[:context + 1] for d in docs]
    n_bytes = int(sum(text_bytes(tokenizer, d)[1:].sum() for d in docs))
    if n_bytes == 0:
        raise ParameterError("context", f"must be > {context} for this text: predicting {_count(context, 'token')} "
                             "of each document scores none of its text (only the separator after its start), "
                             "so there is no bits per byte to give")
    by_pos = np.zeros(context, dtype=np.float64)                      # nats of the predictions at each position
    count = np.zeros(context, dtype=np.int64)
    ref_lo, ref_hi = REFERENCE
    ref_nats = np.zeros(len(bands), dtype=np.float64)                 # per band: nats at REFERENCE of the
    ref_tokens = np.zeros(len(bands), dtype=np.int64)                 # documents that reach its first position
    ref_docs = np.zeros(len(bands), dtype=np.int64)
    firsts = np.array([first for first, _ in bands])
    order = sorted(range(len(docs)), key=lambda k: len(docs[k]))      # similar lengths share a batch
    with no_grad():
        for lo in range(0, len(order), batch_size):
            group = [docs[k] for k in order[lo:lo + batch_size]]
            n = max(len(d) for d in group) - 1
            x = np.zeros((len(group), n), dtype=np.int64)
            y = np.zeros((len(group), n), dtype=np.int64)
            mask = np.zeros((len(group), n), dtype=bool)
            for b, d in enumerate(group):                                 # padded at the end: causal attention
                x[b, :len(d) - 1], y[b, :len(d) - 1], mask[b, :len(d) - 1] = d[:-1], d[1:], True
            nll = token_nats(model, x, y)                                # (B, n)
            by_pos[:n] += np.where(mask, nll, 0.0).sum(axis=0)
            count[:n] += mask.sum(axis=0)
            for b, d in enumerate(group):
                reaches = firsts < len(d) - 1                             # predictions at positions 0..len(d)-2
                ref = nll[b, ref_lo:min(ref_hi + 1, len(d) - 1)]
                ref_nats[reaches] += ref.sum()
                ref_tokens[reaches] += ref.size
                ref_docs[reaches] += 1
    nats, tokens = float(by_pos.sum()), int(count.sum())
    if not math.isfinite(nats):
        raise ValueError(f"the model's loss on this text is {nats} (not finite): its numbers overflow; "
                         "check the model file (glassllm.train.find_non_finite names the first bad snapshot)")
    rows = []
    for first, last in bands:
        part = slice(first, min(last, context - 1) + 1)
        n = int(count[part].sum()) if first < context else 0
        rows.append((first, last, n, float(by_pos[part].sum() / n) if n else math.nan))
    loss = nats / tokens
    return DocumentEval(loss=loss, perplexity=math.exp(loss) if loss < 709.0 else math.inf,
                        bits_per_byte=nats / (math.log(2) * n_bytes), nats=nats, tokens=tokens,
                        bytes=n_bytes, documents=len(docs), truncated=truncated, context=int(context),
                        bands=tuple(rows),
                        same_documents=tuple((first, last, int(k), float(nats_ / n_) if n_ else math.nan)
                                             for (first, last), k, nats_, n_ in zip(bands, ref_docs, ref_nats,
                                                                                   ref_tokens)))
