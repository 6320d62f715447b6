"""The import graph of the trnsim package, checked against its layers.

Every import counts, the ones inside functions too (they run on first use); only those
under ``if TYPE_CHECKING:`` do not, since they never run. Two rules:

- no import cycle between modules (a package's ``__init__`` importing its own modules
  is not an edge back to the package);
- no import up the layers: a module may import modules of its own layer and of the
  layers below it, never above (:data:`LAYERS`, lowest first, each a list of module
  name prefixes; docs/architecture.md shows the same table).

``python tools/check_imports.py`` prints every cycle and every upward import and exits
1 if there is any; :func:`check` returns them for the test suite.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

#: The layers, lowest first: (name, module prefixes). A module belongs to the layer of
#: its longest matching prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("trnsim.units", "trnsim.errors", "trnsim.atomic", "trnsim.dtypes", "trnsim.adapters")),
    ("chip description", ("trnsim.hw.spec",)),
    ("instruction set", ("trnsim.isa",)),
    ("programs", ("trnsim.hw.placement", "trnsim.program")),
    ("timing model", ("trnsim.hw",)),
    ("numerics", ("trnsim.compute",)),
    ("traces", ("trnsim.trace",)),
    ("simulator", ("trnsim.simulator",)),
    ("settings", ("trnsim.settings",)),
    ("NKI front end", ("trnsim.nki",)),
    ("kernels", ("trnsim.kernels",)),
    ("torch device", ("trnsim.backend",)),
    ("tools", ("trnsim.compat", "trnsim.testing", "trnsim.models", "trnsim.validate", "trnsim.cli", "trnsim.demo", "trnsim")),
]


def modules(root: Path) -> dict[str, Path]:
    """Each module of the package under ``root`` (the folder ``trnsim``), by dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _skipped_lines(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test):
            for child in node.body:
                skip.update(n.lineno for n in ast.walk(child) if hasattr(n, "lineno"))
    return skip


def _targets(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        if node.level:
            base = package.split(".")
            base = base[:len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        wanted = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
    out = []
    for target in wanted:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name and not name.startswith(target + "."):
            out.append(target)
    return out


def graph(root: Path) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` for the package under ``root``."""
    known = modules(root)
    edges: dict[str, dict[str, int]] = {m: {} for m in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _skipped_lines(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno not in skip:
                for target in _targets(name, path, node, known):
                    edges[name].setdefault(target, node.lineno)
    return edges


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> int:
    """The index in ``layers`` of ``module``'s layer (its longest matching prefix)."""
    best, length = -1, -1
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > length:
                best, length = i, len(p)
    if best < 0:
        raise ValueError(f"module {module} is in no layer of tools/check_imports.py: add its prefix to LAYERS")
    return best


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges) + 100))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def upward(edges: dict[str, dict[str, int]], layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> list[str]:
    """Each import of a module from a layer above its own, described."""
    out = []
    for module, targets in sorted(edges.items()):
        mine = layer_of(module, layers)
        for target, line in sorted(targets.items()):
            theirs = layer_of(target, layers)
            if theirs > mine:
                out.append(f"{module} (layer {layers[mine][0]!r}) imports {target} (layer {layers[theirs][0]!r}) "
                           f"at line {line}")
    return out


def check(root: Path, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> tuple[list[list[str]], list[str]]:
    """(the import cycles, the upward imports) of the package under ``root``."""
    edges = graph(root)
    return cycles(edges), upward(edges, layers)


def main() -> int:
    root = Path(__file__).resolve().parents[1] / "trnsim"
    found, up = check(root)
    for c in found:
        print(f"cycle of {len(c)}: {', '.join(c)}")
    for u in up:
        print(f"upward: {u}")
    print(f"{len(found)} import cycles, {len(up)} upward imports")
    return 1 if found or up else 0


if __name__ == "__main__":
    sys.exit(main())
