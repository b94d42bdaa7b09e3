"""The import graph of mpcore/: the only cycle is the one autodiff needs (tensor, tape and the
ops), and the value modules do not reach up into the hardware.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import``, at
module level or inside a function (a late import still ties two modules together), but not
those under ``if TYPE_CHECKING:``, which never run. ``from pkg import x`` is an edge to the
submodule ``pkg.x`` where there is one, else to ``pkg`` itself (a name of its ``__init__``).
Importing ``pkg.sub`` runs ``pkg/__init__`` too, but that is not counted as an edge: the
package's own imports already are.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import mpcore

AUTODIFF = ("mpcore.core.tensor", "mpcore.core.tape", "mpcore.ops")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str      # "path:line", for the failure messages


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: the bodies of ``if TYPE_CHECKING:`` are left out,
    their ``else:`` branches are not."""
    if isinstance(tree, (ast.Import, ast.ImportFrom)):
        yield tree
        return
    if isinstance(tree, ast.If) and _is_type_checking(tree.test):
        for node in tree.orelse:
            yield from _imports(node)
        return
    for child in ast.iter_child_nodes(tree):
        yield from _imports(child)


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package), for every .py file under the package ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        if package:
            parts.pop()
        out[".".join(parts)] = (path, package)
    return out


def _targets(node: ast.Import | ast.ImportFrom, module: str, package: bool,
             modules: dict[str, tuple[Path, bool]]) -> list[str]:
    """The modules of ``modules`` that the import statement ``node`` in ``module`` names."""
    if isinstance(node, ast.Import):
        found = []
        for alias in node.names:
            parts = alias.name.split(".")
            # `import a.b.c` names the deepest of a.b.c, a.b, a that is one of ours
            name = next((".".join(parts[:n]) for n in range(len(parts), 0, -1)
                         if ".".join(parts[:n]) in modules), None)
            if name is not None:
                found.append(name)
        return found
    if node.level:
        base = module.split(".") if package else module.split(".")[:-1]
        base = base[:len(base) - node.level + 1]
        if node.module:
            base += node.module.split(".")
        prefix = ".".join(base)
    else:
        prefix = node.module or ""
    found = []
    for alias in node.names:
        sub = f"{prefix}.{alias.name}"
        if sub in modules:
            found.append(sub)
        elif prefix in modules:
            found.append(prefix)
    return found


def import_graph(root: Path) -> tuple[dict[str, set[str]], list[Edge]]:
    """(module -> the modules it imports, every edge with where it is) for the package at
    ``root``; only the package's own modules are nodes."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    edges: dict[Edge, None] = {}
    for name, (path, package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _imports(tree):
            for target in _targets(node, name, package, modules):
                if target != name:
                    graph[name].add(target)
                    where = f"{path.relative_to(root.parent)}:{node.lineno}"
                    edges[Edge(name, target, where)] = None
    return graph, list(edges)


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of ``graph``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The components that are cycles (a module never imports itself here: no self-loops)."""
    return [c for c in strongly_connected(graph) if len(c) > 1]


def describe(components: list[set[str]], edges: list[Edge]) -> str:
    lines = []
    for component in components:
        lines.append("cycle: " + ", ".join(sorted(component)))
        lines += [f"    {e.source} -> {e.target}  ({e.where})" for e in edges
                  if e.source in component and e.target in component]
    return "\n".join(lines) or "no cycle"


ROOT = Path(mpcore.__file__).resolve().parent
GRAPH, EDGES = import_graph(ROOT)


def _is_autodiff(module: str) -> bool:
    return module in AUTODIFF or module.startswith("mpcore.ops.")


def _concern(component: set[str]) -> str:
    if "mpcore.cli.app" in component:
        return "cli"
    return "autodiff" if any(_is_autodiff(m) for m in component) else "others"


@pytest.mark.parametrize("concern", ["autodiff", "cli", "others"])
def test_the_only_import_cycle_is_autodiffs(concern: str) -> None:
    found = cycles(GRAPH)
    mine = [c for c in found if _concern(c) == concern]
    if concern == "autodiff":
        wrong = [c for c in mine if not all(_is_autodiff(m) for m in c)]
    else:
        wrong = mine
    assert not wrong, (f"import cycles beyond tensor/tape/ops ({concern}):\n"
                       f"{describe(wrong, EDGES)}\n\nall cycles in mpcore/:\n"
                       f"{describe(found, EDGES)}")


