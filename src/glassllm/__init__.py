"""glassllm: a glass-box LLaMA-style language model in NumPy.

``glassllm.show(prompt)`` shows the inspector inline in a Jupyter notebook (see
:func:`glassllm.inspector.notebook.show`), ``glassllm.show_attention(weights, tokens)``
any model's attention weights; both are imported on first use, so
``import glassllm`` needs NumPy alone.
"""

__version__ = "0.1.0"


def show(prompt: str, model=None, tokenizer=None, **options):
    """The inspector for ``prompt``, inline in a notebook: see :func:`glassllm.inspector.notebook.show`."""
    # A call into the application layer (the inspector), looked up when called, as glassllm.inspector's own
    # lazy names are: importing glassllm imports nothing but this file.
    import importlib

    return importlib.import_module("glassllm.inspector.notebook").show(prompt, model, tokenizer, **options)


def show_attention(attention, tokens, **options):
    """Attention weights of any model in the inspector, offline: see :func:`glassllm.inspector.notebook.show_attention`."""
    import importlib

    return importlib.import_module("glassllm.inspector.notebook").show_attention(attention, tokens, **options)
