"""The checks behind ``glassllm check``: a student's function against glassllm's own code.

Each ``check_<exercise>(f)`` calls the student's function ``f`` on a fixed list
of cases -- random inputs from a seeded generator and the edge cases that
catch real mistakes (a fully masked row, scores near 1e4, ``start > 0``,
float32 next to float64, a single position, more keys than queries) -- and
compares each answer with what glassllm computes on the same input. The first
wrong answer raises :class:`Wrong` with one or two plain lines: what is wrong,
and on which input. Where the answer matches a typical mistake (no shift, the
split-halves RoPE layout, the diagonal masked) the message names that mistake.
"""

from __future__ import annotations

import numpy as np

from .. import autograd as ag
from ..ops import attention, rms_norm
from ..nn import Rotary, causal_mask

SEED = 0


class Wrong(Exception):
    """The student's answer is wrong; the message says how, in one or two lines."""


def _fmt(x) -> str:
    return np.format_float_positional(float(x), precision=4, unique=True, fractional=False, trim="-") \
        if np.isfinite(x) and 1e-4 <= abs(x) < 1e6 or x == 0 else f"{float(x):.4g}"


def _arr(x) -> str:
    """An input as its shape and dtype: ``(3, 5) float32``."""
    return f"{tuple(x.shape)} {x.dtype}"


def _tol(dtype) -> float:
    return 2e-5 if np.dtype(dtype) == np.float32 else 1e-9


def raised(e: BaseException) -> str:
    """An exception from the student's code in words: ``ZeroDivisionError: division by zero``,
    ``SystemExit(0): sys.exit was called``, or its name alone when it has no message (``GeneratorExit``)."""
    if isinstance(e, SystemExit):
        return f"SystemExit({e.code!r}): sys.exit was called"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _call(f, name: str, args: tuple, on: str):
    """``f(*args)`` as a NumPy array; any exception (sys.exit too, but not Ctrl-C) or non-array answer
    is a Wrong."""
    try:
        out = f(*args)
    except NotImplementedError:
        raise Wrong(f"{name.split('(')[0]} is not written yet: it raises NotImplementedError") from None
    except KeyboardInterrupt:                 # Ctrl-C stops the check, as it stops every command
        raise
    except BaseException as e:                # the student's code failed: say how, on which input
        raise Wrong(f"{name} raised {raised(e)}\n  on: {on}") from None
    if not isinstance(out, np.ndarray):
        raise Wrong(f"{name} returned {type(out).__name__}, expected a NumPy array\n  on: {on}")
    return out


def _same_form(out: np.ndarray, shape: tuple, dtype, name: str, on: str, what: str) -> None:
    """The answer's shape and dtype are the expected ones."""
    if out.shape != tuple(shape):
        raise Wrong(f"{name} returned shape {out.shape}, expected {what} = {tuple(shape)}\n  on: {on}")
    if out.dtype != np.dtype(dtype):
        hint = " (the input's dtype)"
        if out.dtype == np.float64 and np.dtype(dtype) == np.float32:
            hint = ("; a NumPy float64 such as np.sqrt(D) turns float32 into float64: cast the result to "
                    "the input's dtype")
        raise Wrong(f"{name} returned dtype {out.dtype}, expected {np.dtype(dtype)}{hint}\n  on: {on}")


def _close(a, b, dtype) -> bool:
    with np.errstate(all="ignore"):
        return a.shape == b.shape and bool(np.all(np.isfinite(a))) and \
            np.allclose(a, b, rtol=_tol(dtype), atol=_tol(dtype))


def _match_mistake(out, ref, dtype, mistakes, on: str) -> None:
    """If ``out`` equals one of the typical wrong answers (and that one differs from ``ref``), name it."""
    for wrong_out, message in mistakes:
        wrong_out = np.asarray(wrong_out)
        if not _close(wrong_out, ref, dtype) and _close(out.astype(np.float64), wrong_out.astype(np.float64), dtype):
            raise Wrong(f"{message}\n  on: {on}")


def _row_off(sums: np.ndarray, want: float, dtype, live=True) -> int | None:
    """The first row (among the ``live`` ones) whose sum is not ``want`` to 10 rounding tolerances, or None."""
    off = live & ~np.isclose(sums, want, rtol=0, atol=10 * _tol(dtype))
    return int(np.argmax(off)) if off.any() else None


