"""The import graph of ``src/glassllm`` keeps its layers (the table in DEVELOPING.md).

Each module belongs to one layer of the table under "Layers" in DEVELOPING.md,
the one place the layers are written down. A small AST walk over every module
(imports inside functions included) checks that:

- every module is in the table (a new module must be placed);
- no import runs from a lower layer to a higher one;
- there is no import circle, inside a layer either;
- no module imports another module's underscore names, nor reads them off an
  imported module (``from .registry import _index``, ``checkpoint._why``):
  what modules share is public and documented;
- no module reads or writes an underscore *attribute* that another module's
  objects define (``model._tracer`` outside ``nn``): a module touches only its
  own objects' private state (``self._x``, and ``obj._x`` where it defines ``_x``);
- option parsing and ``sys.argv`` live only in the top layer (the commands).

There is no list of exceptions: an ``importlib.import_module("glassllm.x")`` counts as an
import, and a rule that a module breaks is fixed in the module.
"""

from __future__ import annotations

import ast
import doctest
import functools
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "glassllm"
DEVELOPING = ROOT / "DEVELOPING.md"
TABLE_BEGIN = "<!-- BEGIN LAYERS: read by tests/test_architecture.py -->"
TABLE_END = "<!-- END LAYERS -->"


def layer_table() -> dict[str, int]:
    """Module (dotted, without ``glassllm.``; ``__init__`` is the package itself) -> layer number."""
    text = DEVELOPING.read_text(encoding="utf-8")
    assert TABLE_BEGIN in text and TABLE_END in text, f"DEVELOPING.md lacks the layer table markers {TABLE_BEGIN!r}"
    table = text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0]
    layers = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0][:1].isdigit():
            continue                                                      # the header and its rule
        number = int(cells[0].split()[0])
        for name in re.findall(r"`([\w.]+)`", cells[1]):
            assert name not in layers, f"{name} is in two layers of DEVELOPING.md's table"
            layers[name] = number
    assert layers, "DEVELOPING.md's layer table is empty"
    return layers


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str, table: dict[str, int]) -> int | None:
    """The layer of the longest table entry that is ``module`` or a package holding it."""
    if module == "glassllm":
        return table.get("__init__")
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in table:
            return table[key]
    return None


def imports_of(module: str) -> list[tuple[str, str | None, int]]:
    """Every glassllm import of ``module``: (imported module, imported name or None, line)."""
    found = []
    for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            source = _source(module, node)
            if source.split(".")[0] != "glassllm":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in MODULES:                                        # from . import checkpoint
                    found.append((sub, None, node.lineno))
                else:                                                     # from .checkpoint import load_model
                    found.append((source, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == "glassllm"]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and node.args[0].value.startswith("glassllm.")):        # importlib.import_module("glassllm.x")
            found.append((node.args[0].value, None, node.lineno))
    return found


