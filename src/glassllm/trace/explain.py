"""What each snapshot is: its equation, and the line of code that records it.

Every snapshot name of the registry has an equation (:data:`EQUATIONS`, in
LaTeX and in plain text, in the notation of the lessons and the glossary) and
a *site*: the file, line and statement of the ``self.snap("...", ...)`` call
that hands it to the tracer. Sites are not written down anywhere; they are
found by walking the syntax tree of the module that defines each snapshot
(:func:`snap_sites`), so a line that moves moves its pointer with it.

>>> s = explain("layers.0.attn.scores")
>>> s["equation"]["text"]
'S = Q Kᵀ / √D'
>>> s["function"], 'self.snap("scores"' in s["code"]
('Attention.__call__', True)
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

from ..config import ModelConfig

def _rmsnorm(prefix: str, v: str, hat: str, given: tuple[str, str] | None = None) -> dict:
    """The three snapshots of an RMSNorm whose input is called ``v`` (output ``hat``, as text)."""
    return {f"{prefix}.in": given or (v, v),
            f"{prefix}.rms": (rf"r_i = \sqrt{{\tfrac{{1}}{{C}}\textstyle\sum_c {v}_{{ic}}^2 + \varepsilon}}",
                              f"rᵢ = √(mean({v}ᵢ²) + ε)"),
            f"{prefix}.out": (rf"\hat{{{v}}}_i = {v}_i / r_i \odot w", f"{hat}ᵢ = {v}ᵢ / rᵢ ⊙ w")}


# Keys are snapshot names with the layer number removed ("attn.scores"). Symbols: x the residual
# stream entering a block, h after its attention, t_i the i-th token, E the embedding matrix, w an
# RMSNorm's weight, W_Q W_K W_V W_O the attention projections, W_1 W_2 W_3 the MLP's, ε the norm's eps.
EQUATIONS: dict[str, tuple[str, str]] = {
    "embed": (r"x_i = E_{t_i}", "xᵢ = E[tᵢ]"),
    "resid_pre": (r"x = x^{(\ell-1)}_{\mathrm{post}} \quad (x = \mathrm{embed}\ \text{in layer } 0)",
                  "x = resid_post of the layer before (embed in layer 0)"),
    **_rmsnorm("attn_norm", "x", "x̂"),
    "attn.q": (r"Q = \hat{x} W_Q^\top", "Q = x̂ W_Qᵀ"),
    "attn.k": (r"K = \hat{x} W_K^\top", "K = x̂ W_Kᵀ"),
    "attn.v": (r"V = \hat{x} W_V^\top", "V = x̂ W_Vᵀ"),
    "attn.rope_q": (r"Q_i \leftarrow R_{\mathrm{start}+i}\, Q_i", "Qᵢ ← R(start + i) Qᵢ"),
    "attn.rope_k": (r"K_i \leftarrow R_{\mathrm{start}+i}\, K_i", "Kᵢ ← R(start + i) Kᵢ"),
    "attn.cache_k": (r"K = [K_{\mathrm{cache}};\ K]", "K = [K_cache; K]"),
    "attn.cache_v": (r"V = [V_{\mathrm{cache}};\ V]", "V = [V_cache; V]"),
    "attn.scores": (r"S = Q K^\top / \sqrt{D}", "S = Q Kᵀ / √D"),
    "attn.mask": (r"M_{ij} = [\, j > \mathrm{start} + i \,]", "Mᵢⱼ = (j > start + i)"),
    "attn.softmax": (r"A_{ij} = \frac{e^{S_{ij}}}{\sum_{k:\, \neg M_{ik}} e^{S_{ik}}}\ \text{if } \neg M_{ij},"
                     r"\ \text{else } 0",
                     "A = softmaxⱼ(S with S[M] = −∞)"),
    "attn.mix": (r"Z = A V", "Z = A V"),
    "attn.head_out": (r"O_h = Z_h\, W_{O,h}^\top", "Oₕ = Zₕ W_O[:, h]ᵀ"),
    "attn.out": (r"o = \textstyle\sum_h O_h", "o = Σₕ Oₕ"),
    "resid_mid": (r"h = x + o", "h = x + o"),
    **_rmsnorm("mlp_norm", "h", "ĥ"),
    "mlp.gate": (r"g = \hat{h} W_1^\top", "g = ĥ W₁ᵀ"),
    "mlp.up": (r"u = \hat{h} W_3^\top", "u = ĥ W₃ᵀ"),
    "mlp.act": (r"a = \mathrm{silu}(g) = g \cdot \sigma(g)", "a = silu(g) = g · σ(g)"),
    "mlp.prod": (r"p = a \odot u", "p = a ⊙ u"),
    "mlp.out": (r"f = p\, W_2^\top", "f = p W₂ᵀ"),
    "resid_post": (r"x^{(\ell)}_{\mathrm{post}} = h + f", "x_post = h + f"),
    **_rmsnorm("norm", "y", "ŷ", (r"y = x^{(L-1)}_{\mathrm{post}}", "y = resid_post of the last layer")),
    "logits": (r"z = \hat{y}\, W_{\mathrm{out}}^\top", "z = ŷ W_outᵀ"),
    "probs": (r"P_{iv} = e^{z_{iv}} / \textstyle\sum_u e^{z_{iu}}", "Pᵢᵥ = softmaxᵥ(zᵢ)"),
}

# What each snapshot is; keys are names with the layer number removed.
DESCRIPTIONS = {
    "embed": "token embedding rows: the residual stream entering layer 0",
    "resid_pre": "residual stream entering the block",
    "attn_norm.in": "input of the attention RMSNorm (same values as resid_pre; its gradient is the norm's share)",
    "attn_norm.rms": "root mean square of each position's vector, `sqrt(mean(in**2) + eps)`",
    "attn_norm.out": "normalised input of attention: `in / rms * weight`",
    "attn.q": "queries: `attn_norm.out @ wq.T`, split into heads",
    "attn.k": "keys: `attn_norm.out @ wk.T`, one per key/value head",
    "attn.v": "values: `attn_norm.out @ wv.T`, one per key/value head",
    "attn.rope_q": "queries rotated by their absolute positions (RoPE, interleaved pairs)",
    "attn.rope_k": "keys rotated by their absolute positions",
    "attn.cache_k": "all m keys the queries read: the cached ones followed by rope_k",
    "attn.cache_v": "all m values the queries read: the cached ones followed by v",
    "attn.scores": "`rope_q @ cache_k.T / sqrt(D)`, each K/V head serving its query heads; before the mask",
    "attn.mask": "True where key j is in query i's future (forbidden)",
    "attn.softmax": "attention weights: softmax over keys of the masked scores; rows sum to 1",
    "attn.mix": "per-head outputs: `softmax @ cache_v`, before the output projection",
    "attn.head_out": "each head's share of the output: its slice of `mix` @ its slice of `wo.T`; "
                     "they sum to `out`",
    "attn.out": "heads concatenated and projected: `concat(mix) @ wo.T`",
    "resid_mid": "residual stream after attention: `resid_pre + attn.out`",
    "mlp_norm.in": "input of the MLP RMSNorm (same values as resid_mid; its gradient is the norm's share)",
    "mlp_norm.rms": "root mean square of each position's vector",
    "mlp_norm.out": "normalised input of the MLP",
    "mlp.gate": "gate pre-activation: `mlp_norm.out @ w1.T`",
    "mlp.up": "up projection: `mlp_norm.out @ w3.T`",
    "mlp.act": "`silu(gate) = gate * sigmoid(gate)`",
    "mlp.prod": "`act * up`, the SwiGLU hidden vector",
    "mlp.out": "down projection: `prod @ w2.T`",
    "resid_post": "residual stream after the MLP: `resid_mid + mlp.out`",
    "norm.in": "input of the final RMSNorm (the last block's output)",
    "norm.rms": "root mean square of each position's vector",
    "norm.out": "normalised final residual stream",
    "logits": "next-token scores over the vocabulary",
    "probs": "softmax of the logits: next-token probabilities",
}

SNAP_METHODS = ("snap", "snap_derived")
CONTEXT = 3                                 # lines shown before and after a site


@dataclass(frozen=True)
class Site:
    """Where one snapshot is recorded: ``file`` (absolute), ``path`` (from the package's parent,
    ``glassllm/nn.py``), ``line`` (of the snap call), the whole statement's lines and text."""

    file: str
    path: str
    function: str
    local: str
    line: int
    first: int
    last: int
    code: str


