"""Reading the residual stream in vocabulary space: the logit lens, its decomposition, direct logit attribution.

The residual stream entering the final norm is a sum of parts: the token
embedding, every head's output (``attn.head_out``: its slice of ``mix``
through its slice of W_O) and every MLP's output. Three views of it:

* :func:`logit_lens` -- the stream as it stands before each layer (and after
  the last), pushed through the final RMSNorm and the output matrix as if the
  model ended there: (L + 1, n, V) logits. The last row is the model's logits.
* :func:`decompose` -- the parts themselves, (1 + L*H + L, n, C); they sum to
  the stream the final norm reads.
* :func:`logit_attrs` -- each part's *direct* effect on one logit (or a
  difference of two): the part divided by the final norm's root mean square
  at its position -- the scale frozen at its value in this run, which makes
  the map linear -- times the norm's gain, dotted with the token's row of the
  output matrix. The parts' attributions sum to the logit (difference)
  itself. This is TransformerLens' ``cache.logit_attrs`` on its
  ``decompose_resid`` / ``stack_head_results`` stack, with the final norm's
  gain folded into W_U.

Each function runs one traced forward (no gradients) of a single sequence
and returns a :class:`~glassllm.trace.labelled.Labelled` array.
"""

from __future__ import annotations

import numpy as np

from .. import autograd as ag
from ..checks import ParameterError, is_int, shown
from .labelled import Labelled
from .tracer import trace


def _run(model, tokens, names, interventions, batch: int = 0):
    with ag.no_grad():
        return trace(model, tokens, names=names, batch=batch, interventions=interventions)


def _position_labels(tokens, n: int, tokenizer) -> list:
    if tokenizer is None:
        return list(range(n))
    from .tokens import to_str_tokens

    return to_str_tokens(tokenizer, np.asarray(tokens).reshape(-1, n)[0])


def _unembed(model, x: np.ndarray) -> np.ndarray:
    """The final RMSNorm and the output matrix applied to residual vectors x (..., C): logits (..., V)."""
    norm = model.norm
    rms = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + norm.eps)   # (..., 1)
    return (x / rms * norm.weight.data) @ model.output.weight.data.T   # (..., V)


def logit_lens(model, tokens, *, interventions=(), tokenizer=None, batch: int = 0) -> Labelled:
    """The logits each residual stream would give through the final norm and the output matrix.

    Rows: ``layers.{i}.resid_pre`` for every layer (row 0 is the embedding),
    then the last layer's ``resid_post``: (L + 1, n, V), axes ``stream``,
    ``position``, ``token``. Each row is normalised with its own root mean
    square, as the final norm would (TransformerLens'
    ``accumulated_resid(apply_ln=True) @ W_U``). ``tokenizer`` labels the
    positions with token pieces.

    >>> from glassllm.nn import Transformer
    >>> lens = logit_lens(Transformer(seed=0), [5, 6, 7])
    >>> lens.shape, lens.labels[0]
    ((5, 3, 1024), ['layers.0.resid_pre', 'layers.1.resid_pre', 'layers.2.resid_pre', 'layers.3.resid_pre', \
'layers.3.resid_post'])
    """
    L = model.config.n_layers
    names = [f"layers.{i}.resid_pre" for i in range(L)] + [f"layers.{L - 1}.resid_post"]
    t = _run(model, tokens, names, interventions, batch)
    stack = np.stack([t.get(k) for k in names])                        # (L+1, n, C)
    n = stack.shape[1]
    return Labelled(_unembed(model, stack), ("stream", "position", "token"),
                    [names, _position_labels(t.tokens, n, tokenizer), range(model.config.vocab_size)],
                    "logit lens")


def component_labels(config) -> list[str]:
    """The parts of the residual stream, in forward order: ``embed``, ``L0H0`` .. ``L0H{H-1}``, ``L0 MLP``, ..."""
    out = ["embed"]
    for i in range(config.n_layers):
        out += [f"L{i}H{h}" for h in range(config.n_heads)] + [f"L{i} MLP"]
    return out


def _parts(model, tokens, interventions, batch):
    """(labels, parts (K, n, C), the final norm's rms (n,), logits (n, V), trace)."""
    L = model.config.n_layers
    names = (["embed", "norm.rms", "logits"] + [f"layers.{i}.attn.head_out" for i in range(L)]
             + [f"layers.{i}.mlp.out" for i in range(L)])
    t = _run(model, tokens, names, interventions, batch)
    parts = [t.get("embed")[None]]                                     # (1, n, C)
    for i in range(L):
        parts.append(t.get("attn.head_out", layer=i))                  # (H, n, C)
        parts.append(t.get("mlp.out", layer=i)[None])                  # (1, n, C)
    return component_labels(model.config), np.concatenate(parts), t.get("norm.rms"), t.get("logits"), t