def _source(module: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` in ``module`` reads from."""
    if not node.level:
        return node.module or ""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")[:len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def private_uses(module: str) -> list[tuple[str, int]]:
    """``module.name`` for every underscore name ``module`` takes from another glassllm module."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    uses, bound = [], {}
    for source, name, line in imports_of(module):
        if name is not None and source != module and _private(name):
            uses.append((f"{source}.{name}", line))
    for node in ast.walk(tree):                                           # names bound to glassllm modules
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                target = _bound_module(module, node, alias)
                if target is not None:
                    bound[alias.asname or alias.name.split(".")[0]] = target
    for node in ast.walk(tree):                                           # ... and underscore names read off them
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and _private(node.attr) and bound[node.value.id] != module):
            uses.append((f"{bound[node.value.id]}.{node.attr}", node.lineno))
    return uses


def private_attributes(module: str) -> list[tuple[str, int]]:
    """``obj._x`` (and ``getattr(obj, "_x")``) in ``module`` where ``_x`` is an underscore attribute another
    glassllm module defines and ``module`` does not; ``self``, ``cls`` and ``super()`` are the module's own."""
    defined = {m: _defined_private(m) for m in MODULES}
    own = defined[module]
    others = set().union(*(names for m, names in defined.items() if m != module))
    found = []
    for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
        name = None
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _own_object(node.value):
            name = node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value) and not _own_object(node.args[0])):
            name = node.args[1].value
        if name is not None and name in others and name not in own:
            found.append((name, node.lineno))
    return found


def _defined_private(module: str) -> set[str]:
    """The underscore attributes ``module`` defines: ``self._x = ...``, class-body names, methods."""
    return _defined_private_in(MODULES[module])


@functools.lru_cache(maxsize=None)
def _defined_private_in(path: Path) -> frozenset[str]:
    """:func:`_defined_private` of the module file ``path``, parsed once however many modules ask."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _own_object(node.value):
            names.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                targets = item.targets if isinstance(item, ast.Assign) else (
                    [item.target] if isinstance(item, ast.AnnAssign) else [])
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return frozenset(n for n in names if _private(n))


def _own_object(node) -> bool:
    return (isinstance(node, ast.Name) and node.id in ("self", "cls")) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _bound_module(module: str, node, alias) -> str | None:
    """The glassllm module an import binds to a name (``import glassllm.nn as nn``, ``from . import nn``)."""
    if isinstance(node, ast.Import):
        return alias.name if alias.asname and alias.name in MODULES else None
    sub = f"{_source(module, node)}.{alias.name}"
    return sub if sub in MODULES else None


def graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (``importlib.import_module`` of a glassllm module included)."""
    return {m: {s for s, _, _ in imports_of(m) if s in MODULES and s != m} for m in MODULES}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


# ----------------------------------------------------------------------------
# The rules
# ----------------------------------------------------------------------------

def test_every_module_has_a_layer():
    table = layer_table()
    missing = [m for m in MODULES if layer_of(m, table) is None]
    assert not missing, f"{missing} are in no layer: add them to the table in DEVELOPING.md"


def test_no_import_runs_up_a_layer():
    table = layer_table()
    up = {(m, s): f"{m} (layer {layer_of(m, table)}) imports {s} (layer {layer_of(s, table)}) on line {line}"
          for m in MODULES for s, _, line in imports_of(m)
          if s in MODULES and layer_of(s, table) > layer_of(m, table)}
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(up[k] for k in sorted(up))


def test_no_import_circles():
    found = cycles(graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_module_takes_another_modules_underscore_names():
    found = {(m, name) for m in MODULES for name, _ in private_uses(m)}
    assert not found, ("underscore names used across modules (make them public and documented):\n"
                       + "\n".join(f"{m} uses {name}" for m, name in sorted(found)))


def test_no_module_touches_another_modules_private_attributes():
    found = [f"{m}:{line} uses {name}, which another module's objects define (make it public)"
             for m in MODULES for name, line in private_attributes(m)]
    assert not found, "private attributes used across modules:\n" + "\n".join(found)


def test_the_command_line_lives_in_the_top_layer():
    table = layer_table()
    top = max(table.values())
    found = set()
    for m, path in MODULES.items():
        if layer_of(m, table) == top:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        argv = any(isinstance(n, ast.Attribute) and n.attr == "argv" and isinstance(n.value, ast.Name)
                   and n.value.id == "sys" for n in ast.walk(tree))
        parses = any(isinstance(n, (ast.Import, ast.ImportFrom)) and any(
            a.name == "argparse" for a in n.names) or (isinstance(n, ast.ImportFrom) and n.module == "argparse")
            for n in ast.walk(tree))
        defines = any(isinstance(n, ast.FunctionDef) and n.name == "add_cli" for n in tree.body)
        if argv or parses or defines:
            found.add(m)
    assert not found, f"{sorted(found)} read sys.argv, parse options or define add_cli: that belongs in glassllm.commands"


# ----------------------------------------------------------------------------
# The checker itself catches what it must (on made-up graphs and files)
# ----------------------------------------------------------------------------

def test_cycles_are_found_and_a_tree_has_none():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_layer_of_a_submodule_is_its_packages_unless_listed():
    table = {"__init__": 0, "trace": 3, "torch": 2, "torch.train_ddp": 4}
    assert layer_of("glassllm", table) == 0
    assert layer_of("glassllm.trace.registry", table) == 3
    assert layer_of("glassllm.torch.model", table) == 2 and layer_of("glassllm.torch.train_ddp", table) == 4
    assert layer_of("glassllm.unknown", table) is None


def use_fake_modules(files: dict[str, str], tmp_path, monkeypatch) -> None:
    """Point MODULES at made-up modules ``glassllm.{name}`` with the given source texts."""
    fake = {}
    for name, text in files.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        fake[f"glassllm.{name}"] = path
    monkeypatch.setattr(f"{__name__}.MODULES", fake)


def test_underscore_names_are_found_however_they_are_reached(tmp_path, monkeypatch):
    files = {
        "a": "from .b import _hidden, shown\nfrom . import b\nfrom . import c as see\n"
             "x = b._also + see._too + see.__name__\n",
        "b": "_hidden = _also = shown = 1\n",
        "c": "_too = 2\nfrom .c import _mine\n",
    }
    use_fake_modules(files, tmp_path, monkeypatch)
    assert sorted(n for n, _ in private_uses("glassllm.a")) == ["glassllm.b._also", "glassllm.b._hidden",
                                                                "glassllm.c._too"]
    assert private_uses("glassllm.c") == []                               # a module's own names are its own


def test_an_import_looked_up_when_called_is_an_import(tmp_path, monkeypatch):
    files = {"low": "import importlib\ndef show():\n    return importlib.import_module('glassllm.high').show()\n",
             "high": "from .low import show as _show\ndef show():\n    return 1\n"}
    use_fake_modules(files, tmp_path, monkeypatch)
    assert graph() == {"glassllm.low": {"glassllm.high"}, "glassllm.high": {"glassllm.low"}}
    assert cycles(graph()) == [["glassllm.high", "glassllm.low"]]


def test_private_attributes_of_other_modules_are_found(tmp_path, monkeypatch):
    files = {
        "owner": "class Model:\n    def __init__(self):\n        self._tracer = None\n        self._mine = 1\n"
                 "    def _walk(self):\n        return self._tracer\n",
        "user": "def f(model, other):\n    other._mine = 2\n    getattr(model, '_walk')\n"
                "    return model._tracer, model.__dict__, other._unknown\n",
        "friend": "class Copy:\n    def __init__(self):\n        self._mine = 0\n"
                  "def g(x):\n    return x._mine\n",
    }
    use_fake_modules(files, tmp_path, monkeypatch)
    assert sorted(n for n, _ in private_attributes("glassllm.user")) == ["_mine", "_tracer", "_walk"]
    assert private_attributes("glassllm.owner") == []
    assert private_attributes("glassllm.friend") == []            # it defines _mine on its own objects too


@pytest.mark.parametrize("module", ["checks", "files", "config", "commands", "positions", "interop.hf",
                                    "tokenizers.hfjson", "tokenizers.bpe"])
def test_doctests_of_the_shared_modules(module):
    assert doctest.testmod(importlib.import_module(f"glassllm.{module}")).failed == 0


def _sys_path_edits(tree: ast.AST) -> list[int]:
    """Lines that call a method of ``sys.path`` that changes it (``sys.path.insert(...)``, ``.append`` ...)."""
    edits = {"insert", "append", "extend", "remove", "pop", "clear"}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in edits
            and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "path"
            and isinstance(node.func.value.value, ast.Name) and node.func.value.value.id == "sys"]


def test_sys_path_edits_are_found():
    """The check below can fail: it sees an insert, an append and nothing else."""
    tree = ast.parse("import sys\nsys.path.insert(0, 'src')\nx = 1\nsys.path.append('tests')\nprint(sys.path[0])\n")
    assert _sys_path_edits(tree) == [2, 4]


def test_no_script_edits_sys_path():
    """bench/, tests/ and tools/ import by package from the repository root (``python -m bench.bench_model``)
    and glassllm from the installed package: none of their files edits ``sys.path``."""
    files = [p for folder in ("bench", "tests", "tools") for p in sorted((ROOT / folder).rglob("*.py"))]
    files.append(ROOT / "bench" / "run")
    assert len(files) > 20, "the folders' files were not found"
    found = {str(p.relative_to(ROOT)): lines for p in files
             if (lines := _sys_path_edits(ast.parse(p.read_text(encoding="utf-8"))))}
    assert not found, f"these files edit sys.path (run them as modules from the repository root instead): {found}"
