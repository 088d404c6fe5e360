"""Writing text: KV-cache decoding, one token at a time.

How decoding runs (the spec's ``start``, ``n`` and ``m``)::

    prefill   the prompt's L tokens go through the model once:   start = 0,      n = L, m = L
    step 1    the token just drawn is fed back:                   start = L,      n = 1, m = L + 1
    step s    ...                                                 start = L+s-1,  n = 1, m = L + s

Every forward pass appends its n new rotated keys and values to the cache, so
a step computes one query row against m = start + 1 cached keys instead of
recomputing the whole sequence. Each :class:`Token` record carries the
``step``, ``n``, ``start`` and ``m`` of the pass whose logits produced it.

The policies this module fixes (each is tested):

- **Sampling**: see :mod:`glassllm.sampling` (temperature, then top-k, then
  top-p; T = 0 is greedy; filtered ids get probability 0).
- **Stopping**: a row stops at one of the tokenizer's ``end_ids`` (the record
  for it is yielded, with ``text = ""`` and ``finish = "eot"``): ``<|endoftext|>``
  for glassllm's own tokenizer; ``</s>`` or ``<s>`` for a SentencePiece Llama
  (see :mod:`glassllm.tokenizers.sentencepiece`), after ``max_new_tokens`` tokens
  (``finish = "length"``), or when its generated text -- not the prompt --
  contains one of the ``stop`` strings (``finish = "stop"``). The token that
  completes a stop string is yielded, so **the stop string is included** in the
  text (records stream out as they are made and cannot be taken back).
- **Context**: the prompt plus ``max_new_tokens`` must fit in the model's
  context (``max_seq_len`` positions); otherwise ``generate`` raises
  ``ValueError`` before any model work. There is no sliding window.
- **Prompts**: a str is encoded with the tokenizer's ``encode_prompt``:
  special tokens allowed, so the text ``<|endoftext|>`` is the end-of-text id
  (a prompt of just that starts a fresh story), and ``<s>`` put first for a
  SentencePiece Llama. An empty prompt is an error; a whitespace-only prompt is
  valid text and is used as it is. A prompt may also be a sequence of ids.
- **Randomness**: ``seed`` is an int or a ``np.random.Generator``; one uniform
  number is drawn per sampled token (none when greedy). In a batch, row b uses
  ``np.random.default_rng(seed + b)`` (or the b-th of a list of seeds or
  generators), so row b of a batch draws the same uniform numbers as
  ``generate(prompts[b], seed=seed + b)``. Its tokens are the same up to
  float32 rounding: padded and unpadded forwards sum in different orders, so
  their probabilities differ by ~1e-6, and a draw that lands that close to the
  boundary between two ids (about 1 token in 4,000 here) picks the other one.
  Greedy decoding differs only where two logits are that close.
- **Errors**: every bad parameter raises ``ValueError``, in one line, before any
  model work: a :class:`~glassllm.checks.ParameterError` that names the parameter
  (``.param``), or for a wrong type a :class:`~glassllm.checks.ParameterTypeError`,
  which is both a ``ValueError`` and a ``TypeError``.

Two ways to run the model, tested equal to float32 rounding (the same caveat
for sampled tokens): the model's own forward (``model(tokens, cache)``, whose
snapshots an attached tracer sees) and the lean decoder, a kernel
(:mod:`glassllm.kernels.decode`). ``fast=None`` asks the kernel dispatcher
before every step, which picks the lean one unless a tracer is attached or
kernels are switched off (``glassllm.kernels.disabled()``), so tracing always
sees the real forward.
A batch costs as its longest prompt: every row is padded to it, so group
prompts of similar lengths.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from . import kernels
from .autograd import no_grad
from .checks import ParameterError, ParameterTypeError, check_int, is_int
from .nn import Transformer
from .sampling import check_temperature, check_top_k, check_top_p, model_probs, sample, sampling_distribution
from .tokenizers import TextTokenizer

__all__ = ["Token", "generate", "generate_batch", "generate_text", "prompt_ids"]


@dataclass(frozen=True)
class Token:
    """One generated token.

    ``id``        the token id.
    ``piece``     its readable text (the tokenizer's ``piece``; ``""`` without a tokenizer).
    ``text``      what it adds to the decoded text: a token that ends inside a
                  multi-byte character adds ``""`` and the next one adds the
                  whole character; ``""`` for ``<|endoftext|>``. A row's last
                  token also flushes a character left incomplete, as U+FFFD, so
                  the texts of a row join to ``tokenizer.decode`` of its ids
                  (without the end-of-text token).
    ``prob``      the model's own probability of this id, ``softmax(logits)`` over
                  all V ids at T = 1 with no filters.
    ``p_sampled`` its probability in the distribution it was actually drawn from
                  (after temperature, top-k, top-p; 1.0 when greedy).
    ``step``      0 for the first new token.
    ``n``, ``start``, ``m``  the forward pass whose last logits gave this token:
                  n new queries at positions start .. start+n-1 reading m = start + n keys.
    ``row``       which prompt of a batch (0 for a single prompt).
    ``top``       the most likely ids under the model, ((id, prob), ...), best first
                  (as many as ``alternatives`` asked for).
    ``finish``    on a row's last token: ``"eot"``, ``"stop"`` or ``"length"``; else None.
    """

    id: int
    piece: str
    text: str
    prob: float
    p_sampled: float
    step: int
    n: int
    start: int
    m: int
    row: int = 0
    top: tuple[tuple[int, float], ...] = ()
    finish: str | None = None


# ----------------------------------------------------------------------------
# Validation (all of it happens before any model work)
# ----------------------------------------------------------------------------

def prompt_ids(prompt, model: Transformer, tokenizer, where: str = "prompt") -> list[int]:
    """The token ids the model reads for ``prompt``: a str encoded with ``tokenizer.encode_prompt``, or ids, checked.

    One rule for every place that takes a prompt (see the module docstring, "Prompts"); a bad prompt raises
    a :class:`~glassllm.checks.ParameterError` naming ``where``.
    """
    V = model.config.vocab_size
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ParameterError(where, "is text but no tokenizer was given; pass a tokenizer or token ids")
        if prompt == "":
            raise ParameterError(where, "is empty: give at least one character (or token id)")
        return list(tokenizer.encode_prompt(prompt))
    if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, (Sequence, np.ndarray)):
        raise ParameterTypeError(where, f"must be a str or a sequence of token ids, got {type(prompt).__name__}")
    arr = np.asarray(prompt)
    if arr.ndim != 1:
        raise ParameterError(where, f"token ids must be a flat sequence, got shape {arr.shape}")
    if arr.size == 0:
        raise ParameterError(where, "is empty: give at least one token id")
    booleans = [i for i in prompt if isinstance(i, (bool, np.bool_))]
    if booleans:
        raise ParameterTypeError(where, f"token ids must be ints, got the bool {booleans[0]!r}")
    if arr.dtype.kind not in "iu":
        raise ParameterTypeError(where, f"token ids must be ints, got {arr.dtype} values")
    bad = (arr < 0) | (arr >= V)
    if bad.any():
        raise ParameterError(where, f"token id {arr[bad][0]} is out of range [0, {V})")
    return [int(i) for i in arr]


def _check_stop(stop, tokenizer) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)):
        raise ParameterTypeError("stop", f"must be a str or a list of str, got {type(stop).__name__}")
    for s in stops:
        if not isinstance(s, str):
            raise ParameterTypeError("stop", f"strings must be str, got {s!r}")
        if s == "":
            raise ParameterError("stop", "string is empty: every text contains it")
    if stops and tokenizer is None:
        raise ParameterError("stop", "strings need a tokenizer to turn tokens into text")
    return tuple(stops)


def _check_seeds(seed, batch: int) -> list[np.random.Generator]:
    if isinstance(seed, np.random.Generator):
        return [seed] * batch  # one shared stream, drawn row by row
    if is_int(seed):
        if seed < 0:
            raise ParameterError("seed", f"must be >= 0, got {seed!r}",
                                 api_problem=f"must be an int >= 0 or a numpy Generator, got {seed!r}")
        return [np.random.default_rng(int(seed) + b) for b in range(batch)]
    if isinstance(seed, (list, tuple)) and len(seed) == batch:
        return [_check_seeds(s, 1)[0] for s in seed]
    many = f", or a list of {batch} of them (one per prompt)" if batch > 1 else ""
    raise ParameterTypeError("seed", f"must be an int >= 0 or a numpy Generator{many}, got {seed!r}")


# ----------------------------------------------------------------------------
# The API
# ----------------------------------------------------------------------------

def generate(model: Transformer, tokenizer, prompt, max_new_tokens: int = 128, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed=0, stop=None,
             alternatives: int = 0, fast: bool | None = None) -> Iterator[Token]:
    """Continue ``prompt`` token by token, yielding a :class:`Token` as each is drawn.

    model: a :class:`~glassllm.nn.Transformer`; tokenizer: its
    tokenizer (:class:`~glassllm.tokenizers.base.TextTokenizer`), or None when ``prompt`` is ids (then
    records have no text and ``<|endoftext|>`` does not stop generation).
    prompt: a str or a sequence of ids. ``seed``: an int or a ``np.random.Generator``.
    ``alternatives``: how many of the model's most likely ids to attach to each
    record as ``top``. ``fast``: None = the lean decoder when the kernel
    dispatcher allows it (no tracer attached, kernels on); False = always the
    model's forward; True = the lean decoder (an error if a tracer is attached). Policies: see the module docstring.

    Every parameter is checked here, eagerly: a bad one raises ``ValueError``
    at the call, before any model work -- not at the first ``next()``.

    >>> from glassllm.nn import Transformer
    >>> model = Transformer(seed=0)
    >>> [(t.step, t.n, t.start, t.m) for t in generate(model, None, [5, 6, 7], max_new_tokens=3)]
    [(0, 3, 0, 3), (1, 1, 3, 4), (2, 1, 4, 5)]
    """
    return generate_batch(model, tokenizer, [prompt], max_new_tokens, temperature, top_k, top_p,
                          [seed] if not isinstance(seed, np.random.Generator) else seed,
                          stop, alternatives, fast, _where="prompt")


def generate_text(model: Transformer, tokenizer, prompt: str, **kwargs) -> str:
    """The generated text only (not the prompt), as one str; keywords as for :func:`generate`."""
    return "".join(t.text for t in generate(model, tokenizer, prompt, **kwargs))


def generate_batch(model: Transformer, tokenizer, prompts, max_new_tokens: int = 128, temperature: float = 1.0,
                   top_k: int | None = None, top_p: float | None = None, seed=0, stop=None,
                   alternatives: int = 0, fast: bool | None = None, _where: str | None = None
                   ) -> Iterator[Token]:
    """Decode several prompts of different lengths together, in one batch.

    Prompts are left-padded to the longest (the cache masks the padding and
    counts each row's positions from its first real token), so row b's tokens
    equal ``generate(prompts[b], seed=seed + b)`` up to float32 rounding (see
    the module docstring: rarely, a sampled token differs). Yields the records of each
    step in row order; a finished row yields nothing more. Row b's records
    report its own ``n``, ``start`` and ``m``, without the padding.
    """
    if not isinstance(model, Transformer):
        raise ParameterTypeError("model", f"must be a glassllm Transformer, got {type(model).__name__}")
    V = model.config.vocab_size
    if tokenizer is not None and not isinstance(tokenizer, TextTokenizer):
        raise ParameterTypeError("tokenizer", f"must be a glassllm tokenizer (Tokenizer, SPTokenizer) or None, "
                                 f"got {type(tokenizer).__name__}")
    if tokenizer is not None and tokenizer.vocab_size != V:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but the model expects {V}")
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)) or not prompts:
        raise ParameterError("prompts", f"must be a non-empty list of prompts, got {prompts!r:.60}")
    ids = [prompt_ids(p, model, tokenizer, _where or f"prompt {b}") for b, p in enumerate(prompts)]
    max_new = check_int("max_new_tokens", max_new_tokens, low=1)
    t = check_temperature(temperature)
    k = check_top_k(top_k, V)
    p = check_top_p(top_p)
    stops = _check_stop(stop, tokenizer)
    rngs = _check_seeds(seed, len(ids))
    alternatives = check_int("alternatives", alternatives, low=0, high=V)
    if fast is not None and not isinstance(fast, bool):
        raise ParameterTypeError("fast", f"must be True, False or None, got {fast!r}")
    if fast and model.tracer is not None:
        raise ValueError("fast=True skips the snapshots, but a tracer is attached; use fast=None or False")
    longest, ctx = max(len(x) for x in ids), model.config.max_seq_len
    if longest >= ctx:
        which = "the prompt" if len(ids) == 1 else "the longest prompt"
        raise ValueError(f"{which} ({longest} tokens) leaves no room in the context of {ctx} positions; "
                         f"shorten it to at most {ctx - 1} tokens")
    if longest + max_new > ctx:
        which = "the prompt" if len(ids) == 1 else "the longest prompt"
        raise ValueError(f"{which} ({longest} token{'s' * (longest != 1)}) plus max_new_tokens={max_new} "
                         f"exceeds the context of "
                         f"{ctx} positions; shorten the prompt or ask for at most {max(ctx - longest, 0)} tokens")
    return _decode(model, tokenizer, ids, max_new, t, k, p, stops, rngs, alternatives, fast)


# ----------------------------------------------------------------------------
# The decoding loop
# ----------------------------------------------------------------------------

def _decode(model, tokenizer, ids, max_new, temperature, top_k, top_p, stops, rngs, alternatives, fast
            ) -> Iterator[Token]:
    B = len(ids)
    lengths = np.array([len(x) for x in ids])
    longest = int(lengths.max())
    pad = longest - lengths                                              # (B,) left padding per row
    tokens = np.zeros((B, longest), dtype=np.int64)                      # (B, n); padding uses id 0
    for b, row in enumerate(ids):
        tokens[b, pad[b]:] = row
    cache = model.new_cache(B, pad=pad if pad.any() else None)
    lean = None                                                          # built on first use
    ends = frozenset(tokenizer.end_ids) if tokenizer is not None else frozenset()
    last = [int(row[-1]) for row in ids]                                 # the id each row's next token follows
    utf8 = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in range(B)]
    texts = [""] * B
    alive = [True] * B                                                   # a list: B is small, and this runs per token

    for step in range(max_new):
        start = cache.start
        n = tokens.shape[1]
        if kernels.lean_decoding(model) if fast is None else (fast and model.tracer is None):
            if lean is None:
                lean = kernels.FastDecoder(model)
            logits = lean(tokens, cache)                                 # (B, V) last position
        else:
            with no_grad():
                logits = model(tokens, cache).data[:, -1]                # (B, V)
        probs = model_probs(logits)                                      # (B, V) the model's own
        if temperature == 0.0:
            chosen = logits.argmax(axis=-1)                              # (B,)
            drawn_p = [1.0] * B
        else:
            if temperature == 1.0 and top_k is None and top_p in (None, 1.0):
                dist = probs                                             # nothing to change
            else:
                dist = sampling_distribution(logits, temperature, top_k, top_p)  # (B, V)
            chosen = np.array([sample(dist[b], rngs[b]) if alive[b] else 0 for b in range(B)])
            drawn_p = dist[np.arange(B), chosen]

        for b in [b for b in range(B) if alive[b]]:
            i = int(chosen[b])
            finish = None
            if i in ends:
                text, finish = "", "eot"
            else:
                text = utf8[b].decode(tokenizer.token_bytes(i, last[b])) if tokenizer is not None else ""
                last[b] = i
                before = len(texts[b])
                texts[b] += text
                if stops and _hit(texts[b], before, stops):
                    finish = "stop"
            if finish is None and step == max_new - 1:
                finish = "length"
            if finish is not None and tokenizer is not None:
                text += utf8[b].decode(b"", final=True)                 # a dangling partial character -> U+FFFD
            row_start = start - int(pad[b]) if step else 0
            row_n = n if step else int(lengths[b])
            yield Token(
                id=i, piece=tokenizer.piece(i) if tokenizer is not None else "", text=text,
                prob=float(probs[b, i]), p_sampled=float(drawn_p[b]), step=step,
                n=row_n, start=row_start, m=row_start + row_n, row=int(b),
                top=_top(probs[b], alternatives) if alternatives else (), finish=finish,
            )
            if finish is not None:
                alive[b] = False
        if not any(alive):
            return
        tokens = chosen[:, None].astype(np.int64)                        # (B, 1) fed back; dead rows ride along


def _hit(text: str, before: int, stops: tuple[str, ...]) -> bool:
    """Does ``text`` contain a stop string that ends in its part after ``before``?"""
    return any(s in text[max(0, before - len(s) + 1):] for s in stops)


def _top(probs: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
    """The k most likely ids with their probabilities: by probability, ties to the lower id."""
    best = np.argsort(-probs, kind="stable")[:k]                        # stable: equal probs keep id order
    return tuple((int(i), float(probs[i])) for i in best)
