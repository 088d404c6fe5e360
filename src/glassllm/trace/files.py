"""Trace files: a ``.npz`` (zip of ``.npy`` arrays) with ``manifest.json`` inside.

Members: ``manifest.json``, ``values/{step}/{name}.npy`` and
``grads/{step}/{name}.npy``; ``numpy.load`` reads them all (the manifest as
bytes). The manifest (:func:`validate_manifest`) gives the format name and
version, the model config, the kept batch row, the storage dtype, the
recorded names with their axes, the interventions, the loss (when the
trace back-propagated one), and per step n, m, start, the row's left
padding, tokens, shapes and which names have gradients.

Reading never unpickles, checks every field of the manifest, and checks each
array's header against the manifest before reading its data.
"""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path

import numpy as np

from ..checks import is_int
from ..config import ModelConfig
from ..files import atomic_path
from ..limits import parse_json
from .registry import MAX_LAYERS, STORAGE_DTYPES, axis_sizes, registry

FORMAT = "glassllm-trace"
VERSION = 1
MAX_MANIFEST_BYTES = 64 << 20


def manifest_of(trace) -> dict:
    """The manifest of ``trace`` (a :class:`~glassllm.trace.Trace`): everything but the arrays, as JSON-ready values."""
    steps = []
    for s in trace.steps:
        sizes = axis_sizes(trace.config, s.n, s.m)
        steps.append({
            "n": s.n, "m": s.m, "start": s.start, "pad": s.pad, "tokens": [int(t) for t in s.tokens],
            "shapes": {k: [sizes[a] for a in trace.axes[k]] for k in trace.names() if k in s.values},
            "grads": [k for k in trace.names() if k in s.grads],
        })
    manifest = {
        "format": FORMAT, "version": VERSION, "config": trace.config.to_dict(),
        "batch": trace.batch, "dtype": trace.dtype,
        "names": trace.names(), "axes": {k: list(trace.axes[k]) for k in trace.names()},
        "interventions": list(trace.interventions), "steps": steps,
    }
    if trace.loss is not None:
        manifest["loss"] = float(trace.loss)
    return manifest


def save_trace(trace, path) -> None:
    """Write ``trace`` to ``path`` atomically (uncompressed zip: arrays are read back without inflating)."""
    manifest = manifest_of(trace)
    try:
        with atomic_path(path) as tmp:
            with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
                z.writestr("manifest.json", json.dumps(manifest, indent=1))
                for s in trace.steps:
                    for kind, store in (("values", s.values), ("grads", s.grads)):
                        for k in trace.names():
                            if k in store:
                                with z.open(f"{kind}/{s.index}/{k}.npy", "w", force_zip64=True) as f:
                                    np.lib.format.write_array(f, np.ascontiguousarray(store[k]), allow_pickle=False)
    except OSError as e:
        raise ValueError(f"cannot write trace {str(path)!r}: {e.strerror or e}") from None


# ----------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------

def _fail(msg: str):
    raise ValueError(f"trace manifest: {msg}")


