"""The house in order (docs/architecture.md): import-linter's contracts hold (layers, pure modules
free of torch / transformers / peft / vllm / optuna), every module of race/ is placed in a layer,
and no import circle exists among race modules, imports inside functions included."""
from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    out = subprocess.run([exe, "--config", str(ROOT / ".importlinter")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "2 kept, 0 broken" in out.stdout


def _graph():
    import grimp

    sys.path.insert(0, str(ROOT))
    return grimp.build_graph("race", include_external_packages=False)


def test_every_module_is_placed_in_a_layer():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")
    placed = {name.strip() for line in cfg["importlinter:contract:layers"]["layers"].splitlines()
              for part in line.replace(":", "|").split("|") for name in [part] if name.strip()}
    graph = _graph()
    loose = [m for m in graph.modules if m != "race"
             and not any(m == p or m.startswith(p + ".") for p in placed)]
    assert not loose, f"modules in no layer of .importlinter: {sorted(loose)}"


def test_no_import_circles_lazy_imports_included():
    graph = _graph()
    modules = sorted(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:                    # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for m in modules:
        if m not in index:
            visit(m)
    assert not circles, circles


def test_no_module_uses_another_modules_private_names():
    """A name with a leading underscore stays inside its module: no ``from race.x import _y``, and
    no ``x._y`` on an imported race module (issue 34; public helpers carry public names)."""
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "race"
    private = lambda n: n.startswith("_") and not n.startswith("__")  # noqa: E731
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = set()                      # local names bound to race modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "race":
                found += [f"{path.name}: from {node.module} import {a.name}" for a in node.names if private(a.name)]
                modules |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("race")}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name)
                    and node.value.id in modules and node.value.id not in ("self", "cls")):
                found.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert not found, found