def _first_difference(out, ref, dtype, name: str, on: str) -> None:
    """The first entry (in row order) where ``out`` and glassllm's ``ref`` differ."""
    bad = ~np.isclose(out, ref, rtol=_tol(dtype), atol=_tol(dtype))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise Wrong(f"{name} differs from glassllm's at index {where}: expected {ref[where]:.8g}, "
                    f"got {out[where]:.8g}\n  on: {on}")


# ----------------------------------------------------------------------------
# softmax
# ----------------------------------------------------------------------------

def _softmax_cases():
    rng = np.random.default_rng(SEED)
    masked = rng.normal(size=(4, 5)) * 2
    masked[np.triu_indices(4, 1, 5)] = -np.inf          # a causal pattern ...
    masked[3] = -np.inf                                   # ... and a row with every key forbidden
    return [
        ("random scores", rng.normal(size=(4, 6)) * 3),
        ("random scores", rng.normal(size=(3, 5)).astype(np.float32) * 3),
        ("one score", np.array([[0.7]])),
        ("heads and queries", rng.normal(size=(2, 3, 4)) * 3),
        ("large scores, near 1e4 and -1e4", np.array([[1e4, 1e4 - 1, 1e4 - 3, 0.0],
                                                      [-1e4, -1e4 + 2, -1e4 + 1, -1e4 - 5]])),
        ("large scores, float32", np.array([[1e4, 9999.0, 9990.0]], dtype=np.float32)),
        ("masked scores (-inf), the last row fully masked", masked),
    ]


def check_softmax(f) -> int:
    cases = _softmax_cases()
    for what, x in cases:
        on = f"x {_arr(x)}, {what}"
        out = _call(f, "softmax", (x.copy(),), on)
        ref = ag.softmax_np(x)
        _same_form(out, x.shape, x.dtype, "softmax", on, "the shape of x")
        rows_in, rows_out = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])   # (rows, m) each
        for r, (row_in, row_out) in enumerate(zip(rows_in, rows_out)):
            if np.all(np.isfinite(row_out)):
                continue
            if np.all(np.isneginf(row_in)):
                raise Wrong(f"row {r} is all -inf (every key forbidden): expected all zeros, got "
                            f"{_fmt(row_out[~np.isfinite(row_out)][0])}; a fully masked row has no "
                            f"distribution, return zeros for it\n  on: {on}")
            peak = row_in[np.isfinite(row_in)].max()
            if abs(peak) > 80:
                side = "overflowed" if peak > 0 else "underflowed to 0 in the whole row"
                raise Wrong(f"row {r} (scores up to {_fmt(peak)}) gives {_fmt(row_out[~np.isfinite(row_out)][0])}: "
                            f"exp {side}; subtract each row's own maximum before exp\n  on: {on}")
            raise Wrong(f"row {r} contains {_fmt(row_out[~np.isfinite(row_out)][0])}\n  on: {on}")
        leak = np.isneginf(x) & (out != 0)
        if leak.any():
            where = tuple(int(i) for i in np.argwhere(leak)[0])
            raise Wrong(f"x{list(where)} is -inf (forbidden) but has weight {_fmt(out[where])}; "
                        f"it must be exactly 0\n  on: {on}")
        sums = rows_out.sum(axis=-1)
        r = _row_off(sums, 1.0, x.dtype, live=~np.all(np.isneginf(rows_in), axis=-1))
        if r is not None:
            raise Wrong(f"row {r} sums to {_fmt(sums[r])}, not 1: normalise each row over the last axis "
                        f"(the keys)\n  on: {on}")
        _first_difference(out, ref, x.dtype, "softmax", on)
    return len(cases)


# ----------------------------------------------------------------------------
# causal_mask
# ----------------------------------------------------------------------------

CAUSAL_CASES = [(3, 3, 0), (1, 1, 0), (4, 4, 0), (2, 5, 3), (4, 6, 2), (1, 7, 6)]


