"""The packages of mpcore/ in one order, lowest first: a module imports (at module level) only
modules of its own package and of packages before it, so the folder tree reads bottom-up as the
architecture does (docs/architecture.md's module map lists the packages in this order).

Module level means what runs when the module is imported: imports in the module's body and in
class bodies, ``if``/``try``/``with`` blocks included, but not in functions (a late import runs
when the function does; ``test_import_graph.py`` still holds those to the no-cycle rule) and not
under ``if TYPE_CHECKING:``. ``from pkg import x`` is an edge to the submodule ``pkg.x`` where
there is one. ``mpcore/__init__.py`` and ``mpcore/__main__.py`` (the public face and the
``python -m mpcore`` entry) sit above every package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_import_graph import ROOT, Edge, _is_type_checking, _modules, _targets

#: lowest first
ORDER = (
    "core",             # tensors, tape, dtypes, categories, random, the Backend contract
    "plugins",          # hooks, entry points, choosing the backend, settings
    "ops",              # the ops, dispatch, backprop
    "mixed_precision",  # policy, loss scale, verdict, FP8 recipes, amp's hooks
    "tracing",          # mp.function: recording and replaying steps
    "metrics",
    "distribution",     # data parallelism (its results are metrics)
    "optimizers",       # optimizers, clipping, LossScaleOptimizer (distributed gradients)
    "amp",              # automatic mixed precision: lists, painting, the graph rewrite
    "layers",
    "losses",           # (the cross-entropies read the softmax layer's logits)
    "checkpoint",
    "saving",           # Keras' names and formats (models register their classes here)
    "callbacks",
    "models",
    "datasets",
    "debugging",        # numerics tools, which watch a model's step
    "conformance",      # the kit that holds a backend to the contract
    "cli",
    "utils",            # keras.utils' names, re-exported from models and saving
)

#: the imports allowed against the order, each with its reason
EXCEPTIONS = {
    # autodiff's cycle (DESIGN.md): a Tensor's operators are ops, imported at the end of
    # tensor.py once Tensor exists
    ("mpcore.core.tensor", "mpcore.ops"),
    # `import mpcore.saving` completes the Keras name registry with the models' classes (they
    # register themselves when imported, being above saving)
    ("mpcore.saving", "mpcore.models"),
}


def _module_level_imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _module_level_imports(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _module_level_imports(child)


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] != "__main__" else None


def module_level_edges(root: Path) -> list[Edge]:
    modules = _modules(root)
    edges: dict[Edge, None] = {}
    for name, (path, package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _module_level_imports(tree):
            for target in _targets(node, name, package, modules):
                if target != name:
                    edges[Edge(name, target, f"{path.relative_to(root.parent)}:"
                                             f"{node.lineno}")] = None
    return list(edges)


def violations(edges: list[Edge], order: tuple[str, ...]) -> list[str]:
    rank = {p: i for i, p in enumerate(order)}
    found = []
    for e in edges:
        source, target = package_of(e.source), package_of(e.target)
        if source is None or target is None or source == target:
            continue
        if rank[target] > rank[source] and (e.source, e.target) not in EXCEPTIONS:
            found.append(f"{e.source} ({source}) imports {e.target} ({target}), a later "
                         f"package  ({e.where})")
    return found


def test_every_package_is_in_the_order() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(ORDER), (f"not in ORDER: {sorted(packages - set(ORDER))}; "
                                    f"gone: {sorted(set(ORDER) - packages)}")
    assert sorted(p.name for p in ROOT.glob("*.py")) == ["__init__.py", "__main__.py"], \
        "mpcore/ holds packages only (and __init__.py, __main__.py)"


def test_no_package_imports_a_later_one() -> None:
    found = violations(module_level_edges(ROOT), ORDER)
    assert not found, "imports against the package order:\n  " + "\n  ".join(found)


def test_the_exceptions_are_still_needed() -> None:
    edges = {(e.source, e.target) for e in module_level_edges(ROOT)}
    assert edges >= EXCEPTIONS, f"no longer imported, drop: {sorted(EXCEPTIONS - edges)}"


@pytest.mark.parametrize(("text", "expected"), [
    ("import os\nfrom pkg.b import x\n", ["pkg.a (a) imports pkg.b.x (b), a later package"]),
    ("def f():\n    from pkg.b import x\n", []),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import x\n", []),
    ("try:\n    import pkg.b.x\nexcept ImportError:\n    pass\n",
     ["pkg.a (a) imports pkg.b.x (b), a later package"]),
    ("class C:\n    from pkg import b\n", ["pkg.a (a) imports pkg.b (b), a later package"]),
])
def test_the_reader_finds_module_level_imports(tmp_path: Path, text: str,
                                               expected: list[str]) -> None:
    pkg = tmp_path / "pkg"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "m.py").write_text(text.replace("pkg.a", "pkg.a"))
    (pkg / "b" / "x.py").write_text("")
    found = violations(module_level_edges(pkg), ("a", "b"))
    assert [f.replace("pkg.a.m", "pkg.a").split("  (")[0] for f in found] == expected
