"""The one PEP 562 helper every lazily loading package uses."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import ModuleType

import pytest

import fastdata
import fastdata.preprocess
import fastdata.shards
from fastdata._lazy import lazy_attributes

PACKAGE_ROOT = Path(fastdata.__file__).parent


def test_names_load_on_access_and_stay() -> None:
    package = ModuleType("lazy_probe")
    sys.modules["lazy_probe"] = package
    try:
        getattr_, dir_ = lazy_attributes("lazy_probe", {"dumps": "json"}, ("sub",))
        package.__getattr__ = getattr_  # type: ignore[method-assign]
        assert "dumps" in dir_() and "sub" in dir_()
        assert "dumps" not in vars(package)
        dumps = getattr_("dumps")
        assert dumps is __import__("json").dumps
        assert vars(package)["dumps"] is dumps  # later lookups skip __getattr__
        with pytest.raises(AttributeError, match="module 'lazy_probe' has no attribute 'nope'"):
            getattr_("nope")
    finally:
        del sys.modules["lazy_probe"]


def test_relative_module_names_resolve_in_the_package() -> None:
    getattr_, _ = lazy_attributes("fastdata", {"OnError": ".errors"})
    assert getattr_("OnError") is fastdata.OnError


def test_every_package_hook_is_the_shared_helper() -> None:
    """No module of fastdata writes its own module-level __getattr__/__dir__."""
    written = [
        f"{path.relative_to(PACKAGE_ROOT.parent)}: {node.name}"
        for path in sorted(PACKAGE_ROOT.rglob("*.py"))
        if path.name != "_lazy.py"
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name in {"__getattr__", "__dir__"}
    ]
    assert written == []
    for package in (fastdata, fastdata.preprocess, fastdata.shards):
        assert package.__getattr__.__module__ == "fastdata._lazy"  # type: ignore[attr-defined]