def check_causal_mask(f) -> int:
    for n, m, start in CAUSAL_CASES:
        call = f"causal_mask({n}, {m}, {start})"
        on = f"n={n} new queries, m={m} keys, start={start}"
        out = _call(f, call, (n, m, start), on)
        ref = causal_mask(n, m, start)
        if out.shape != (n, m):
            raise Wrong(f"{call} returned shape {out.shape}, expected (n, m) = {(n, m)}: one row per "
                        f"new query, one column per key\n  on: {on}")
        if out.dtype != np.bool_:
            raise Wrong(f"{call} returned dtype {out.dtype}, expected bool (True = forbidden)\n  on: {on}")
        if np.array_equal(out, ref):
            continue
        if np.array_equal(out, ~ref):
            raise Wrong(f"{call}: the mask is inverted; True must mark the forbidden (future) keys, "
                        f"False the ones a query may read\n  on: {on}")
        if start and np.array_equal(out, causal_mask(n, m, 0)):
            raise Wrong(f"{call} ignores start: query i sits at position start + i = {start} + i, so it "
                        f"may read keys 0 .. start + i\n  on: {on}")
        leak = ref & ~out
        if leak.any():
            i, j = (int(v) for v in np.argwhere(leak)[0])
            raise Wrong(f"{call}[{i}, {j}] is False, so query {i} (position {start + i}) may read key {j}, "
                        f"which is in its future: the masked cell leaks\n  on: {on}")
        i, j = (int(v) for v in np.argwhere(out & ~ref)[0])
        extra = np.argwhere(out & ~ref)
        if all(c == start + r for r, c in extra):
            raise Wrong(f"{call}[{i}, {j}] is True, but key {j} is query {i}'s own position: a query reads "
                        f"itself (off by one: forbid j > start + i, not j >= start + i)\n  on: {on}")
        raise Wrong(f"{call}[{i}, {j}] is True, but key {j} is in the past of query {i} (position "
                    f"{start + i}): it must be allowed\n  on: {on}")
    return len(CAUSAL_CASES)


# ----------------------------------------------------------------------------
# attention_head
# ----------------------------------------------------------------------------

def _head_cases():
    rng = np.random.default_rng(SEED + 1)

    def qkv(n, m, D, dtype=np.float64, scale=1.0):
        return tuple((rng.normal(size=shape) * s).astype(dtype)
                     for shape, s in (((n, D), scale), ((m, D), scale), ((m, D), 1.0)))
    return [
        ("random, n = m", qkv(3, 3, 4)),
        ("one position", qkv(1, 1, 2)),
        ("more keys than queries (start = m - n = 3)", qkv(2, 5, 4)),
        ("one new query after 5 cached keys (start = 5)", qkv(1, 6, 4)),
        ("large scores, in the thousands", qkv(3, 3, 4, scale=70.0)),
        ("float32", qkv(4, 4, 8, np.float32)),
    ]


def _head_variants(q, k, v):
    """Typical wrong answers on (q, k, v), each with the message that names it."""
    n, D = q.shape
    m = k.shape[0]
    s = q @ k.T                                                          # (n, m)
    allowed = ~causal_mask(n, m, m - n)                                  # (n, m)

    def masked_softmax(scores, mask, axis=-1):
        return ag.softmax_np(np.where(mask, scores, -np.inf), axis)

    out = [  # each answer (n, m) @ (m, D) = (n, D)
        (masked_softmax(s, allowed) @ v, "the scores are not divided by sqrt(D): use q @ k.T / sqrt(D)"),
        (masked_softmax(s / D, allowed) @ v, "the scores are divided by D; divide by sqrt(D)"),
        (ag.softmax_np(s / np.sqrt(D)) @ v, "no causal mask: every query reads future keys too"),
        (np.nan_to_num(masked_softmax(s / np.sqrt(D), allowed, axis=0)) @ v,
         "the softmax runs over the queries (axis 0); each query's row of weights, over the keys, must sum to 1"),
        ((ag.softmax_np(s / np.sqrt(D)) * allowed) @ v,
         "the future weights are zeroed after the softmax, so rows no longer sum to 1; set the forbidden "
         "scores to -inf before the softmax"),
    ]
    if m > n:
        out.append((masked_softmax(s / np.sqrt(D), ~causal_mask(n, m, 0)) @ v,
                    f"the mask ignores start: with n={n} queries and m={m} keys, query i sits at position "
                    f"start + i where start = m - n = {m - n}"))
    return out


