"""Reverse-mode automatic differentiation over NumPy arrays.

A :class:`Tensor` wraps an ``ndarray``. Every operation on tensors that need a
gradient records its inputs and a ``backward`` closure; :meth:`Tensor.backward`
then walks that graph in reverse topological order (iteratively, so a deep graph
never meets Python's recursion limit) and accumulates ``d loss / d tensor``
into ``.grad``.

Each primitive is one function below, and its backward is written right under
its forward: to add an op you touch one place. A backward closure receives the
gradient of the op's output and returns one gradient per input (``None`` for
an input that needs none).

Besides the textbook primitives there are a few whose backward is derived by
hand -- ``linear``, ``rope`` and ``cross_entropy`` -- tested equal to the same
computation spelled out with the small primitives. Operations that exist only
for speed (fused attention, RMSNorm, SwiGLU, tiled attention, the stacked
linear, the in-place softmax, RoPE's per-head layout) live in
:mod:`glassllm.ops`, which builds them on :func:`as_tensor` and
:func:`make_op`, the two public helpers for defining an op outside this module.

dtype: float32 by default; float64 works everywhere (gradient checks use it).
Python scalars never upcast a float32 tensor.

Shape legend used in comments: B batch, n new queries, m keys, H query heads,
G key/value heads, D head dim, C model width, V vocabulary, F MLP width.
"""

from __future__ import annotations

import builtins
import threading
from contextlib import contextmanager

import numpy as np

from .checks import check_int, is_int

__all__ = [
    "Tensor", "no_grad", "is_grad_enabled", "tensor", "as_tensor", "make_op",
    "softmax_np", "log_softmax_np", "logsumexp_np", "sigmoid_np",
    "add", "sub", "mul", "div", "neg", "pow", "rpow", "matmul", "sum", "mean", "exp",
    "log", "sqrt", "rsqrt", "sigmoid", "silu", "softmax", "log_softmax",
    "cross_entropy", "reshape", "transpose", "getitem", "embedding",
    "concatenate", "split", "repeat_interleave", "masked_fill", "where",
    "linear", "rope", "rope_table", "rotate",
]


# ----------------------------------------------------------------------------
# Grad mode
# ----------------------------------------------------------------------------

class _GradMode(threading.local):
    """Per thread, as PyTorch's: a thread decoding under no_grad() leaves another thread's graph alone."""

    enabled = True


_GRAD_MODE = _GradMode()


def is_grad_enabled() -> bool:
    return _GRAD_MODE.enabled


@contextmanager
def no_grad():
    """Inside this block no graph is recorded by this thread (inference, evaluation, decoding)."""
    previous = _GRAD_MODE.enabled
    _GRAD_MODE.enabled = False
    try:
        yield
    finally:
        _GRAD_MODE.enabled = previous


# ----------------------------------------------------------------------------
# The Tensor
# ----------------------------------------------------------------------------

