"""The package's layers: a module imports only from its own layer or the ones below it,
and no set of modules imports itself round in a cycle (function-level imports count).

    errors paths options budget machine version
      -> graph -> frontends -> kernel -> schedule_tree -> tiling, microkernels -> codegen
      -> targets -> compiler, symbolic -> cli, tune, server, torch_compile, the package itself
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "polyc"
LAYERS = [
    {"errors", "paths", "options", "budget", "machine", "version"},
    {"graph"},
    {"frontends"},
    {"kernel"},
    {"schedule_tree"},
    {"tiling", "microkernels"},
    {"codegen"},
    {"targets"},
    {"compiler", "symbolic"},
    {"cli", "tune", "server", "torch_compile", "__init__", "__main__"},
]
LAYER = {part: k for k, parts in enumerate(LAYERS) for part in parts}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("polyc",) + path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The polyc modules `name` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base_parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            # `from x import y` imports the module x.y when there is one, else x
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        found |= {t for t in targets if t.split(".")[0] == "polyc" and t != name}
    return {t if t in MODULES else t.rsplit(".", 1)[0] for t in found}


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Each module's polyc imports (parsed when a test asks, not at every collection)."""
    return {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYER[parts[1] if len(parts) > 1 else "__init__"]


def test_every_module_has_a_layer():
    for name in MODULES:
        assert _layer(name) is not None, name


def test_no_module_imports_a_higher_layer():
    upward = [f"{m} ({_layer(m)}) imports {t} ({_layer(t)})" for m, ts in _graph().items()
              for t in ts if _layer(t) > _layer(m)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    # Tarjan's strongly connected components over the import graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in _graph().get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in _graph():
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_layering_test_sees_function_level_imports():
    # a module importing a higher layer only inside a function is still caught
    assert "polyc.compiler" in _graph()["polyc.tune"]
    assert any(t.startswith("polyc.targets") for t in _graph()["polyc.cli"])
