"""The house in order (docs/architecture.md): import-linter's contracts hold (the packages layered,
the modules inside each package layered, pure packages free of torch / transformers / peft / vllm /
optuna), every module of race/ is placed in its package's layers, no import circle exists among race
modules (imports inside functions included), each package's ``__init__`` states its interface,
the map in docs/architecture.md names every module, and no module of race/ or research/scripts/ is
over 600 lines nor any function over 60 (issue 52)."""
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
    assert "10 kept, 0 broken" in out.stdout


def _graph():
    import grimp

    sys.path.insert(0, str(ROOT))
    return grimp.build_graph("race", include_external_packages=False)


def _contracts() -> dict[str, list[str]]:
    """Each layers contract of .importlinter → the names it places (packages or modules)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")
    out = {}
    for section in cfg.sections():
        if cfg[section].get("type") == "layers":
            out[section.split(":")[-1]] = [name.strip() for line in cfg[section]["layers"].splitlines()
                                           for name in line.replace(":", "|").split("|") if name.strip()]
    return out


def _packages() -> list[str]:
    return sorted(p.name for p in (ROOT / "race").iterdir() if (p / "__init__.py").is_file())


def test_every_module_is_placed_in_a_layer():
    """The packages are layered, and every module of a package sits in that package's own layers."""
    contracts = _contracts()
    packages = _packages()
    assert len(packages) <= 8, f"{len(packages)} packages under race/ (at most 8): {packages}"
    assert set(contracts["packages"]) >= {f"race.{p}" for p in packages}, contracts["packages"]
    graph = _graph()
    loose = []
    for m in graph.modules:
        parts = m.split(".")
        if m == "race" or (len(parts) == 2 and m in contracts["packages"]) or m in {f"race.{p}" for p in packages}:
            continue
        inner = contracts.get(parts[1], [])
        if not any(m == p or m.startswith(p + ".") for p in inner):
            loose.append(m)
    assert not loose, f"modules in no layer of their package's contract in .importlinter: {sorted(loose)}"


def test_every_package_states_its_interface():
    """Each package's ``__init__`` docstring says what the package holds, names its interface (an
    ``Interface:`` list naming each of its modules) and its invariants."""
    import ast

    for name in _packages():
        folder = ROOT / "race" / name
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))) or ""
        assert "Interface:" in doc and "Invariants:" in doc, f"race/{name}/__init__.py: no Interface / Invariants"
        modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
        modules += sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())
        missing = [m for m in modules if f"``{m}``" not in doc]
        assert not missing, f"race/{name}/__init__.py does not name {missing}"


def test_the_map_names_every_module():
    """docs/architecture.md names every module of race/ by its path under race/."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = []
    for path in sorted((ROOT / "race").rglob("*.py")):
        rel = path.relative_to(ROOT / "race")
        if rel.name == "__init__.py" and len(rel.parts) > 2:
            continue                             # a subpackage's __init__: named with its folder
        name = rel.as_posix() if rel.name != "__init__.py" else rel.parent.as_posix() + "/"
        if rel.as_posix() in ("__init__.py", "__main__.py"):
            continue
        if len(rel.parts) > 2:                   # inside a subpackage: its folder names it
            name = rel.parent.as_posix() + "/"
        if f"`{name}`" not in text and f"`{rel.as_posix()}`" not in text:
            missing.append(name)
    assert not missing, f"docs/architecture.md does not name: {sorted(set(missing))}"


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


def _script_imports(folder: Path) -> dict[str, set[str]]:
    """Each script of ``folder`` → the sibling scripts it imports (imports inside functions included)."""
    import ast

    names = {p.stem for p in folder.glob("*.py")}
    out: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
        out[path.stem] = (found & names) - {path.stem}
    return out


def test_research_scripts_import_without_circles_and_no_private_names():
    """research/scripts: the scripts import each other downward only (validation.py is their shared
    module), and nothing of RACE by a private name (issue 52)."""
    import ast
    from graphlib import CycleError, TopologicalSorter

    folder = ROOT / "research" / "scripts"
    graph = _script_imports(folder)
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as e:
        raise AssertionError(f"an import circle among research/scripts: {e.args[1]}") from None
    private = []
    for path in sorted((ROOT / "research").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("race"):
                private += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert not private, private


def test_modules_and_functions_stay_small():
    """Issue 52's size targets: no module of race/ or research/scripts/ over 600 lines, no function
    (``def`` to its last line, docstring included) over 60."""
    import ast

    big_modules, big_functions = [], []
    for folder in (ROOT / "race", ROOT / "research" / "scripts"):
        for path in sorted(folder.rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            rel = path.relative_to(ROOT).as_posix()
            if len(text.splitlines()) > 600:
                big_modules.append(f"{rel}: {len(text.splitlines())} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > 60:
                        big_functions.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    assert not big_modules and not big_functions, (
        f"modules over 600 lines: {big_modules}; functions over 60 lines: {big_functions}")


def test_one_race_pilot_never_calls_back_up_a_layer(tmp_path):
    """scripts/call_trace.py's trace of a small ``race pilot`` (and one pilot in this process): every
    call from one RACE module into another goes down the layers of .importlinter, callbacks included
    (docs/architecture.md, "Measured: the hops of one `race pilot`")."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("call_trace", ROOT / "scripts" / "call_trace.py")
    trace = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trace)
    rows = trace.hop_rows(trace.trace_pilot(str(tmp_path / "run")), trace.layer_ranks())
    assert len(rows) > 100                    # the trace saw the whole command, calibration to verdict
    up = [f"{a}.{fa} → {b}.{fb}" for a, fa, b, fb, mark in rows if mark]
    assert up == [], up