class Tensor:
    """An ndarray plus the bookkeeping reverse-mode autodiff needs.

    ``Tensor(array)`` shares the array's memory (an optimizer step then updates
    it in place). Changing ``.data`` in place between a forward and its
    backward is not detected: the backward reads the values as they are by then
    (PyTorch counts versions and raises). Change weights between steps, not
    inside one.

    >>> x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    >>> y = (x * x).sum()
    >>> y.backward()
    >>> x.grad
    array([2., 4., 6.], dtype=float32)
    """

    __slots__ = ("data", "grad", "requires_grad", "_parents", "_backward", "_retain", "name")
    __array_priority__ = 1000  # so ndarray <op> Tensor defers to Tensor

    def __init__(self, data, requires_grad: bool = False, dtype=None, name: str | None = None):
        if isinstance(data, Tensor):
            data = data.data
        given = data
        if dtype is None and not isinstance(data, (np.ndarray, np.generic)):
            # Python numbers and lists become float32 (ints stay ints unless a
            # gradient is asked for); ndarrays and NumPy scalars keep their dtype.
            data = np.asarray(data)
            if data.dtype.kind == "f" or (requires_grad and data.dtype.kind in "iu"):
                data = data.astype(np.float32)
        else:
            data = np.asarray(data, dtype=dtype)
        if data.dtype.kind not in "biuf":
            raise TypeError(f"a Tensor holds numbers, got a {type(given).__name__} (dtype {data.dtype})")
        if requires_grad and data.dtype.kind != "f":
            raise TypeError(f"only floating tensors can require grad, got dtype {data.dtype}")
        self.data = data
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._parents = ()
        self._backward = None
        self._retain = False
        self.name = name

    # -- basic properties ----------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self.data.shape

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def T(self) -> "Tensor":
        return transpose(self)

    def numpy(self) -> np.ndarray:
        return self.data

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """``np.asarray(t)``: the numbers of a tensor outside any graph.

        A tensor that requires grad refuses, as in PyTorch: a NumPy function
        would return a plain array and silently cut the gradient's path. Use
        the op of this module (``t.exp()``, ``autograd.exp(t)``) to stay in the
        graph, or ``t.data`` to take the numbers on purpose.
        """
        if self.requires_grad:
            raise TypeError("a NumPy function got a Tensor that requires grad, which would drop its gradient: "
                            "use glassllm.autograd's op instead, or .data for the numbers")
        if copy is False and dtype is not None and np.dtype(dtype) != self.data.dtype:
            raise ValueError(f"np.asarray(copy=False) cannot give dtype {np.dtype(dtype)} without a copy "
                             f"of this {self.data.dtype} tensor")
        out = self.data if dtype is None else self.data.astype(dtype, copy=False)
        return out.copy() if copy else out

    def item(self) -> float:
        return self.data.item()

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({np.array2string(self.data, precision=4, threshold=8)}{grad})"

    def detach(self) -> "Tensor":
        return Tensor(self.data)

    def retain_grad(self) -> "Tensor":
        """Keep ``.grad`` on this non-leaf tensor after backward (the tracer uses it)."""
        self._retain = True
        return self

    # -- backward --------------------------------------------------------------
    def backward(self, grad=None) -> None:
        """Accumulate ``d self / d leaf`` into the ``.grad`` of every leaf.

        ``grad`` defaults to 1 for a scalar. The graph is freed as it is walked;
        non-leaf gradients are dropped unless :meth:`retain_grad` was called.
        """
        if not self.requires_grad:
            raise ValueError("backward() called on a tensor that does not require grad")
        if grad is None:
            if self.data.size != 1:
                raise ValueError(f"backward() without a gradient needs a scalar, got shape {self.shape}")
            grad = np.ones_like(self.data)
        # a leaf keeps its own copy (an optimizer updates .grad in place); a graph's root passes it on
        grad = np.array(grad, dtype=self.dtype) if self._backward is None else np.asarray(grad, dtype=self.dtype)
        if grad.shape != self.shape:
            raise ValueError(f"gradient shape {grad.shape} does not match tensor shape {self.shape}")

        # Iterative post-order DFS gives a topological order without recursion:
        # a node is appended only after every one of its parents. A node is
        # marked when it is *expanded*, not when it is pushed -- marking on push
        # would let a node that is reachable along two paths (a residual
        # connection, say) be ordered before a parent it reaches the long way,
        # and its gradient would be passed on before it was complete.
        order, expanded_ids, stack = [], set(), [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if id(node) in expanded_ids:
                continue  # reached again along another path; already placed
            expanded_ids.add(id(node))
            stack.append((node, True))
            for parent in node._parents:
                if parent.requires_grad and id(parent) not in expanded_ids:
                    stack.append((parent, False))

        if any(node._backward is _freed for node in order):
            raise ValueError("backward() reached a tensor whose graph an earlier backward() already freed; "
                             "run the forward again to back-propagate a second time")
        self.grad = grad if self.grad is None else self.grad + grad
        for node in reversed(order):
            if node._backward is None:
                continue  # a leaf
            g = node.grad
            if g is not None:
                for parent, pg in zip(node._parents, node._backward(g)):
                    if pg is None or not parent.requires_grad:
                        continue
                    if parent._backward is None and np.shape(pg) != parent.shape:
                        raise ValueError(f"backward: an op gave a gradient of shape {np.shape(pg)} for a "
                                         f"tensor of shape {parent.shape} (its inputs did not match)")
                    if parent.grad is not None:
                        parent.grad = parent.grad + pg
                        if parent._backward is None and parent.grad.dtype != parent.dtype:
                            parent.grad = parent.grad.astype(parent.dtype)  # a leaf's grad keeps its dtype
                    elif parent._backward is None:
                        # A leaf keeps its own writable copy in its own dtype: an op may
                        # hand the same array (or a read-only broadcast view) to several
                        # inputs, and optimizers update .grad in place.
                        parent.grad = np.array(pg, dtype=parent.dtype)
                    else:
                        parent.grad = pg
            if not node._retain:
                node.grad = None
            node._parents, node._backward = (), _freed

    # -- operators ----------------------------------------------------------------
    def __add__(self, other): return add(self, other)
    def __radd__(self, other): return add(other, self)
    def __sub__(self, other): return sub(self, other)
    def __rsub__(self, other): return sub(other, self)
    def __mul__(self, other): return mul(self, other)
    def __rmul__(self, other): return mul(other, self)
    def __truediv__(self, other): return div(self, other)
    def __rtruediv__(self, other): return div(other, self)
    def __neg__(self): return neg(self)
    def __pow__(self, exponent): return pow(self, exponent)
    def __rpow__(self, base): return rpow(base, self)
    def __matmul__(self, other): return matmul(self, other)
    def __rmatmul__(self, other): return matmul(other, self)
    def __getitem__(self, index): return getitem(self, index)

    def sum(self, axis=None, keepdims=False): return sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return mean(self, axis, keepdims)
    def exp(self): return exp(self)
    def log(self): return log(self)
    def sqrt(self): return sqrt(self)
    def reshape(self, *shape): return reshape(self, shape[0] if len(shape) == 1 else shape)
    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):  # t.transpose((1, 0)), as NumPy allows
            axes = tuple(axes[0])
        return transpose(self, axes or None)
    def softmax(self, axis=-1): return softmax(self, axis)


