"""Names a package loads on first access (PEP 562), so importing it stays cheap."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_attributes(
    package: str, names: Mapping[str, str], submodules: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: The package's ``__name__``.
        names: Public name -> the module that defines it (absolute, or relative to
            ``package`` when it starts with a dot).
        submodules: Submodules of ``package`` that load on first access as attributes.

    Returns:
        ``(__getattr__, __dir__)``, to assign at the package's top level. A loaded name is
        stored in the package, so later lookups skip ``__getattr__``.
    """
    lazy_submodules = frozenset(submodules)

    def __getattr__(name: str) -> Any:  # noqa: N807 (the PEP 562 hook)
        if name in names:
            value = getattr(importlib.import_module(names[name], package), name)
            setattr(sys.modules[package], name, value)
            return value
        if name in lazy_submodules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:  # noqa: N807 (the PEP 562 hook)
        return sorted(set(vars(sys.modules[package])) | set(names) | lazy_submodules)

    return __getattr__, __dir__
