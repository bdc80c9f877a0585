"""The import graph of fastdata points one way: no circle inside a package, and nothing
inside the library imports the package top (``fastdata/__init__.py``, the public API).

Every import counts, at the top of a module, inside a function or under
``TYPE_CHECKING``: a circle drawn only for the type checker is still one a reader follows.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import fastdata

PACKAGE = Path(fastdata.__file__).parent


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module under ``root`` (a package folder)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imported_modules(name: str, path: Path, known: set[str]) -> Iterator[str]:
    """The library modules that module ``name`` (at ``path``) imports."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in known:
                    yield submodule
                elif base in known:
                    yield base


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_names(root)
    known = set(modules)
    return {name: set(imported_modules(name, path, known)) for name, path in modules.items()}


def package_of(name: str, graph: dict[str, set[str]]) -> str:
    """A package's ``__init__`` belongs to that package; any other module to its parent."""
    is_package = any(other.startswith(f"{name}.") for other in graph)
    return name if is_package else name.rpartition(".")[0]


def circles_inside_packages(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle whose modules all lie in one package, as the path around it."""
    inner = {
        name: {t for t in targets if package_of(t, graph) == package_of(name, graph)}
        for name, targets in graph.items()
    }
    circles: list[list[str]] = []
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            circle = trail[trail.index(name) :]
            if set(circle) not in [set(c) for c in circles]:
                circles.append([*circle, name])
            return
        if name in done:
            return
        for target in sorted(inner[name]):
            visit(target, [*trail, name])
        done.add(name)

    for name in sorted(inner):
        visit(name, [])
    return circles


def imports_of_the_top(graph: dict[str, set[str]], top: str) -> list[str]:
    return sorted(name for name, targets in graph.items() if name != top and top in targets)


def test_no_import_circle_inside_a_package() -> None:
    graph = import_graph(PACKAGE)
    assert len(graph) > 50
    circles = circles_inside_packages(graph)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_nothing_inside_imports_the_package_top() -> None:
    importers = imports_of_the_top(import_graph(PACKAGE), "fastdata")
    assert not importers, f"these modules import fastdata/__init__.py: {importers}"


FAKE_TREE = {
    "__init__.py": "from pkg import _a\n",
    "_a.py": "from pkg.sub import thing\n",
    "sub/__init__.py": "from pkg.sub._one import thing\n",
    "sub/_one.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._two import x\n",
    "sub/_two.py": "def f():\n    from pkg.sub import _one\n",
    "sub/_three.py": "import pkg\nfrom pkg import _a\n",
}


def test_the_rules_on_a_fake_tree(tmp_path: Path) -> None:
    for relative, source in FAKE_TREE.items():
        (tmp_path / "pkg" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / relative).write_text(source)
    graph = import_graph(tmp_path / "pkg")
    assert graph["pkg"] == {"pkg._a"}
    assert graph["pkg._a"] == {"pkg.sub"}
    assert graph["pkg.sub._three"] == {"pkg", "pkg._a"}
    assert circles_inside_packages(graph) == [["pkg.sub._one", "pkg.sub._two", "pkg.sub._one"]]
    assert imports_of_the_top(graph, "pkg") == ["pkg.sub._three"]


@pytest.mark.parametrize(
    ("where", "source", "expected"),
    [
        ("sub/_one.py", "from . import _two", {"pkg.sub._two"}),
        ("sub/_one.py", "from ._two import x", {"pkg.sub._two"}),
        ("sub/_one.py", "from .. import _a", {"pkg._a"}),
        ("sub/_one.py", "from .._a import x", {"pkg._a"}),
        ("sub/_one.py", "from .. import sub", {"pkg.sub"}),
        ("sub/__init__.py", "from . import _one", {"pkg.sub._one"}),
        ("sub/__init__.py", "from ._two import x", {"pkg.sub._two"}),
        ("sub/__init__.py", "import json, pkg._a", {"pkg._a"}),
    ],
)
def test_imports_resolve_to_modules(
    where: str, source: str, expected: set[str], tmp_path: Path
) -> None:
    for relative in ("__init__.py", "_a.py", "sub/__init__.py", "sub/_one.py", "sub/_two.py"):
        (tmp_path / "pkg" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / relative).write_text("")
    (tmp_path / "pkg" / where).write_text(source + "\n")
    name = "pkg." + where.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    assert import_graph(tmp_path / "pkg")[name] == expected