def _freed(g):
    """The backward of a node whose graph a backward pass has walked and freed (see Tensor.backward)."""
    raise ValueError("this tensor's graph was freed by an earlier backward()")


def tensor(data, requires_grad: bool = False, dtype=None) -> Tensor:
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


# ----------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------

def as_tensor(x, like: Tensor | None = None) -> Tensor:
    """``x`` as a Tensor: a Tensor is returned as is; an array or number is wrapped (as a constant),
    taking ``like``'s floating dtype when given, so that a Python float never upcasts a float32 op."""
    if isinstance(x, Tensor):
        return x
    if x is None or isinstance(x, (str, bytes)):
        raise TypeError(f"expected a number, an array or a Tensor, got {type(x).__name__}")
    dtype = like.dtype if like is not None and like.dtype.kind == "f" else None
    return Tensor(np.asarray(x, dtype=dtype) if dtype is not None else x)


def _pair(a, b) -> tuple[Tensor, Tensor]:
    if isinstance(a, Tensor):
        return a, as_tensor(b, a)
    b = as_tensor(b)
    return as_tensor(a, b), b


def make_op(data: np.ndarray, parents: tuple, backward) -> Tensor:
    """Wrap an op's result ``data``; record the graph only when some input needs a gradient.

    ``parents`` are the op's Tensor inputs; ``backward(g)`` receives the gradient
    of the result and returns one gradient per parent (None where a parent needs
    none). Every op in this module ends with it, and so do the kernels of
    :mod:`glassllm.kernels`.
    """
    out = Tensor(np.asarray(data))  # a full reduction gives a NumPy scalar; keep its dtype
    if _GRAD_MODE.enabled and any(p.requires_grad for p in parents):
        out.requires_grad = True
        out._parents = parents
        out._backward = backward
    return out


def _unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``g`` over the axes that broadcasting added or stretched to reach ``shape``."""
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra:
        g = g.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    if stretched:
        g = g.sum(axis=stretched, keepdims=True)
    return g


def _need(t: Tensor) -> bool:
    return t.requires_grad


# ----------------------------------------------------------------------------
# Plain NumPy softmax, log-softmax and log-sum-exp: the one stable copy (used by the primitives
# below, sampling, evaluation, the logit lens and the lessons)
# ----------------------------------------------------------------------------

def softmax_np(x, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis`` in plain NumPy, stable for large scores.

    The row maximum is subtracted before exponentiating (softmax is unchanged by
    a shift, and ``exp`` then never overflows). A row whose entries are all
    ``-inf`` -- every key forbidden -- has no distribution; it returns all zeros
    rather than ``0/0 = NaN``.

    >>> softmax_np(np.array([[0.0, 0.0], [-np.inf, -np.inf]]))
    array([[0.5, 0.5],
           [0. , 0. ]])
    """
    x = np.asarray(x)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    # The row maximum. fmax skips NaN (max would return it), but a NaN entry makes its row's sum NaN and so
    # the whole row NaN either way; fmax is the faster reduction, about twice max's speed.
    peak = np.fmax.reduce(x, axis=axis, keepdims=True)
    peak[np.isneginf(peak)] = 0.0                                       # an all -inf row: no shift
    e = x - peak
    np.exp(e, out=e)                                                    # every entry <= 1: no overflow
    total = e.sum(axis=axis, keepdims=True)
    total[total == 0] = 1.0                                             # an all -inf row: 0 / 1 = 0, not 0 / 0
    e /= total
    return e


def log_softmax_np(x, axis: int = -1) -> np.ndarray:
    """log(softmax(x)) along ``axis`` in plain NumPy: ``(x - max) - log(sum(exp(x - max)))``.

    A row that is all ``-inf`` stays all ``-inf`` (its softmax is all zeros, as
    :func:`softmax_np` makes it).

    >>> np.round(log_softmax_np(np.array([0.0, np.log(3.0)])), 6)
    array([-1.386294, -0.287682])
    """
    return _log_softmax_and_dead(x, axis)[0]


def _log_softmax_and_dead(x, axis: int):
    """:func:`log_softmax_np`, and which rows are all -inf (kept as an axis of size 1)."""
    shifted, log_total, dead = _shifted_log_total(x, axis)
    return shifted - np.where(dead, 0.0, log_total).astype(shifted.dtype, copy=False), dead


