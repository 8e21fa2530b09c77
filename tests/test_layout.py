"""Structural checks on the code's shape, which review alone lets slip.

Import cycles: a module that imports a sibling which imports it back hides the layering (neither can be
read, moved or tested without the other) and only works by the accident of import order. The graph
is built statically from every `import` statement anywhere in a module (module level, in functions, under
`if TYPE_CHECKING:`), so a cycle an import-inside-a-function papers over still counts.

Torch-free: the server and the importer run in processes that never compute on tensors; importing torch
there costs seconds of start-up and hundreds of MB, so only the engine process may import it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "server", "modelfile", "importer", "blobs", "benchmarks")


def module_files() -> dict[str, Path]:
    """Every module of the checked packages by dotted name; a package's `__init__` is the package."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` if it is one of ours, else its longest prefix that is (None: an outside module)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """The modules of ours that ``module`` imports, with the line of each import statement.

    `import a.b.c` is an edge to a.b.c; `from a.b import c` is an edge to a.b.c when that is a module,
    else to a.b (c is a name in it). Relative imports resolve against the module's package."""
    is_package = path.name == "__init__.py"
    package = module.split(".") if is_package else module.split(".")[:-1]
    edges = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                       for alias in node.names]
        for target in targets:
            known = _known(target, modules)
            if known is not None:
                edges.append((known, node.lineno))
    return edges


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative: the graph is deep enough to matter)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def import_cycles() -> list[str]:
    """One readable entry per cycle: its modules and the import lines that close it."""
    modules = module_files()
    lines: dict[tuple[str, str], set[int]] = {}
    for module, path in modules.items():
        for target, lineno in imports_of(module, path, modules):
            lines.setdefault((module, target), set()).add(lineno)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for source, target in lines:
        graph[source].add(target)
    reports = []
    for component in strongly_connected(graph):
        members = set(component)
        if len(component) == 1 and component[0] not in graph[component[0]]:
            continue
        edges = [f"    {source} -> {target} ({modules[source].relative_to(ROOT)}:"
                 f"{','.join(map(str, sorted(lines[source, target])))})"
                 for source in component for target in sorted(graph[source] & members)]
        reports.append(f"cycle among {', '.join(component)}:\n" + "\n".join(edges))
    return reports


def test_no_import_cycles() -> None:
    cycles = import_cycles()
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


_TORCH_PROBE = r"""
import sys, traceback

class Probe:
    # Records who imports torch first (the project's frames of that import), then steps aside.
    chain = None

    def find_spec(self, name, path=None, target=None):
        if name == "torch" and Probe.chain is None:
            Probe.chain = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()
                           if not f.filename.startswith("<")]
        return None

sys.meta_path.insert(0, Probe())
import server.routes.app, server.cli.commands, importer, modelfile, blobs
if "torch" in sys.modules:
    print("torch imported by:\n" + "\n".join(Probe.chain or ["(unknown)"]))
    sys.exit(1)
"""


def test_server_and_importer_do_not_import_torch() -> None:
    done = subprocess.run([sys.executable, "-c", _TORCH_PROBE], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def folder_cycles() -> list[list[str]]:
    """Import cycles between folders (a module counts for the folder it sits in; a package's `__init__` for its
    own folder), parent and child folders included: each strongly connected set of two or more folders."""
    modules = module_files()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        here = str(path.parent.relative_to(ROOT))
        graph.setdefault(here, set())
        for target, _ in imports_of(module, path, modules):
            there = str(modules[target].parent.relative_to(ROOT))
            graph.setdefault(there, set())
            if there != here:
                graph[here].add(there)
    return [c for c in strongly_connected(graph) if len(c) > 1]


def test_the_command_line_stands_apart_from_the_server() -> None:
    """`server/cli/` (the `tandem` verbs, their HTTP client, `tandem bench`) imports the server; nothing else in
    `server/` imports it."""
    modules = module_files()
    offenders = [f"{m} -> {t}" for m, p in modules.items()
                 if m.startswith("server") and not m.startswith("server.cli")
                 for t, _ in imports_of(m, p, modules) if t == "server.cli" or t.startswith("server.cli.")]
    assert not offenders, offenders


def test_no_folder_cycles() -> None:
    """No two folders import each other, parent and child folders included (`server/` and `server/routes` did
    until the app moved into `routes/`; the engine's root and its subfolders did until the torch-free contract
    moved into `engine/contract/`)."""
    assert not folder_cycles(), folder_cycles()


CONTRACT = "engine.contract"
OUTSIDE_THE_ENGINE = ("server", "importer", "modelfile", "blobs")


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_contract_stands_alone() -> None:
    """`engine/contract/` (what the server and the engine process share) imports nothing of the engine's own:
    reading it never pulls in the code that only the engine process runs."""
    modules = module_files()
    offenders = [f"{m} -> {t}" for m, p in modules.items() if _in(m, CONTRACT)
                 for t, _ in imports_of(m, p, modules) if not _in(t, CONTRACT) and _in(t, "engine")]
    assert not offenders, offenders


def test_the_server_side_reaches_the_engine_only_through_the_contract() -> None:
    """The server, the importer, `modelfile/` and `blobs/` run in the server's process: of the engine they import
    only `engine/contract/` (the engine process itself is started by name, `ENGINE_MAIN_MODULE`)."""
    modules = module_files()
    offenders = [f"{m} -> {t}" for m, p in modules.items() if any(_in(m, pkg) for pkg in OUTSIDE_THE_ENGINE)
                 for t, _ in imports_of(m, p, modules) if _in(t, "engine") and not _in(t, CONTRACT)]
    assert not offenders, offenders


_CONTRACT_PROBE = r"""
import pkgutil, importlib, sys
import engine.contract
for info in pkgutil.iter_modules(engine.contract.__path__):
    importlib.import_module("engine.contract." + info.name)
engine_modules = sorted(m for m in sys.modules if m.startswith("engine.") and not m.startswith("engine.contract"))
assert "torch" not in sys.modules, "torch imported"
assert not engine_modules, engine_modules
"""


def test_the_contract_imports_neither_torch_nor_the_engine() -> None:
    done = subprocess.run([sys.executable, "-c", _CONTRACT_PROBE], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
