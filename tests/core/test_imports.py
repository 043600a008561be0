"""The package's import structure: the pure core imports no engine, and no two modules import each
other (lazy imports inside functions included: a lazy import is a cycle hidden, not a cycle gone)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "checkpoint_lib"
ENGINES = ("pyspark", "delta", "deltalake", "airflow", "great_expectations", "pandas", "pyarrow", "py4j")


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is a package __init__)}`` for every module of ``package``."""
    found = {}
    for path in (root / package).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def imports(name: str, path: Path, is_package: bool) -> set[str]:
    """Every name ``name`` imports, anywhere in the file, relative imports resolved."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out |= {target} | {f"{target}.{a.name}" for a in node.names}
    return out


def graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (packages' ``__init__`` re-exports left out)."""
    mods = modules(root, package)
    edges = {}
    for name, (path, is_package) in mods.items():
        deps = set()
        for target in imports(name, path, is_package):
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name and not mods[target][1]:
                deps.add(target)
        edges[name] = deps
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", [PACKAGE, "bench"])
def test_no_two_modules_import_each_other(package):
    assert cycles(graph(ROOT, package)) == []


def fake_package(root: Path, modules: dict[str, str]) -> Path:
    """A package named like ours under ``root``: an empty ``__init__`` and ``modules`` (name -> source)."""
    pkg = root / PACKAGE
    pkg.mkdir()
    for name, source in {"__init__": "", **modules}.items():
        (pkg / f"{name}.py").write_text(source)
    return root


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import(tmp_path):
    fake_package(tmp_path, {"a": "from .b import x\n", "b": "x = 1\ndef f():\n    from . import a\n",
                            "c": "from checkpoint_lib.a import x\n"})
    assert cycles(graph(tmp_path)) == [["checkpoint_lib.a", "checkpoint_lib.b"]]


def test_the_core_imports_only_the_standard_library_and_itself():
    core = f"{PACKAGE}.core"
    outside = {
        name: sorted(t for t in imports(name, path, is_package)
                     if t.split(".")[0] not in sys.stdlib_module_names and not t.startswith(core)
                     and t != "__future__" and not t.startswith("__future__."))
        for name, (path, is_package) in modules().items() if name == core or name.startswith(core + ".")
    }
    assert not {k: v for k, v in outside.items() if v}


def test_importing_the_core_loads_no_engine():
    code = ("import sys, pkgutil, importlib, checkpoint_lib.core as c\n"
            "for m in pkgutil.iter_modules(c.__path__): importlib.import_module(f'checkpoint_lib.core.{m.name}')\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {ENGINES!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def private_uses(root: Path = ROOT, package: str = PACKAGE) -> list[str]:
    """Each use of another module's private name (``_x``, not a dunder): imported by name
    (``from .log import _actions``) or reached through an imported module (``log._actions``)."""
    mods = modules(root, package)
    found = []

    def private(attr: str) -> bool:
        return attr.startswith("_") and not attr.startswith("__")

    for name, (path, is_package) in sorted(mods.items()):
        aliases: dict[str, str] = {}  # a local name bound to one of the package's modules
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
                for a in node.names:
                    if f"{target}.{a.name}" in mods:
                        aliases[a.asname or a.name] = f"{target}.{a.name}"
                    elif private(a.name) and target in mods and target != name:
                        found.append(f"{name}:{node.lineno} imports {target}.{a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name)
                    and aliases.get(node.value.id, name) != name):
                found.append(f"{name}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names():
    assert private_uses() == []


def test_the_private_use_finder_finds_both_kinds(tmp_path):
    fake_package(tmp_path, {
        "a": "def _helper(): pass\n_x = 1\ndef public(): return _helper()\n",
        "b": "from .a import _helper\n",
        "c": "from . import a\ndef f(): return a._x\n",
        "d": "from . import a\ndef f(self): return self._x, a.public()\n",
    })
    assert private_uses(tmp_path) == ["checkpoint_lib.b:1 imports checkpoint_lib.a._helper",
                                      "checkpoint_lib.c:2 uses checkpoint_lib.a._x"]