def logsumexp_np(x, axis: int = -1) -> np.ndarray:
    """``log(sum(exp(x)))`` along ``axis`` (the axis removed), stable for large entries: the row maximum
    is taken out first. A row that is all ``-inf`` gives ``-inf``.

    >>> float(logsumexp_np(np.array([1000.0, 1000.0])))      # exp(1000) overflows; this does not
    1000.6931471805599
    """
    x = np.asarray(x)
    shifted, log_total, dead = _shifted_log_total(x, axis)
    peak = np.where(dead, 0.0, x.max(axis=axis, keepdims=True)).astype(log_total.dtype, copy=False)
    return np.squeeze(np.where(dead, -np.inf, log_total + peak), axis=axis)


def _shifted_log_total(x, axis: int):
    """``x - max`` (no shift in an all -inf row), ``log(sum(exp(x - max)))`` kept as an axis of size 1, and the
    rows that are all -inf: the steps :func:`log_softmax_np` and :func:`logsumexp_np` share."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)                                        # integers compute in float64
    peak = x.max(axis=axis, keepdims=True)
    dead = np.isneginf(peak)                                            # rows with nothing to choose
    peak = np.where(dead, 0.0, peak).astype(x.dtype, copy=False)        # (no shift there)
    shifted = x - peak
    with np.errstate(divide="ignore"):
        log_total = np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    return shifted, log_total, dead


# ----------------------------------------------------------------------------
# Elementwise arithmetic (with broadcasting)
# ----------------------------------------------------------------------------

def add(a, b) -> Tensor:
    a, b = _pair(a, b)

    def backward(g):
        return (_unbroadcast(g, a.shape) if _need(a) else None,
                _unbroadcast(g, b.shape) if _need(b) else None)
    return make_op(a.data + b.data, (a, b), backward)


def sub(a, b) -> Tensor:
    a, b = _pair(a, b)

    def backward(g):
        return (_unbroadcast(g, a.shape) if _need(a) else None,
                _unbroadcast(-g, b.shape) if _need(b) else None)
    return make_op(a.data - b.data, (a, b), backward)


def mul(a, b) -> Tensor:
    a, b = _pair(a, b)

    def backward(g):
        return (_unbroadcast(g * b.data, a.shape) if _need(a) else None,
                _unbroadcast(g * a.data, b.shape) if _need(b) else None)
    return make_op(a.data * b.data, (a, b), backward)


def div(a, b) -> Tensor:
    a, b = _pair(a, b)
    out = a.data / b.data

    def backward(g):
        return (_unbroadcast(g / b.data, a.shape) if _need(a) else None,
                _unbroadcast(-g * out / b.data, b.shape) if _need(b) else None)
    return make_op(out, (a, b), backward)


def neg(a) -> Tensor:
    a = as_tensor(a)

    def backward(g):
        return (-g,)
    return make_op(-a.data, (a,), backward)


def pow(a, exponent: float) -> Tensor:
    """``a ** exponent`` for a constant (non-tensor) exponent."""
    a = as_tensor(a)
    if isinstance(exponent, Tensor) or not np.isscalar(exponent):
        raise TypeError(f"pow takes a scalar exponent, got {type(exponent).__name__}")
    exponent = float(exponent)

    def backward(g):
        if exponent == 0.0:                                              # d/dx x**0 = 0, also at x = 0
            return (np.zeros_like(g),)
        return (g * exponent * a.data ** (exponent - 1.0),)
    return make_op(a.data ** exponent, (a,), backward)


def rpow(base: float, a) -> Tensor:
    """``base ** a`` for a constant (non-tensor) base: d/da = base ** a * ln(base).

    A zero base gives a zero gradient where ``a >= 0`` (where 0 ** a is flat or
    jumps, as PyTorch defines it). A negative base gives a NaN value where ``a``
    is not an integer, and a NaN gradient everywhere (ln of a negative number),
    as in PyTorch.
    """
    a = as_tensor(a)
    if isinstance(base, (Tensor, str, bytes, bool, np.bool_)) or not np.isscalar(base):
        raise TypeError(f"rpow takes a scalar base, got {type(base).__name__}")
    base = float(base)
    out = np.power(a.dtype.type(base), a.data) if a.dtype.kind == "f" else np.power(base, a.data)

    def backward(g):
        if base == 0.0:                                                  # out * ln 0 = out * -inf, where a < 0
            with np.errstate(invalid="ignore"):                          # (0 * inf in the branch not taken)
                return (np.where(a.data >= 0, 0.0, g * -np.inf).astype(g.dtype),)
        return (g * out * g.dtype.type(np.log(base) if base > 0 else np.nan),)
    return make_op(out, (a,), backward)


def exp(a) -> Tensor:
    a = as_tensor(a)
    out = np.exp(a.data)

    def backward(g):
        return (g * out,)
    return make_op(out, (a,), backward)


def log(a) -> Tensor:
    a = as_tensor(a)

    def backward(g):
        return (g / a.data,)
    return make_op(np.log(a.data), (a,), backward)


def sqrt(a) -> Tensor:
    a = as_tensor(a)
    out = np.sqrt(a.data)

    def backward(g):
        return (g * 0.5 / out,)
    return make_op(out, (a,), backward)


def rsqrt(a) -> Tensor:
    a = as_tensor(a)
    out = 1.0 / np.sqrt(a.data)

    def backward(g):
        return (g * -0.5 * out ** 3,)
    return make_op(out, (a,), backward)


def sigmoid(a) -> Tensor:
    a = as_tensor(a)
    out = sigmoid_np(a.data)

    def backward(g):
        return (g * out * (1.0 - out),)
    return make_op(out, (a,), backward)


def sigmoid_np(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) of a NumPy array, as a new float array (both tails keep full precision)."""
    # sigmoid(x) = 1 / (1 + exp(-x)), in place on one new array (four passes). exp(-x)
    # overflows to inf only where sigmoid(x) is below the smallest normal float
    # (x < -87 in float32, -708 in float64), and 1/inf = 0 there; everywhere else
    # every step is correctly rounded, so both tails keep full relative precision
    # ((1 + tanh(x/2)) / 2 would round sigmoid(-40) to 0). Integers become float64, as
    # in exp; a 0-d input stays an array, so that the in-place steps have somewhere to write.
    s = np.negative(x if x.dtype.kind == "f" else x.astype(np.float64))
    if not isinstance(s, np.ndarray):                                   # NumPy hands a 0-d result back as a scalar
        s = np.array(s)
    with np.errstate(over="ignore"):
        np.exp(s, out=s)
    s += 1.0
    np.reciprocal(s, out=s)
    return s


