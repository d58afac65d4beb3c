"""impnb's import graph, read statically (AST over impnb/**/*.py): no import circles among its
modules, and no `_private` name imported from another impnb module.

An edge is an import that runs when the module is imported: at module level, in a class body, or
under a module-level `if`/`try` (an `if TYPE_CHECKING:` block excepted). An import inside a
function runs when it is called, after every module has loaded, and is no edge. `from impnb.x
import y` is an edge to impnb.x.y where that is a module, else to impnb.x (whose __init__ runs).
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "impnb"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` names, relative levels resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package(module) else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
           (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def eager_imports(body):
    """The import statements that run at import time, in order (function bodies skipped)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from eager_imports(node.body)
        elif isinstance(node, ast.If):
            if not type_checking(node.test):
                yield from eager_imports(node.body)
            yield from eager_imports(node.orelse)
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from eager_imports(block)
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            yield from eager_imports(node.body)
            yield from eager_imports(getattr(node, "orelse", []))


def targets(module: str, node) -> list[tuple[str, str]]:
    """(imported impnb module, the name imported from it or '') for one import statement."""
    out = []
    if isinstance(node, ast.Import):
        out += [(a.name, "") for a in node.names]
    else:
        source = resolve(module, node)
        for a in node.names:
            sub = f"{source}.{a.name}"
            out.append((sub, "") if sub in MODULES else (source, a.name))
    return [(m, n) for m, n in out if m in MODULES]


def all_imports(tree):
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def graph(lazy: bool = False) -> dict[str, dict[str, int]]:
    """module -> {module it imports at import time (with lazy, anywhere): line}."""
    edges = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        edges[name] = {}
        for node in (all_imports(tree) if lazy else eager_imports(tree.body)):
            for target, _ in targets(name, node):
                if target != name:
                    edges[name].setdefault(target, node.lineno)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one circle."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
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
                found.append(circle(edges, set(component)))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def circle(edges, component: set[str]) -> list[str]:
    """One closed path through a strongly connected component (breadth-first back to its start)."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v]):
            if w == start:
                return paths[v] + [start]
            if w in component and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    raise AssertionError(component)


def describe(edges, path: list[str]) -> str:
    return " -> ".join(f"{a} (line {edges[a][b]})" for a, b in zip(path, path[1:])) + f" -> {path[-1]}"


def test_the_graph_is_read():
    edges = graph()
    assert "impnb.kernels.common.ptx" in edges["impnb.kernels.gemm.gemm_tc"]
    assert "impnb.launch" in edges["impnb.kernels.gemm.gemm_tc"]
    assert "impnb.launch.launcher" in edges["impnb.launch"]  # under a module-level if


def test_cycles_are_found():
    edges = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}}
    assert cycles(edges) == [["a", "b", "c", "a"]]


def test_no_import_circles():
    edges = graph()
    found = cycles(edges)
    assert not found, "import circles:\n" + "\n".join(describe(edges, c) for c in found)


def test_no_import_circles_through_lazy_imports():
    """Nor through imports inside functions: a lazy import keeps a circle from failing at import
    time, but the layers still lean on each other (a lower module's need moves down instead)."""
    edges = graph(lazy=True)
    found = cycles(edges)
    assert not found, "import circles:\n" + "\n".join(describe(edges, c) for c in found)


def test_no_private_names_imported_across_modules():
    """Anywhere in a module, lazy imports too: a name another module needs is public."""
    found = []
    for name, path in MODULES.items():
        for node in all_imports(ast.parse(path.read_text(), str(path))):
            for target, imported in targets(name, node):
                private = imported or target.rsplit(".", 1)[-1]
                if target != name and private.startswith("_") and not private.startswith("__"):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {private} from {target}")
    assert not found, "\n".join(found)
