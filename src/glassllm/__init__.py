"""glassllm: a glass-box LLaMA-style language model in NumPy.

``glassllm.show(prompt)`` (or ``glassllm.show(trace)``) shows the inspector
inline in a Jupyter notebook: the top-level facade of
:func:`glassllm.inspector.show`; ``glassllm.show_attention(weights, tokens)``
shows any model's attention weights. The inspector is imported on first use,
so ``import glassllm`` needs NumPy alone. This file sits on the top layer of
the package (it may call the inspector); it also makes the inspector's
notebook view the one :meth:`glassllm.trace.Trace.show` uses
(:mod:`glassllm.viewers`), and the kernel dispatcher the one the model asks
(:mod:`glassllm.dispatcher`; the kernels are imported when a model is first built).
"""

from . import dispatcher, viewers

__version__ = "0.1.0"


def show(prompt_or_trace, model=None, tokenizer=None, **options):
    """The inspector for a prompt or a recorded trace, inline in a notebook: see :func:`glassllm.inspector.show`."""
    from .inspector import show as show_inline

    return show_inline(prompt_or_trace, model, tokenizer, **options)


def show_attention(attention, tokens, **options):
    """Attention weights of any model in the inspector, offline: see :func:`glassllm.inspector.notebook.show_attention`."""
    from .inspector.notebook import show_attention as show_weights

    return show_weights(attention, tokens, **options)


def _show_trace(trace, tokenizer=None, **options):
    from .inspector.notebook import show_trace

    return show_trace(trace, tokenizer, **options)


viewers.register_trace_viewer(_show_trace)


def _kernel_dispatch():
    from .kernels import dispatch

    return dispatch


dispatcher.install(_kernel_dispatch)