def check_attention_head(f) -> int:
    cases = _head_cases()
    for what, (q, k, v) in cases:
        n, D = q.shape
        m = k.shape[0]
        start = m - n
        on = f"q {_arr(q)}, k {_arr(k)}, v {_arr(v)}: {what}"
        out = _call(f, "attention_head", (q.copy(), k.copy(), v.copy()), on)
        ref = attention(q[None, None], k[None, None], v[None, None],
                        causal_mask(n, m, start), 1 / np.sqrt(D)).data[0, 0]      # (n, D)
        _same_form(out, (n, D), q.dtype, "attention_head", on, "(n, D)")
        if not np.all(np.isfinite(out)):
            r = int(np.argwhere(~np.isfinite(out))[0][0])
            peak = np.abs(q @ k.T).max() / np.sqrt(D)                    # of the (n, m) scores
            if peak > 80:
                raise Wrong(f"output row {r} is {_fmt(out[~np.isfinite(out)][0])}: exp overflowed on scores near "
                            f"{_fmt(peak)}; subtract each row's maximum before "
                            f"exp\n  on: {on}")
            raise Wrong(f"output row {r} is {_fmt(out[~np.isfinite(out)][0])}\n  on: {on}")
        if _close(out, ref, q.dtype):
            continue
        q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
        _match_mistake(out, ref, q.dtype, _head_variants(q64, k64, v64), on)
        _leaks(f, q, k, v, out, on)
        _first_difference(out, ref, q.dtype, "attention_head", on)
    return len(cases)


def _leaks(f, q, k, v, out, on: str) -> None:
    """Change each future key and value in turn: the rows that must not see it must not move."""
    n, m = q.shape[0], k.shape[0]
    start = m - n
    for j in range(start + 1, m):
        k2, v2 = k.copy(), v.copy()
        k2[j] += 3.0
        v2[j] += 3.0
        out2 = _call(f, "attention_head", (q.copy(), k2, v2), on)
        blind = start + np.arange(n) < j                                 # the queries before key j
        moved = blind & ~np.all(np.isclose(out2, out, rtol=0, atol=_tol(q.dtype)), axis=-1)
        if moved.any():
            i = int(np.argmax(moved))
            raise Wrong(f"output row {i} changes when key/value {j} changes, but query {i} sits at position "
                        f"{start + i} and key {j} is in its future: the masked cell leaks\n  on: {on}")


# ----------------------------------------------------------------------------
# rope_vector
# ----------------------------------------------------------------------------

ROPE_CASES = [(8, 3, 10000.0, np.float64), (2, 1, 10000.0, np.float64), (16, 0, 10000.0, np.float64),
              (8, 37, 10000.0, np.float32), (32, 100, 500000.0, np.float64)]


def _rope_ref(x, pos, theta):
    rot = Rotary(x.shape[0], pos + 1, theta, dtype=x.dtype)
    return ag.rope(x[None], rot.cos[pos:pos + 1], rot.sin[pos:pos + 1]).data[0]   # (D,)