def local_name(name: str) -> str:
    """``layers.2.attn.softmax`` -> ``attn.softmax`` (the key of :data:`EQUATIONS`)."""
    return re.sub(r"^layers\.(\d+|\{i\})\.", "", name)


def equation(name: str) -> dict:
    """``{"latex": ..., "text": ...}`` of a snapshot name (full or layer-local)."""
    key = local_name(name)
    if key not in EQUATIONS:
        raise ValueError(f"no snapshot is named {name!r}")
    latex, text = EQUATIONS[key]
    return {"latex": latex, "text": text}


def snap_sites(path) -> dict[tuple[str, str], Site]:
    """Every ``self.snap("local", ...)`` (or ``snap_derived``) call of the classes in the Python file
    ``path``: ``(class name, local name) -> Site``. An AST walk of the file as it is now."""
    return dict(_snap_sites(str(Path(path).resolve())))


@lru_cache(maxsize=16)
def _cached_sites(file: str, mtime_ns: int, size: int) -> tuple:
    source = Path(file).read_text(encoding="utf-8")
    lines = source.splitlines()
    shown = _shown_path(file)
    out = {}
    for cls in ast.parse(source, filename=file).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for func in cls.body:
            if not isinstance(func, ast.FunctionDef):
                continue
            for stmt in ast.walk(func):
                if not isinstance(stmt, ast.stmt) or hasattr(stmt, "body"):
                    continue                                    # the innermost simple statements
                for call in ast.walk(stmt):
                    local = _snap_local(call)
                    if local is None or (cls.name, local) in out:
                        continue
                    code = "\n".join(lines[stmt.lineno - 1:stmt.end_lineno])
                    out[(cls.name, local)] = Site(file, shown, f"{cls.name}.{func.name}", local, call.lineno,
                                                  stmt.lineno, stmt.end_lineno, _dedent(code))
    return tuple(out.items())