def decompose(model, tokens, *, interventions=(), tokenizer=None, batch: int = 0) -> Labelled:
    """The residual stream entering the final norm, as the sum of its parts: (K, n, C), K = 1 + L*(H + 1).

    Parts (axis ``component``): the embedding, each head's ``attn.head_out``
    and each MLP's ``mlp.out``, in forward order (:func:`component_labels`).
    Their sum over the first axis is ``norm.in``.
    """
    labels, parts, _, _, t = _parts(model, tokens, interventions, batch)
    return Labelled(parts, ("component", "position", "feature"),
                    [labels, _position_labels(t.tokens, parts.shape[1], tokenizer), range(parts.shape[2])],
                    "residual stream parts")


def _token_ids(ids, n: int, V: int, what: str) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu" or arr.ndim > 1:
        raise TypeError(f"{what} must be a token id or one id per position, got {ids!r}")
    if arr.ndim == 1 and arr.shape != (n,):
        raise ValueError(f"{what} gives {arr.shape[0]} ids for {n} positions: give one id, or one per position")
    if np.any((arr < 0) | (arr >= V)):
        raise ValueError(f"{what} id {arr[(arr < 0) | (arr >= V)].ravel()[0]} is out of range [0, {V})")
    return np.broadcast_to(arr, (n,))


def logit_attrs(model, tokens, answer, wrong=None, *, interventions=(), tokenizer=None,
                batch: int = 0) -> Labelled:
    """Each part's direct contribution to the logit of ``answer`` (minus that of ``wrong``): (K, n).

    ``answer``/``wrong``: one token id, or one per position (n,). Part c at
    position p contributes ``(c / rms_p) * g . (W_U[answer] - W_U[wrong])``
    where ``rms_p`` is the final norm's root mean square at p in this run
    (frozen) and ``g`` its gain; the parts sum to ``logits[p, answer] -
    logits[p, wrong]`` (TransformerLens' ``logit_attrs`` with the final norm
    folded into W_U). ``baseline["total"]`` holds that sum per position.

    >>> from glassllm.nn import Transformer
    >>> model = Transformer(seed=0)
    >>> attrs = logit_attrs(model, [5, 6, 7], answer=9, wrong=4)
    >>> attrs.shape, attrs.labels[0][:3]
    ((21, 3), ['embed', 'L0H0', 'L0H1'])
    >>> bool(np.allclose(attrs.values.sum(axis=0), attrs.baseline["total"], atol=1e-5))
    True
    """
    labels, parts, rms, logits, t = _parts(model, tokens, interventions, batch)
    n, V = logits.shape
    direction = model.output.weight.data[_token_ids(answer, n, V, "answer")]             # (n, C)
    if wrong is not None:
        direction = direction - model.output.weight.data[_token_ids(wrong, n, V, "wrong")]  # (n, C)
    direction = direction * model.norm.weight.data                                         # (n, C)
    attrs = np.einsum("knc,nc->kn", parts / rms[None, :, None], direction)                # (K, n)
    rows = np.arange(n)
    total = logits[rows, _token_ids(answer, n, V, "answer")]
    if wrong is not None:
        total = total - logits[rows, _token_ids(wrong, n, V, "wrong")]
    return Labelled(attrs, ("component", "position"), [labels, _position_labels(t.tokens, n, tokenizer)],
                    "direct logit attribution", {"total": total})


def lens_window(positions, n: int, most: int | None = None) -> tuple[int, int]:
    """The window ``positions`` of an ``n``-position prompt as ``(start, stop)``: every position for None,
    else a pair ``[start, stop)`` (or a ``range`` of step 1) with ``0 <= start < stop <= n``, and at most
    ``most`` positions wide when ``most`` is given. Anything else: :class:`~glassllm.checks.ParameterError`
    naming the value and the range expected.

    >>> lens_window(None, 5), lens_window((1, 3), 5), lens_window(range(2, 5), 5)
    ((0, 5), (1, 3), (2, 5))
    """
    if positions is None:
        return 0, n
    if isinstance(positions, range) and positions.step == 1:
        pair = (positions.start, positions.stop)
    elif isinstance(positions, (tuple, list)) and len(positions) == 2:
        pair = tuple(positions)
    else:
        pair = None
    wide = f", at most {most} wide" if most is not None else ""
    expected = f"must be [start, stop) with 0 <= start < stop <= {n} (the prompt's positions){wide}"
    if (pair is None or not all(is_int(p) for p in pair) or not 0 <= pair[0] < pair[1] <= n
            or (most is not None and pair[1] - pair[0] > most)):
        raise ParameterError("positions", f"{expected}, got {shown(positions)}")
    return int(pair[0]), int(pair[1])