def _rope_plain(x, pos, theta, halves=False, sign=1.0, exponent=2.0):
    D = x.shape[0]
    angle = sign * pos * theta ** (-exponent * np.arange(D // 2) / D)   # (D/2,)
    cos, sin = np.cos(angle), np.sin(angle)
    x0, x1 = (x[:D // 2], x[D // 2:]) if halves else (x[0::2], x[1::2])
    a, b = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return np.concatenate([a, b]) if halves else np.stack([a, b], axis=-1).reshape(D)   # (D,)


def check_rope_vector(f) -> int:
    rng = np.random.default_rng(SEED + 2)
    for D, pos, theta, dtype in ROPE_CASES:
        x = rng.normal(size=D).astype(dtype)
        call = f"rope_vector(x, pos={pos}, theta={theta:g})"
        on = f"x {_arr(x)}, pos={pos}, theta={theta:g}"
        out = _call(f, call, (x.copy(), pos, theta), on)
        ref = _rope_ref(x, pos, theta)
        _same_form(out, x.shape, x.dtype, "rope_vector", on, "the shape of x")
        if _close(out, ref, dtype):
            continue
        x64 = x.astype(np.float64)
        if pos == 0:
            raise Wrong(f"at position 0 every angle is 0, so RoPE must return x unchanged; {call} changed "
                        f"it\n  on: {on}")
        mistakes = [
            (_rope_plain(x64, pos, theta, halves=True),
             "you paired feature i with feature i + D/2 (split halves, Hugging Face's layout); glassllm "
             "rotates interleaved pairs (x[2i], x[2i+1])"),
            (_rope_plain(x64, pos, theta, sign=-1.0),
             "the pairs turn the wrong way: (x0, x1) becomes (x0 cos - x1 sin, x0 sin + x1 cos)"),
            (_rope_plain(x64, pos - 1, theta), f"off by one: your result is RoPE at position {pos - 1}, not {pos}"),
            (_rope_plain(x64, pos + 1, theta), f"off by one: your result is RoPE at position {pos + 1}, not {pos}"),
            (_rope_plain(x64, pos, theta, exponent=1.0),
             "wrong speeds: pair i turns by pos * theta ** (-2i / D), not theta ** (-i / D)"),
            (_rope_plain(x64, pos, 10000.0), f"theta is ignored: this call passed theta={theta:g}"),
        ]
        _match_mistake(out, ref, dtype, mistakes, on)
        norm_in, norm_out = np.linalg.norm(x64), np.linalg.norm(out.astype(np.float64))
        if not np.isclose(norm_in, norm_out, rtol=10 * _tol(dtype)):
            raise Wrong(f"the result has length {_fmt(norm_out)} but x has {_fmt(norm_in)}: a rotation keeps "
                        f"the length of every pair\n  on: {on}")
        _first_difference(out, ref, dtype, "rope_vector", on)
    return len(ROPE_CASES)


# ----------------------------------------------------------------------------
# rms_norm
# ----------------------------------------------------------------------------

def _rms_cases():
    rng = np.random.default_rng(SEED + 3)
    zero_row = rng.normal(size=(3, 6))
    zero_row[1] = 0.0
    return [
        ("random", rng.normal(size=(3, 8)) * 2 + 0.5, rng.normal(size=8), 1e-5),
        ("one feature", np.array([[-1.5]]), np.array([2.0]), 1e-5),
        ("float32, three axes", (rng.normal(size=(2, 3, 4)) + 1).astype(np.float32),
         rng.normal(size=4).astype(np.float32), 1e-5),
        ("a row of zeros", zero_row, rng.normal(size=6), 1e-5),
        ("small values (eps matters)", rng.normal(size=(2, 5)) * 1e-3 + 1e-3, rng.normal(size=5), 1e-5),
        ("eps = 0.1", rng.normal(size=(2, 4)), rng.normal(size=4), 0.1),
    ]


def check_rms_norm(f) -> int:
    cases = _rms_cases()
    for what, x, w, eps in cases:
        on = f"x {_arr(x)}, weight {_arr(w)}, eps={eps:g}: {what}"
        out = _call(f, "rms_norm", (x.copy(), w.copy(), eps), on)
        ref = rms_norm(x, w, eps).data
        _same_form(out, x.shape, x.dtype, "rms_norm", on, "the shape of x")
        if not np.all(np.isfinite(out)):
            rows_x, rows_out = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])   # (rows, C) each
            r = int(np.argwhere(~np.isfinite(rows_out))[0][0])
            if not np.any(rows_x[r]):
                raise Wrong(f"row {r} is all zeros and gives {_fmt(out[~np.isfinite(out)][0])}: mean(x**2) is 0 there; "
                            f"add eps inside the square root, sqrt(mean(x**2) + eps)\n  on: {on}")
            raise Wrong(f"row {r} contains {_fmt(out[~np.isfinite(out)][0])}\n  on: {on}")
        if _close(out, ref, x.dtype):
            continue
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        ms = np.mean(x64 * x64, axis=-1, keepdims=True)
        centred = x64 - x64.mean(axis=-1, keepdims=True)
        mistakes = [
            (centred / np.sqrt(np.mean(centred ** 2, axis=-1, keepdims=True) + eps) * w64,
             "you subtracted the mean (that is LayerNorm); RMSNorm divides x by sqrt(mean(x**2) + eps) "
             "without centring it"),
            (x64 / np.sqrt(ms) * w64, "eps is missing: divide by sqrt(mean(x**2) + eps); without it an "
                                      "all-zero row divides 0 by 0"),
            (x64 / np.sqrt(ms + eps), "the weight is not applied: multiply by weight after dividing"),
            (x64 / np.sqrt(np.sum(x64 * x64, axis=-1, keepdims=True) + eps) * w64,
             "you divided by sqrt(sum(x**2)); RMSNorm uses the mean over the features, sqrt(mean(x**2) + eps)"),
            (x64 / (np.sqrt(ms) + eps) * w64, "eps is added after the square root; it goes inside: "
                                              "sqrt(mean(x**2) + eps)"),
            (x64 / (ms + eps) * w64, "no square root: divide by sqrt(mean(x**2) + eps), the root mean square"),
            (x64 / np.sqrt(ms + 1e-5) * w64, f"eps is ignored: this call passed eps={eps:g}"),
        ]
        _match_mistake(out, ref, x.dtype, mistakes, on)
        _first_difference(out, ref, x.dtype, "rms_norm", on)
    return len(cases)


# ----------------------------------------------------------------------------
# softmax_backward
# ----------------------------------------------------------------------------

def _backward_cases():
    rng = np.random.default_rng(SEED + 4)
    masked = rng.normal(size=(3, 4))
    masked[np.triu_indices(3, 1, 4)] = -np.inf
    masked[2] = -np.inf                                  # a fully masked row: p is all zeros
    return [
        ("random", rng.normal(size=(3, 5)) * 2, rng.normal(size=(3, 5))),
        ("one entry", np.array([[0.3]]), np.array([[1.7]])),
        ("float32, three axes", (rng.normal(size=(2, 3, 4)) * 2).astype(np.float32),
         rng.normal(size=(2, 3, 4)).astype(np.float32)),
        ("masked scores, the last row fully masked", masked, rng.normal(size=(3, 4))),
    ]


def check_softmax_backward(f) -> int:
    cases = _backward_cases()
    for what, s, g in cases:
        x = ag.Tensor(s, requires_grad=True)
        p = ag.softmax(x)
        p.backward(g)
        ref, p = x.grad, p.data
        on = f"p = softmax(s), s {_arr(s)}, {what}; g {_arr(g)}"
        out = _call(f, "softmax_backward", (p.copy(), g.copy()), on)
        _same_form(out, s.shape, s.dtype, "softmax_backward", on, "the shape of p")
        if not np.all(np.isfinite(out)):
            where = tuple(int(i) for i in np.argwhere(~np.isfinite(out))[0])
            raise Wrong(f"entry {list(where)} is {_fmt(out[where])}\n  on: {on}")
        if _close(out, ref, s.dtype):
            continue
        p64, g64 = p.astype(np.float64), g.astype(np.float64)
        mistakes = [
            (p64 * g64, "missing the -p * sum(g * p) term: the Jacobian of softmax is diag(p) - p p^T, "
                        "not diag(p)"),
            (p64 * (1 - p64) * g64, "only the diagonal of the Jacobian, p(1 - p), is used; every p_j also "
                                    "depends on every s_k: ds = p * (g - sum(g * p))"),
            (-ref, "the sign is flipped: ds = p * (g - sum(g * p))"),
            (g64 - np.sum(g64 * p64, axis=-1, keepdims=True), "missing the factor p: ds = p * (g - sum(g * p))"),
        ]
        if s.ndim > 1 and s.shape[0] > 1:
            mistakes.append((p64 * (g64 - np.sum(g64 * p64, axis=0, keepdims=True)),
                             "the sum runs over the first axis; sum g * p over each row (the last axis)"))
        _match_mistake(out, ref, s.dtype, mistakes, on)
        sums = out.reshape(-1, s.shape[-1]).sum(axis=-1)                # (rows,)
        r = _row_off(sums, 0.0, s.dtype)
        if r is not None:
            raise Wrong(f"row {r} of your gradient sums to {_fmt(sums[r])}; every row must sum to 0 (adding a "
                        f"constant to a row of scores does not change the softmax)\n  on: {on}")
        _first_difference(out, ref, s.dtype, "softmax_backward", on)
    return len(cases)