def silu(a) -> Tensor:
    """``x * sigmoid(x)`` (a.k.a. swish), the gate of SwiGLU."""
    a = as_tensor(a)
    s = sigmoid_np(a.data)

    def backward(g):
        # d/dx [x s(x)] = s + x s (1 - s)
        return (g * s * (1.0 + a.data * (1.0 - s)),)
    return make_op(a.data * s, (a,), backward)


# ----------------------------------------------------------------------------
# Linear algebra and reductions
# ----------------------------------------------------------------------------

def matmul(a, b) -> Tensor:
    """``a @ b`` with NumPy's batching rules (both operands at least 2-D)."""
    a, b = _pair(a, b)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"matmul needs operands with at least 2 dims, got shapes {a.shape} and {b.shape}")

    def backward(g):
        ga = gb = None
        if _need(a):
            ga = _unbroadcast(g @ np.swapaxes(b.data, -1, -2), a.shape)
        if _need(b):
            gb = _unbroadcast(np.swapaxes(a.data, -1, -2) @ g, b.shape)
        return ga, gb
    return make_op(a.data @ b.data, (a, b), backward)


def linear(x, weight) -> Tensor:
    """``x @ weight.T`` over the last axis, as one 2-D GEMM: (..., in) -> (..., out).

    ``weight`` has PyTorch's layout (out, in), so LLaMA checkpoints map key for key.
    It may also be a tuple of such matrices with the same ``in``: the outputs side by side::

        linear(x, (wq, wk, wv))  ==  concatenate([linear(x, wq), linear(x, wk), linear(x, wv)], -1)

    (:func:`glassllm.ops.linear_stacked` computes that as one GEMM.)
    """
    if isinstance(weight, (tuple, list)):
        return concatenate([linear(x, w) for w in weight], axis=-1)
    x, weight = _pair(x, weight)
    lead = x.shape[:-1]
    x2 = x.data.reshape(-1, x.shape[-1])                                # (N, in)
    out = (x2 @ weight.data.T).reshape(*lead, weight.shape[0])          # (..., out)

    def backward(g):
        g2 = g.reshape(-1, weight.shape[0])                             # (N, out)
        gx = (g2 @ weight.data).reshape(x.shape) if _need(x) else None  # (..., in)
        gw = g2.T @ x2 if _need(weight) else None                       # (out, in)
        return gx, gw
    return make_op(out, (x, weight), backward)


