"""The tracer: every intermediate tensor of the model by a stable name, forward and backward.

Names. Every module lists the tensors it computes (``SNAPSHOTS`` in
:mod:`glassllm.nn`); walking the modules gives the *registry*, full name ->
axis letters, in the order a forward pass produces them::

    embed
    layers.{i}.resid_pre  layers.{i}.attn_norm.in|rms|out
    layers.{i}.attn.q|k|v|rope_q|rope_k|cache_k|cache_v|scores|mask|softmax|mix|head_out|out
    layers.{i}.resid_mid  layers.{i}.mlp_norm.in|rms|out
    layers.{i}.mlp.gate|up|act|prod|out   layers.{i}.resid_post
    norm.in|rms|out  logits  probs

``docs/snapshots.md`` is the table of every name with its axes and shape
(generated from the registry by :func:`snapshot_table`). Axes use the shape
legend -- n new queries, m keys (m = start + n), H query heads, G key/value
heads, D head dim, C model width, V vocabulary, F MLP width -- and the batch
axis is always removed: a :class:`Tracer` keeps one batch row (``batch=0``).

Recording. A :class:`Tracer` is a context manager around anything that runs
the model: a forward pass, a cached generation, a backward pass. Each forward
is one *step* with its own n, m and start (a cached generation records a
prefill with n = m = prompt length, then steps with n = 1, m = start + 1).
``names=`` stores only some snapshots (exact names, globs such as
``layers.2.attn.*``, layer-local names such as ``attn.softmax`` for every
layer, or a function of a name); ``dtype=`` casts what is stored. Wherever a
name is taken, TransformerLens' hook name for it works too
(``blocks.2.attn.hook_pattern``, ``hook_z``, the short ``pattern``). Snapshots that are not asked for cost
nothing: layers whose snapshots no one asks for keep running their kernels
(:mod:`glassllm.kernels`).

Gradients. When a backward pass runs inside the ``with`` block, every recorded
snapshot also gets ``d loss / d snapshot`` under the same name. Each name is
its own node in the graph, so the gradient of a name is the sensitivity of the
loss to *that use* of the value: ``layers.0.attn_norm.in`` holds the same
numbers as ``layers.0.resid_pre``, but its gradient is only the part that flows
through the norm (the residual path is counted in ``resid_pre``'s). Editing a
snapshot by an intervention changes the loss by exactly this gradient, to
first order.

Interventions (:class:`Edit`, :class:`ZeroAblate`, :class:`MeanAblate`,
:class:`Patch`, :class:`MaskOff`, :class:`Temperature`, :class:`Steer`) replace a snapshot
during the forward, so everything downstream sees the new value. The stored
snapshot is the value the model went on with (after the intervention).

Text in: ``trace(model, "Once upon a time", tokenizer=tok)`` encodes the text
as :func:`glassllm.generate.generate` reads a prompt, and the trace keeps the
forward's ``logits`` (like TransformerLens' ``run_with_cache``).

Reading: a :class:`Trace` is a read-only mapping from name to array for its
first forward pass (``t["layers.0.attn.softmax"]``, ``t["attn.softmax", 0]``,
``t.keys()``, ``len(t)``), as TransformerLens' ``ActivationCache`` is;
:meth:`Trace.as_transformer_lens` gives a snapshot in TransformerLens' layout.

Export: :meth:`Trace.save` writes a ``.npz`` (a zip of ``.npy`` arrays) that
also holds ``manifest.json`` (names, shapes, axes, tokens, config);
:func:`load_trace` reads it back, validating every field.

One concept per module: :mod:`~glassllm.trace.registry` (names, axes, shapes,
the docs table), :mod:`~glassllm.trace.tracer` (recording),
:mod:`~glassllm.trace.record` (:class:`Trace`, :class:`Step`, :func:`load_trace`),
:mod:`~glassllm.trace.interventions`, :mod:`~glassllm.trace.files` (the file format),
:mod:`~glassllm.trace.explain` (each snapshot's equation and the line of code that records it).

>>> from glassllm.nn import Transformer
>>> model = Transformer(seed=0)
>>> t = trace(model, [5, 6, 7], names=["layers.0.attn.softmax", "attn.k"])
>>> t.get("layers.0.attn.softmax").shape, t.get("attn.softmax", layer=0, head=3).shape
((4, 3, 3), (3, 3))
>>> t.get("attn.k", layer=1).shape
(2, 3, 32)
"""

import types

from . import circuits, names, patching
from .files import FORMAT, VERSION, validate_manifest
from .interventions import (Edit, Hook, HookContext, Intervention, MaskOff, MeanAblate, Patch, Steer, Temperature,
                            ZeroAblate)
from .labelled import Labelled
from .lens import component_labels, decompose, direct_attribution, lens_top, lens_window, logit_attrs, logit_lens
from .record import Step, Trace, load_trace
from .registry import (DESCRIPTIONS, DOC_BEGIN, DOC_END, axis_sizes, registry, snapshot_shape, snapshot_table,
                       write_snapshot_doc)
from .registry import names as _registry_names
from .tokens import to_str_tokens
from .tracer import IGNORE_INDEX, Tracer, trace
from .tracer import LazyTrace



class _Names(types.ModuleType):
    """``glassllm.trace.names`` is both documented things: called, the registry's names in forward order
    (``glassllm.trace.names()``, :func:`glassllm.trace.registry.names`); its attributes, the TransformerLens
    name map of :mod:`glassllm.trace.names` (``glassllm.trace.names.transformer_lens_name``)."""

    def __call__(self, model_or_config=None) -> list[str]:
        return _registry_names(model_or_config)


names.__class__ = _Names

__all__ = [
    "Tracer", "Trace", "Step", "trace", "LazyTrace", "load_trace", "registry", "names", "snapshot_shape",
    "axis_sizes", "Intervention", "Edit", "ZeroAblate", "MeanAblate", "Patch", "MaskOff", "Temperature", "Steer",
    "snapshot_table", "write_snapshot_doc", "validate_manifest", "FORMAT", "VERSION",
    "DESCRIPTIONS", "DOC_BEGIN", "DOC_END", "IGNORE_INDEX", "Hook", "HookContext", "Labelled",
    "logit_lens", "decompose", "logit_attrs", "component_labels", "to_str_tokens", "lens_top", "lens_window", "direct_attribution", "patching", "circuits", "names",
]
