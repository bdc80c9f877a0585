"""The one way fastdata imports optional dependencies."""

from __future__ import annotations

import importlib
from types import ModuleType

# module name -> (pip requirement, extra that provides it)
_PROVIDERS: dict[str, tuple[str, str]] = {
    "torchvision": ("torchvision", "gpu"),
    "torchvision.io": ("torchvision", "gpu"),
    "nvidia.dali": ("nvidia-dali-cuda130", "dali"),
    "nvidia.dali.plugin.pytorch": ("nvidia-dali-cuda130", "dali"),
    "ray": ("ray", "ray"),
    "matplotlib": ("matplotlib", "plot"),
    "psutil": ("psutil", "bench"),
    "skimage": ("scikit-image", "bench"),
}


def import_optional(module: str, purpose: str) -> ModuleType:
    """Import an optional dependency, or explain exactly how to install it.

    Args:
        module: Dotted module name, e.g. ``"nvidia.dali"``.
        purpose: What the caller needs it for, used in the error message.

    Raises:
        ModuleNotFoundError: The module is missing; the message names the pip command.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        requirement, extra = _PROVIDERS.get(module, (module.split(".", maxsplit=1)[0], ""))
        how = f"pip install '{requirement}'"
        if extra:
            how += f" (or pip install 'fastdata[{extra}]')"
        raise ModuleNotFoundError(
            f"{purpose} needs the optional package {requirement!r}, which is not installed. "
            f"Install it with: {how}",
            name=module,
        ) from exc