def _norm_axis(axis, ndim):
    """``axis`` (None, an int or a tuple, negative counting from the end) as a tuple of axes >= 0."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if ndim and all(type(a) is int and -ndim <= a < ndim for a in axes):  # the common case, checked quickly
        return tuple(a % ndim for a in axes)
    if ndim == 0 and all(a in (0, -1) for a in axes):
        return ()                                                        # a 0-d tensor: nothing to reduce
    for a in axes:
        if not is_int(a) or not -ndim <= a < ndim:
            raise ValueError(f"axis {a!r} is out of range for {ndim} dimension(s): expected -{ndim} .. {ndim - 1}")
    return tuple(int(a) % ndim for a in axes)


def sum(a, axis=None, keepdims: bool = False) -> Tensor:
    a = as_tensor(a)
    axes = _norm_axis(axis, a.ndim)

    def backward(g):
        if not keepdims:
            g = np.expand_dims(g, axes)
        return (np.broadcast_to(g, a.shape),)
    return make_op(a.data.sum(axis=axes, keepdims=keepdims), (a,), backward)


def mean(a, axis=None, keepdims: bool = False) -> Tensor:
    a = as_tensor(a)
    axes = _norm_axis(axis, a.ndim)
    count = int(np.prod([a.shape[i] for i in axes])) if axes else 1

    def backward(g):
        if not keepdims:
            g = np.expand_dims(g, axes)
        return (np.broadcast_to(g / count, a.shape),)
    return make_op(a.data.mean(axis=axes, keepdims=keepdims), (a,), backward)


# ----------------------------------------------------------------------------
# Softmax family
# ----------------------------------------------------------------------------

def softmax(a, axis: int = -1) -> Tensor:
    """Softmax along ``axis``; an all ``-inf`` row gives zeros (see :func:`softmax_np`)."""
    a = as_tensor(a)
    p = softmax_np(a.data, axis)

    def backward(g):
        return (_softmax_grad(p, g, axis),)
    return make_op(p, (a,), backward)


def _softmax_grad(p: np.ndarray, g: np.ndarray, axis: int) -> np.ndarray:
    """Softmax's backward: dx = p * (g - <g, p>) along the axis."""
    return p * (g - (g * p).sum(axis=axis, keepdims=True))


def log_softmax(a, axis: int = -1) -> Tensor:
    """log(softmax(a)) along ``axis`` (:func:`log_softmax_np`); a row that is all -inf gives -inf and a
    zero gradient (its softmax is all zeros, as :func:`softmax_np` makes it)."""
    a = as_tensor(a)
    out, dead = _log_softmax_and_dead(a.data, axis)

    def backward(g):
        dx = g - np.exp(out) * g.sum(axis=axis, keepdims=True)
        return (np.where(dead, 0.0, dx).astype(g.dtype, copy=False) if dead.any() else dx,)
    return make_op(out, (a,), backward)


def cross_entropy(logits, targets, ignore_index: int = -100) -> Tensor:
    """Mean negative log-likelihood of ``targets`` under softmax(``logits``).

    logits (..., V), targets (...) of ints. Positions whose target equals
    ``ignore_index`` count neither in the sum nor in the mean. Softmax and the
    loss are fused: the gradient is ``(softmax - onehot) / count``. When every
    target is ignored there is nothing to average: the loss is 0 and so are the
    gradients (PyTorch's mean over no positions is NaN instead).
    """
    logits = as_tensor(logits)
    targets = np.asarray(targets.data if isinstance(targets, Tensor) else targets)
    if targets.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy targets must be integers, got dtype {targets.dtype}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets shape {targets.shape} does not match logits shape {logits.shape[:-1]} (without V)")
    if logits.dtype.kind != "f":
        raise TypeError(f"cross_entropy needs floating-point logits, got dtype {logits.dtype}")
    V = logits.shape[-1]
    z = logits.data.reshape(-1, V)                                      # (N, V)
    t = targets.reshape(-1)                                             # (N,)
    keep = t != ignore_index
    if np.any((t[keep] < 0) | (t[keep] >= V)):
        bad = t[keep][(t[keep] < 0) | (t[keep] >= V)][0]
        raise ValueError(f"target id {bad} is out of range [0, {V})")
    count = max(int(keep.sum()), 1)
    rows = np.nonzero(keep)[0]
    peak = np.fmax.reduce(z, axis=1, keepdims=True)                     # (N, 1)
    e = z - peak
    np.exp(e, out=e)                                                    # (N, V)
    total = (e @ np.ones(V, dtype=e.dtype))[:, None]                    # (N, 1): the row sums as one GEMV
    lse = np.log(total) + peak                                          # (N, 1)
    loss = (lse[rows, 0] - z[rows, t[rows]]).sum() / count

    def backward(g):
        # The exponentials become the gradient in place (a graph is walked once):
        # g/count * softmax, minus g/count at each target.
        step = np.asarray(g, dtype=e.dtype) / count
        grad = e
        grad *= step / total                                            # (N, V)
        grad[rows, t[rows]] -= step
        if rows.size < len(t):
            grad[~keep] = 0.0
        return (grad.reshape(logits.shape),)
    return make_op(np.asarray(loss, dtype=logits.dtype), (logits,), backward)


# ----------------------------------------------------------------------------
# Shape ops
# ----------------------------------------------------------------------------

def reshape(a, shape) -> Tensor:
    a = as_tensor(a)

    def backward(g):
        return (g.reshape(a.shape),)
    return make_op(a.data.reshape(shape), (a,), backward)


