"""glassllm: a glass-box LLaMA-style language model in NumPy.

``glassllm.show(prompt)`` shows the inspector inline in a Jupyter notebook (see
:func:`glassllm.inspector.notebook.show`); it is imported on first use, so
``import glassllm`` needs NumPy alone.
"""

__version__ = "0.1.0"


def show(prompt: str, model=None, tokenizer=None, **options):
    """The inspector for ``prompt``, inline in a notebook: see :func:`glassllm.inspector.notebook.show`."""
    from .inspector.notebook import show as show_inline   # the application layer, imported only when asked for

    return show_inline(prompt, model, tokenizer, **options)