def validate_manifest(manifest) -> dict:
    """Check a trace manifest field by field; return it. Raises ValueError naming the first bad field.

    Fields: ``format`` ("glassllm-trace"), ``version`` (1), ``config`` (a
    ModelConfig dict), ``batch`` (int >= 0), ``dtype`` (float16/32/64),
    ``names`` (registry names), ``axes`` ({name: axis letters}, as the
    registry says), ``interventions`` (strings), optionally ``loss`` (a
    finite number), and ``steps``: a list of {``n``, ``m``, ``start``,
    optionally ``pad`` (0 <= pad <= m; 0 if absent), ``tokens`` (n ids),
    ``shapes`` ({name: shape}), ``grads`` (names)} with m = start + n.
    """
    if not isinstance(manifest, dict):
        _fail(f"expected a JSON object, got {type(manifest).__name__}")
    expected = {"format", "version", "config", "batch", "dtype", "names", "axes", "interventions", "steps"}
    if set(manifest) - {"loss"} != expected:
        extra, missing = sorted(set(manifest) - expected - {"loss"}), sorted(expected - set(manifest))
        _fail(f"missing field {missing[0]!r}" if missing else f"unexpected field {extra[0]!r}")
    if manifest["format"] != FORMAT:
        _fail(f"format is {manifest['format']!r}, expected {FORMAT!r}")
    if not is_int(manifest["version"]) or manifest["version"] != VERSION:
        _fail(f"version is {manifest['version']!r}; this glassllm reads version {VERSION}")
    try:
        config = ModelConfig.from_dict(manifest["config"])
    except (TypeError, ValueError) as e:
        _fail(f"bad config: {e}")
    if config.n_layers > MAX_LAYERS:
        _fail(f"config has {config.n_layers} layers, more than the limit {MAX_LAYERS}")
    if not is_int(manifest["batch"]) or manifest["batch"] < 0:
        _fail(f"batch must be an int >= 0, got {manifest['batch']!r}")
    if manifest["dtype"] not in STORAGE_DTYPES:
        _fail(f"dtype must be one of {STORAGE_DTYPES}, got {manifest['dtype']!r}")
    axes = registry(config)
    recorded = manifest["names"]
    if not isinstance(recorded, list) or not all(isinstance(k, str) for k in recorded):
        _fail("names must be a list of strings")
    for k in recorded:
        if k not in axes:
            _fail(f"unknown snapshot name {k!r}")
    if len(set(recorded)) != len(recorded):
        _fail("names has duplicates")
    if not isinstance(manifest["axes"], dict) or set(manifest["axes"]) != set(recorded):
        _fail("axes must map exactly the recorded names to their axes")
    for k, a in manifest["axes"].items():
        if a != list(axes[k]):
            _fail(f"axes of {k!r} are {a!r}, expected {list(axes[k])}")
    ivs = manifest["interventions"]
    if not isinstance(ivs, list) or not all(isinstance(s, str) for s in ivs):
        _fail("interventions must be a list of strings")
    steps = manifest["steps"]
    if not isinstance(steps, list):
        _fail("steps must be a list")
    loss = manifest.get("loss")
    if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss)):
        _fail(f"loss must be a finite number, got {loss!r}")
    step_fields = {"n", "m", "start", "tokens", "shapes", "grads"}
    for i, s in enumerate(steps):
        if not isinstance(s, dict) or set(s) - {"pad"} != step_fields:
            _fail(f"step {i} must be an object with fields {sorted(step_fields)} (and optionally 'pad')")
        n, m, start = s["n"], s["m"], s["start"]
        if not (is_int(n) and is_int(m) and is_int(start) and n >= 1 and start >= 0 and m == start + n
                and m <= config.max_seq_len):
            _fail(f"step {i}: need ints n >= 1, start >= 0, m = start + n <= {config.max_seq_len}; "
                  f"got n={n!r}, m={m!r}, start={start!r}")
        pad = s.get("pad", 0)
        if not (is_int(pad) and 0 <= pad <= m):
            _fail(f"step {i}: pad must be an int in [0, m={m}], got {pad!r}")
        tokens = s["tokens"]
        if (not isinstance(tokens, list) or len(tokens) != n
                or not all(is_int(t) and 0 <= t < config.vocab_size for t in tokens)):
            _fail(f"step {i}: tokens must be {n} ids in [0, {config.vocab_size})")
        shapes = s["shapes"]
        if not isinstance(shapes, dict) or not set(shapes) <= set(recorded):
            _fail(f"step {i}: shapes must map recorded names to shapes")
        sizes = axis_sizes(config, n, m)
        for k, shape in shapes.items():
            if shape != [sizes[a] for a in axes[k]]:
                _fail(f"step {i}: shape of {k!r} is {shape!r}, expected {[sizes[a] for a in axes[k]]}")
        grads = s["grads"]
        if not isinstance(grads, list) or not all(isinstance(k, str) and k in shapes for k in grads) \
                or len(set(grads)) != len(grads):
            _fail(f"step {i}: grads must list recorded names that have values")
        if any(k.endswith("attn.mask") for k in grads):
            _fail(f"step {i}: a mask has no gradient")
    return manifest