def _path(graph: dict[str, set[str]], source: str, target: str) -> list[str] | None:
    """An import chain from ``source`` to ``target``, or None where there is none."""
    parent: dict[str, str | None] = {source: None}
    queue = [source]
    while queue:
        v = queue.pop(0)
        if v == target:
            chain = []
            node: str | None = v
            while node is not None:
                chain.append(node)
                node = parent[node]
            return chain[::-1]
        for w in sorted(graph[v]):
            if w not in parent:
                parent[w] = v
                queue.append(w)
    return None


@pytest.mark.parametrize(("source", "forbidden"), [
    ("mpcore.core.backend", ("mpcore.plugins.manager", "mpcore.plugins.registry")),
    ("mpcore.mixed_precision.policy", ("mpcore.plugins.registry", "mpcore.mixed_precision.verdict",
                                       "mpcore.core.backend")),
])
def test_value_modules_do_not_reach_up(source: str, forbidden: tuple[str, ...]) -> None:
    chains = [" -> ".join(chain) for target in forbidden
              if (chain := _path(GRAPH, source, target)) is not None]
    assert not chains, f"{source} reaches up:\n  " + "\n  ".join(chains)


def test_the_cli_names_no_modules() -> None:
    tree = ast.parse((ROOT / "cli" / "app.py").read_text(encoding="utf-8"))
    imported = {alias.name for node in _imports(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in _imports(tree)
                 if isinstance(node, ast.ImportFrom)}
    problems = [f"imports {m}" for m in sorted(imported) if m.split(".")[0] == "importlib"]
    problems += [f"imports {e.target} ({e.where})" for e in EDGES
                 if e.source in ("mpcore.cli", "mpcore.cli.app")
                 and e.target.startswith(("mpcore.cli.demo", "mpcore.conformance"))]
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and ast.get_docstring(node) is not None}
    problems += [f"names {node.value!r} (mpcore/cli/app.py:{node.lineno})"
                 for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and id(node) not in docstrings
                 and ("mpcore.cli.demo" in node.value or "mpcore.conformance" in node.value)]
    assert not problems, ("mpcore.cli.app reaches its subcommands by name:\n  "
                          + "\n  ".join(problems))


def test_modules_use_each_others_public_names_only() -> None:
    """Modules of mpcore/ (the autodiff cycle included) reach each other through public names:
    no ``from mpcore.x import _name`` and no ``alias._name`` on an imported mpcore module."""
    problems = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = f"{path.relative_to(ROOT.parent)}"
        aliases: set[str] = set()
        for node in _imports(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mpcore"):
                for alias in node.names:
                    if alias.name.startswith("_"):
                        problems.append(f"{where}:{node.lineno} imports {node.module}."
                                        f"{alias.name}")
                    aliases.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                aliases |= {a.asname for a in node.names
                            if a.asname and a.name.startswith("mpcore")}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                problems.append(f"{where}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert not problems, "private names used across modules:\n  " + "\n  ".join(problems)


# --- the graph reader itself, on a package written for the test --------------------------------
def test_the_reader_resolves_imports_and_finds_cycles(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from pkg import a\nNAME = 1\n",
        "a.py": "from typing import TYPE_CHECKING\nimport os\nfrom . import b\n"
                "if TYPE_CHECKING:\n    from pkg import c\nelse:\n    from pkg.sub import d\n",
        "b.py": "def late():\n    from .a import x\n",
        "c.py": "from pkg import NAME\nimport pkg.sub.d as d\n",
        "sub/__init__.py": "",
        "sub/d.py": "from ..c import y\nfrom . import NAME2\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph, edges = import_graph(pkg)
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b", "pkg.sub.d"},          # not pkg.c: a TYPE_CHECKING import
        "pkg.b": {"pkg.a"},                       # a function-level import counts
        "pkg.c": {"pkg", "pkg.sub.d"},            # NAME is a name of pkg/__init__
        "pkg.sub": set(),
        "pkg.sub.d": {"pkg.c", "pkg.sub"},
    }
    assert {e.where for e in edges if e.source == "pkg.b"} == {"pkg/b.py:2"}
    assert sorted(map(sorted, cycles(graph))) == [["pkg", "pkg.a", "pkg.b", "pkg.c",
                                                   "pkg.sub.d"]]
    graph["pkg.sub.d"].discard("pkg.c")
    graph["pkg.c"].discard("pkg")
    assert sorted(map(sorted, cycles(graph))) == [["pkg.a", "pkg.b"]]
