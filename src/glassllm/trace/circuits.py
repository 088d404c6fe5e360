"""A head's weights as circuits: what it writes (OV), where it looks (QK at a relative offset), and copying.

Row-vector convention, as in the model (``y = x @ W.T``); ``x`` is the
attention's normalised input ``attn_norm.out`` (n, C). Query head h reads
key/value head ``h // (H // G)``.

* :func:`ov` (C, C): a key position's x, through the head's value and output
  matrices, is ``x @ ov(...)``: the head writes ``softmax @ x @ ov`` into the
  residual stream (its ``attn.head_out``).
* :func:`qk` (C, C): with RoPE the score depends on the offset i - j between
  query and key, so the matrix is taken at one offset: ``attn.scores[h, i, j]
  = x_i @ qk(..., offset=i - j) @ x_j``.
* :func:`copying_score`: does the head's full OV circuit -- a token's
  embedding in, through the attention norm's gain, OV, the final norm's gain
  and the output matrix -- raise the logit of the token it read? The score
  (Elhage et al., *A Mathematical Framework for Transformer Circuits*) is
  ``sum(eigenvalues) / sum(|eigenvalues|)`` of that V x V matrix, computed on
  its C x C factor: near 1 for a copying head, near -1 for one that
  suppresses what it reads. The norms' per-position scales are positive
  numbers left out.
"""

from __future__ import annotations

import math

import numpy as np

from ..checks import is_int
from .labelled import Labelled
from .registry import check_index, check_layer


def _head(model, layer, head):
    c = model.config
    layer = check_layer(layer, c.n_layers)
    head = check_index(head, "head", c.n_heads)
    return model.layers[layer].attention, head, head // (c.n_heads // c.n_kv_heads), c.head_dim


def ov(model, layer: int, head: int) -> np.ndarray:
    """The head's OV circuit (C, C): ``W_V[g].T @ W_O[:, h].T``, applied as ``x @ ov``.

    >>> from glassllm.nn import Transformer
    >>> ov(Transformer(seed=0), layer=-1, head=2).shape
    (128, 128)
    """
    attention, h, g, D = _head(model, layer, head)
    wv = attention.wv.weight.data[g * D:(g + 1) * D]                   # (D, C)
    wo = attention.wo.weight.data[:, h * D:(h + 1) * D]                # (C, D)
    return wv.T @ wo.T                                                 # (C, C)


def qk(model, layer: int, head: int, offset: int = 0) -> np.ndarray:
    """The head's QK circuit (C, C) for a key ``offset`` positions before the query (RoPE included).

    ``W_Q[h].T @ R[offset] @ W_K[g] / sqrt(D)``, where ``R[p]`` turns a row
    vector by position p (:meth:`glassllm.nn.Rotary.matrices`); rotating the
    query by i and the key by j meets at ``R[i] @ R[j].T = R[i - j]``.
    """
    attention, h, g, D = _head(model, layer, head)
    limit = model.config.max_seq_len
    if not is_int(offset) or not 0 <= offset < limit:
        raise ValueError(f"offset must be an int in 0..{limit - 1} (a key at or before its query), got {offset!r}")
    wq = attention.wq.weight.data[h * D:(h + 1) * D]                   # (D, C)
    wk = attention.wk.weight.data[g * D:(g + 1) * D]                   # (D, C)
    R = model.rotary.matrices(offset + 1)[offset]                      # (D, D)
    return wq.T @ R @ wk / math.sqrt(D)                                # (C, C)


def copying_score(model, layer: int, head: int) -> float:
    """``sum(eig) / sum(|eig|)`` of the head's full OV circuit, token in to logit out: in [-1, 1].

    The V x V circuit ``E diag(g1) OV diag(g2) U.T`` (E the embedding, U the
    output matrix, g1 and g2 the attention and final norms' gains) has the
    same non-zero eigenvalues as its C x C rotation ``diag(g1) OV diag(g2) U.T E``.
    """
    attention, h, _, _ = _head(model, layer, head)
    layer = check_layer(layer, model.config.n_layers)
    g1 = model.layers[layer].attention_norm.weight.data                 # (C,)
    g2 = model.norm.weight.data                                         # (C,)
    E, U = model.tok_embeddings.weight.data, model.output.weight.data  # (V, C), (V, C)
    small = (g1[:, None] * ov(model, layer, h) * g2[None, :]) @ (U.T @ E)   # (C, C)
    eig = np.linalg.eigvals(small.astype(np.float64))
    return float(eig.sum().real / np.abs(eig).sum())


def copying_scores(model) -> Labelled:
    """:func:`copying_score` of every head: (L, H), axes ``layer``, ``head``."""
    c = model.config
    values = [[copying_score(model, i, h) for h in range(c.n_heads)] for i in range(c.n_layers)]
    return Labelled(values, ("layer", "head"), [range(c.n_layers), range(c.n_heads)], "OV copying score")