def read_trace_file(path) -> tuple[dict, list[tuple[dict, dict]]]:
    """Read a trace file written by :meth:`Trace.save`; every field and array is checked.

    Returns the validated manifest and, per step, ``(values, grads)``: snapshot name -> read-only
    array. :func:`glassllm.trace.load_trace` turns them into a :class:`~glassllm.trace.Trace`.
    Raises ValueError (one line, naming the file) for anything malformed.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"trace file {str(path)!r} does not exist or is not a file")
    try:
        with zipfile.ZipFile(path) as z:
            return _read_trace(z, str(path), path.stat().st_size)
    except zipfile.BadZipFile as e:
        raise ValueError(f"{str(path)!r} is not a trace file: {e}") from None
    except (OSError, EOFError, zipfile.LargeZipFile, NotImplementedError, RuntimeError) as e:
        raise ValueError(f"cannot read {str(path)!r}: {getattr(e, 'strerror', None) or e}") from None


def _read_trace(z: zipfile.ZipFile, where: str, size: int) -> tuple[dict, list[tuple[dict, dict]]]:
    members = {info.filename: info for info in z.infolist()}
    for info in members.values():            # what each member claims must fit the archive's own bytes
        if info.compress_size > size or (info.compress_type == zipfile.ZIP_STORED and info.file_size > size):
            raise ValueError(f"{where!r}: member {info.filename[:60]!r} claims {info.file_size:,} bytes but the "
                             f"whole file has {size:,}; expected a trace file written by Trace.save")
    info = members.get("manifest.json")
    if info is None:
        raise ValueError(f"{where!r} is not a trace file: it has no manifest.json")
    if info.file_size > MAX_MANIFEST_BYTES:
        raise ValueError(f"{where!r}: manifest.json is {info.file_size} bytes, larger than the limit")
    try:
        manifest = parse_json(z.read(info), "manifest.json")
    except ValueError as e:
        raise ValueError(f"{where!r}: {e}") from None
    try:
        validate_manifest(manifest)
    except ValueError as e:
        raise ValueError(f"{where!r}: {e}") from None

    dtype = np.dtype(manifest["dtype"])
    expected = {"manifest.json"}
    steps = []
    for i, s in enumerate(manifest["steps"]):
        values, grads = {}, {}
        for kind, names_ in (("values", list(s["shapes"])), ("grads", s["grads"])):
            for k in names_:
                member = f"{kind}/{i}/{k}.npy"
                expected.add(member)
                if member not in members:
                    raise ValueError(f"{where!r}: missing array {member!r}")
                want = np.dtype(bool) if (kind == "values" and k.endswith("attn.mask")) else dtype
                arr = _read_npy(z, members[member], tuple(s["shapes"][k]), want, where)
                (values if kind == "values" else grads)[k] = arr
        steps.append((values, grads))
    extra = sorted(set(members) - expected)
    if extra:
        raise ValueError(f"{where!r}: unexpected member {extra[0]!r}")
    return manifest, steps


def _read_npy(z: zipfile.ZipFile, info: zipfile.ZipInfo, shape: tuple, dtype: np.dtype, where: str) -> np.ndarray:
    """One .npy member, its header checked against the manifest before any data is read."""
    fmt = np.lib.format
    nbytes = math.prod(shape) * dtype.itemsize
    # The declared size bounds what a read can return; refuse a member too small for
    # the manifest's shape, or one that inflates absurdly (a zip bomb).
    if info.file_size < nbytes or info.file_size > 1024 * max(info.compress_size, 1) + 65536:
        raise ValueError(f"{where!r}: {info.filename!r} is {info.file_size} bytes, "
                         f"which cannot hold {dtype} {shape}")
    with z.open(info) as f:
        try:
            version = fmt.read_magic(f)
            if version == (1, 0):
                got_shape, fortran, got_dtype = fmt.read_array_header_1_0(f)
            elif version == (2, 0):
                got_shape, fortran, got_dtype = fmt.read_array_header_2_0(f)
            else:
                raise ValueError(f"npy version {version}")
        except ValueError as e:
            raise ValueError(f"{where!r}: {info.filename!r} is not a valid .npy array: {e}") from None
        if tuple(got_shape) != shape or got_dtype != dtype or fortran:
            raise ValueError(f"{where!r}: {info.filename!r} holds {got_dtype} {tuple(got_shape)}, "
                             f"the manifest says {dtype} {shape}")
        data = f.read(nbytes + 1)
    if len(data) != nbytes:
        raise ValueError(f"{where!r}: {info.filename!r} has {len(data)} data bytes, expected {nbytes}")
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    arr.flags.writeable = False
    return arr