def lens_top(model, tokens, *, interventions=(), tokenizer=None, batch: int = 0,
             trace=None, positions=None) -> tuple[Labelled, Labelled]:
    """The logit lens as a table: for every stream and position, its most likely token and that probability.

    Returns ``(ids, probs)``, each (L + 1, w) with axes ``stream``, ``position``
    (the inspector's logit-lens view: one cell per stream and position). ``positions``: the window
    ``[start, stop)`` of positions to compute (:func:`lens_window`; default every position, w = n):
    only those columns are computed, and ``baseline`` holds ``positions`` (start, stop) and ``length``
    (n). Computed a few hundred rows at a time in the model's dtype, so a large vocabulary never makes
    the whole lens.
    ``trace``: a trace of these ``tokens`` under these ``interventions`` that holds the residual streams
    (a :class:`~glassllm.trace.LazyTrace` keeps them), read instead of running the model again.

    >>> from glassllm.nn import Transformer
    >>> ids, probs = lens_top(Transformer(seed=0), [5, 6, 7])
    >>> ids.shape, bool(((0 < np.asarray(probs)) & (np.asarray(probs) <= 1)).all())
    ((5, 3), True)
    >>> lens_top(Transformer(seed=0), [5, 6, 7], positions=(1, 3))[0].shape
    (5, 2)
    """
    L = model.config.n_layers
    names = [f"layers.{i}.resid_pre" for i in range(L)] + [f"layers.{L - 1}.resid_post"]
    if trace is None:
        lens_window(positions, np.shape(tokens)[-1])                   # a bad window: refused before the forward
    t = _run(model, tokens, names, interventions, batch) if trace is None else trace
    n = t.get(names[0]).shape[0]
    start, stop = lens_window(positions, n)
    w = stop - start
    # Every stream's rows of the window, one after another: (S*w, C), S = L + 1 streams.
    x = np.concatenate([t.get(k)[start:stop] for k in names])         # (S*w, C)
    top = np.empty(len(x), dtype=np.int64)
    prob = np.empty(len(x), dtype=np.float64)
    # Up to 64 MB of logits at a time, in the model's dtype: never the (L+1, n, V) lens itself, and
    # rows enough for the output GEMM to run at full speed.
    rows = max(1, (64 << 20) // (4 * model.config.vocab_size))
    for lo in range(0, len(x), rows):
        logits = _unembed(model, x[lo:lo + rows])                      # (r, V)
        best = logits.argmax(axis=-1)                                  # (r,)
        top[lo:lo + rows] = best
        peak = logits[np.arange(len(best)), best]                      # (r,) the row maxima
        prob[lo:lo + rows] = np.exp(peak - ag.logsumexp_np(logits, axis=-1))  # p of the top
    dims = ("stream", "position")
    labels = [names, _position_labels(t.tokens, n, tokenizer)[start:stop]]
    held = {"positions": (start, stop), "length": n}
    return (Labelled(top.reshape(L + 1, w), dims, labels, "logit lens: top token", held),   # (S, w)
            Labelled(prob.reshape(L + 1, w), dims, labels, "logit lens: its probability", held))


def direct_attribution(model, tokens, position: int = -1, token=None, *, interventions=(), batch: int = 0) -> Labelled:
    """Each head's and MLP's direct contribution to one logit at one position: (K,), axis ``component``.

    ``token``: the next token to explain (default: the model's most likely one
    at ``position``). The parts sum to that logit (``baseline["total"]``);
    ``baseline["token"]`` is the token. (The inspector's attribution view.)
    """
    labels, parts, rms, logits, _ = _parts(model, tokens, interventions, batch)
    n, V = logits.shape
    if not is_int(position) or not -n <= position < n:
        raise ParameterError("position", f"={position!r} is out of range: the prompt has positions 0..{n - 1}")
    token = int(logits[position].argmax()) if token is None else int(_token_ids(token, n, V, "token")[0])
    direction = model.output.weight.data[token] * model.norm.weight.data   # (C,)
    values = parts[:, position] / rms[position] @ direction                 # (K,)
    return Labelled(values, ("component",), [labels], "direct logit attribution",
                    {"total": float(logits[position, token]), "token": token, "position": int(position) % n})