def _snap_sites(file: str) -> tuple:
    st = Path(file).stat()
    return _cached_sites(file, st.st_mtime_ns, st.st_size)


def _snap_local(node) -> str | None:
    """The local name of a ``self.snap("name", ...)`` call node, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SNAP_METHODS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "self" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return None


def _dedent(code: str) -> str:
    lines = code.splitlines()
    indent = min((len(s) - len(s.lstrip()) for s in lines if s.strip()), default=0)
    return "\n".join(s[indent:] for s in lines)


def _shown_path(file: str) -> str:
    parts = Path(file).parts
    return "/".join(parts[parts.index("glassllm"):]) if "glassllm" in parts else Path(file).name


@lru_cache(maxsize=1)
def snapshot_classes() -> tuple:
    """``(generic name, class, local name)`` of every snapshot, in forward order: which module class
    records it (``layers.{i}.attn.scores`` -> ``Attention``, ``"scores"``)."""
    from ..nn import Module, Transformer

    tiny = ModelConfig(vocab_size=1, dim=2, n_layers=1, n_heads=1, n_kv_heads=1, ffn_dim=1, max_seq_len=1)
    model = Transformer(tiny, seed=0)
    owner = {}
    for module in model.modules():
        for local, full in zip(type(module).SNAPSHOTS, Module.snapshot_axes(module)):
            owner[re.sub(r"^layers\.\d+\.", "layers.{i}.", full)] = (type(module), local)
    generic = dict.fromkeys(re.sub(r"^layers\.\d+\.", "layers.{i}.", k) for k in model.snapshot_axes())
    return tuple((g, *owner[g]) for g in generic)


def sites() -> dict[str, Site]:
    """Generic snapshot name (``layers.{i}.attn.scores``) -> the :class:`Site` that records it, found in the
    source of the class that computes it."""
    out = {}
    for generic, cls, local in snapshot_classes():
        found = snap_sites(inspect.getsourcefile(cls))
        if (cls.__name__, local) not in found:
            raise LookupError(f"{cls.__name__} lists snapshot {local!r} in SNAPSHOTS but no self.snap({local!r}, ...) "
                              "call records it")
        out[generic] = found[(cls.__name__, local)]
    return out


def check_sites(recorded: dict[str, Site], path) -> list[str]:
    """The problems of ``recorded`` sites against the file ``path``: each recorded line must hold the snap call
    of its snapshot (an empty list: every pointer is right)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    problems = []
    for generic, site in recorded.items():
        text = lines[site.line - 1] if 0 < site.line <= len(lines) else ""
        if not re.search(rf"self\.(?:{'|'.join(SNAP_METHODS)})\(\s*[\"']{re.escape(site.local)}[\"']", text):
            problems.append(f"{generic}: line {site.line} of {path} is {text.strip()!r}, not its "
                            f"self.snap({site.local!r}, ...) call")
    return problems


def explain(name: str) -> dict:
    """Everything the glass says about snapshot ``name`` (full, generic or layer-local): its generic
    name, equation, description, and site with the lines around it (``context``: [line number, text])."""
    key = local_name(name)
    table = {local_name(g): g for g, _, _ in snapshot_classes()}
    if key not in table:
        raise ValueError(f"no snapshot is named {name!r}")
    generic = table[key]
    site = sites()[generic]
    lines = Path(site.file).read_text(encoding="utf-8").splitlines()
    lo, hi = max(1, site.first - CONTEXT), min(len(lines), site.last + CONTEXT)
    indent = min((len(s) - len(s.lstrip()) for s in lines[lo - 1:hi] if s.strip()), default=0)
    info = {k: v for k, v in asdict(site).items() if k != "file"}
    return {"name": generic, "equation": equation(key), "description": DESCRIPTIONS[key], **info,
            "context": [[i, lines[i - 1][indent:]] for i in range(lo, hi + 1)]}


def explain_all() -> dict[str, dict]:
    """:func:`explain` of every snapshot, by layer-local name (``attn.scores``), in forward order: what the
    inspector page carries."""
    return {local_name(g): explain(g) for g, _, _ in snapshot_classes()}