def transpose(a, axes=None) -> Tensor:
    """Permute the axes (default: reverse them); ``axes`` is a full permutation, negative axes allowed."""
    a = as_tensor(a)
    if axes is None:
        axes = tuple(reversed(range(a.ndim)))
    else:
        given = tuple(axes)
        # The backward's argsort needs axes >= 0; NumPy checks that they are a permutation.
        axes = given if min(given, default=0) >= 0 else _norm_axis(given, a.ndim)
    try:
        out = a.data.transpose(axes)
    except (ValueError, TypeError):
        raise ValueError(f"transpose axes {axes} are not a permutation of the {a.ndim} axes of shape {a.shape}") from None

    def backward(g):
        return (g.transpose(np.argsort(axes)),)
    return make_op(out, (a,), backward)


def getitem(a, index) -> Tensor:
    """Basic or advanced indexing; repeated indices accumulate in the backward."""
    a = as_tensor(a)
    if isinstance(index, Tensor):
        index = index.data

    basic = all(isinstance(i, (slice, int, type(None), type(Ellipsis)))
                for i in (index if isinstance(index, tuple) else (index,)))

    def backward(g):
        grad = np.zeros_like(a.data)
        if basic:
            grad[index] = g            # a view: no position is picked twice
        else:
            np.add.at(grad, index, g)  # fancy indexing may repeat positions
        return (grad,)
    return make_op(a.data[index], (a,), backward)


def embedding(weight, ids) -> Tensor:
    """Rows of ``weight`` (V, C) picked by integer ``ids`` (...): (..., C)."""
    weight = as_tensor(weight)
    ids = np.asarray(ids.data if isinstance(ids, Tensor) else ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"embedding ids must be integers, got dtype {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= weight.shape[0]):
        bad = ids[(ids < 0) | (ids >= weight.shape[0])].reshape(-1)[0]
        raise ValueError(f"embedding id {bad} is out of range [0, {weight.shape[0]})")
    flat = ids.reshape(-1).astype(np.intp)                              # id * C must not wrap (uint16 ids)

    def backward(g):
        # Repeated ids accumulate. np.add.at over flat (row * C + column) indices
        # runs NumPy's fast 1-D path, a few times quicker than over rows.
        V, C = weight.shape
        grad = np.zeros(V * C, dtype=weight.dtype)
        cells = (flat[:, None] * C + np.arange(C)).reshape(-1)          # (N*C,)
        np.add.at(grad, cells, g.reshape(-1))
        return (grad.reshape(V, C),)
    return make_op(weight.data[ids], (weight,), backward)


def concatenate(tensors, axis: int = 0) -> Tensor:
    tensors = [as_tensor(t) for t in tensors]
    sizes = [t.shape[axis] for t in tensors]
    bounds = np.cumsum(sizes)[:-1]

    def backward(g):
        parts = np.split(g, bounds, axis=axis)
        return tuple(p if _need(t) else None for p, t in zip(parts, tensors))
    return make_op(np.concatenate([t.data for t in tensors], axis=axis), tuple(tensors), backward)


def split(a, sections, axis: int = 0) -> list[Tensor]:
    """Split into pieces of the given sizes (a list) or into ``sections`` equal parts (an int)."""
    a = as_tensor(a)
    if a.ndim == 0:
        raise ValueError("split needs a tensor with at least one axis, got a 0-d tensor")
    (axis,) = _norm_axis(axis, a.ndim)
    if is_int(sections):
        sections = int(sections)
        if sections < 1 or a.shape[axis] % sections:
            raise ValueError(f"cannot split axis of size {a.shape[axis]} into {sections} equal parts")
        sizes = [a.shape[axis] // sections] * sections
    else:
        sizes = list(sections)
        if any(s < 0 for s in sizes) or builtins.sum(sizes) != a.shape[axis]:
            raise ValueError(f"split sizes {sizes} must be >= 0 and add up to the axis' size {a.shape[axis]}")
    starts = np.concatenate([[0], np.cumsum(sizes)])
    pieces = []
    for lo, hi in zip(starts[:-1], starts[1:]):
        index = [slice(None)] * a.ndim
        index[axis] = slice(int(lo), int(hi))
        pieces.append(getitem(a, tuple(index)))
    return pieces


def repeat_interleave(a, repeats: int, axis: int) -> Tensor:
    """Repeat each slice along ``axis`` ``repeats`` times in a row: [a, b] -> [a, a, b, b].

    This is grouped-query expansion: K/V head g serves query heads
    g*repeats ... g*repeats + repeats - 1.
    """
    a = as_tensor(a)
    repeats = check_int("repeats", repeats, low=1)
    if a.ndim == 0:
        raise ValueError("repeat_interleave needs a tensor with at least one axis, got a 0-d tensor")
    (axis,) = _norm_axis(axis, a.ndim)

    def backward(g):
        shape = a.shape[:axis] + (a.shape[axis], repeats) + a.shape[axis + 1:]
        return (g.reshape(shape).sum(axis=axis + 1),)
    return make_op(np.repeat(a.data, repeats, axis=axis), (a,), backward)


def masked_fill(a, mask, value: float) -> Tensor:
    """Entries where the boolean ``mask`` is True become ``value``; ``a`` and ``mask`` broadcast together
    (the result has their common shape, as PyTorch's out-of-place ``masked_fill``)."""
    a = as_tensor(a)
    mask = np.asarray(mask.data if isinstance(mask, Tensor) else mask)
    if mask.dtype != np.bool_:
        raise TypeError(f"masked_fill needs a bool mask, got dtype {mask.dtype}")
    try:
        np.broadcast_shapes(mask.shape, a.shape)                       # either may broadcast, as in PyTorch
    except ValueError:
        raise ValueError(f"mask of shape {mask.shape} does not broadcast with the tensor's shape {a.shape}") from None

    def backward(g):
        return (_unbroadcast(np.where(mask, 0.0, g).astype(g.dtype, copy=False), a.shape),)
    if a.dtype.kind == "f" and np.broadcast_shapes(mask.shape, a.shape) == a.shape:
        out = a.data.copy()                        # a copy and a masked write beat np.where
        np.copyto(out, np.asarray(value, dtype=a.dtype), where=mask)
    else:
        out = np.where(mask, np.asarray(value, dtype=a.dtype), a.data)
    return make_op(out, (a,), backward)


def where(condition, a, b) -> Tensor:
    a, b = _pair(a, b)
    cond = np.asarray(condition.data if isinstance(condition, Tensor) else condition, dtype=bool)
    out = np.where(cond, a.data, b.data)
    zero = np.zeros((), dtype=out.dtype)

    def backward(g):
        return (_unbroadcast(np.where(cond, g, zero), a.shape) if _need(a) else None,
                _unbroadcast(np.where(cond, zero, g), b.shape) if _need(b) else None)
    return make_op(out, (a, b), backward)


# ----------------------------------------------------------------------------
# RoPE (hand-derived backward; tested equal to its spelled-out form)
# ----------------------------------------------------------------------------

def rope_table(cos, sin, dtype=np.float32) -> np.ndarray:
    """The rotations of RoPE as unit complex numbers ``cos + i sin``, for :func:`rotate`.

    cos, sin: (n, D/2), or (B, 1, n, D/2) when each row has its own positions;
    the table keeps that shape (it broadcasts against x (..., n, D) seen as
    (..., n, D/2) complex numbers).
    """
    cos, sin = np.asarray(cos), np.asarray(sin)
    cdt = np.result_type(dtype, np.complex64)
    z = np.empty(np.broadcast_shapes(cos.shape, sin.shape), dtype=cdt)
    z.real, z.imag = cos, sin
    return z


def rotate(x: np.ndarray, z: np.ndarray, out: np.ndarray | None = None, inverse: bool = False) -> np.ndarray:
    """Turn each interleaved pair (x[2i], x[2i+1]) by the unit complex number z (plain NumPy).

    A pair read as the complex number x[2i] + i x[2i+1], times z = cos + i sin,
    is (x0 cos - x1 sin) + i (x0 sin + x1 cos): exactly RoPE's rotation, in one
    complex multiply on a view of the same memory. ``inverse`` turns by the
    opposite angle (times conj z), which is also the rotation's backward.
    x (..., D) float with D even; z broadcastable to (..., D/2); ``out`` like x.
    """
    if x.strides[-1] != x.itemsize:
        x = np.ascontiguousarray(x)
    if out is None:
        out = np.empty(x.shape, dtype=x.dtype)
    cdt = np.result_type(x.dtype, np.complex64)
    np.multiply(x.view(cdt), np.conjugate(z) if inverse else z, out=out.view(cdt))
    return out


def rope(x, cos: np.ndarray, sin: np.ndarray) -> Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of the last axis by angles with the given cos/sin.

    x (..., n, D); cos, sin broadcastable to (..., n, D/2). A rotation is
    orthogonal, so the backward is the rotation by the opposite angle
    (see :func:`rotate`).
    """
    x = as_tensor(x)
    if x.ndim < 1 or x.shape[-1] % 2:
        raise ValueError(f"rope needs an even last axis (pairs of features), got shape {x.shape}")
    if x.dtype.kind != "f":
        raise TypeError(f"rope needs floating-point x, got dtype {x.dtype}")
    z = rope_table(cos, sin, x.dtype)                                   # (..., n, D/2) complex
    out = rotate(x.data, z)                                             # (..., n, D)

    def backward(g):
        return (rotate(g, z, inverse=True),)
    return make_op(out, (x,), backward)
