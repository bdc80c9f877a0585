"""The one way fastdata imports optional dependencies."""

from __future__ import annotations

import importlib
from types import ModuleType

# The name fastdata is installed by (`pip install torch-fastdata`); the import name is `fastdata`.
DISTRIBUTION = "torch-fastdata"

# module name -> (pip requirement, extra that provides it, alternative for other setups)
_PROVIDERS: dict[str, tuple[str, str, str]] = {
    "torchvision": ("torchvision", "gpu", ""),
    "torchvision.io": ("torchvision", "gpu", ""),
    "nvidia.dali": (
        "nvidia-dali-cuda130",
        "dali-cu13",
        f"for CUDA 12: pip install '{DISTRIBUTION}[dali-cu12]'",
    ),
    "nvidia.dali.plugin.pytorch": (
        "nvidia-dali-cuda130",
        "dali-cu13",
        f"for CUDA 12: pip install '{DISTRIBUTION}[dali-cu12]'",
    ),
    "ray": ("ray", "ray", ""),
    "boto3": ("boto3", "s3", ""),
    "botocore.config": ("boto3", "s3", ""),
    "botocore.exceptions": ("boto3", "s3", ""),
    "google.cloud.storage": ("google-cloud-storage", "gcs", ""),
    "google.api_core.exceptions": ("google-cloud-storage", "gcs", ""),
    "google.auth.exceptions": ("google-cloud-storage", "gcs", ""),
    "matplotlib": ("matplotlib", "plot", ""),
    "matplotlib.pyplot": ("matplotlib", "plot", ""),
    "psutil": ("psutil", "", ""),
    "skimage": ("scikit-image", "demo", ""),
}


def install_hint(module: str) -> str:
    """The pip command that provides ``module``, e.g. ``pip install 'torch-fastdata[ray]'``."""
    requirement, extra, alternative = _PROVIDERS.get(
        module, (module.split(".", maxsplit=1)[0], "", "")
    )
    how = f"pip install '{DISTRIBUTION}[{extra}]'" if extra else f"pip install '{requirement}'"
    if extra:
        how += f" (or pip install '{requirement}')"
    if alternative:
        how += f"; {alternative}"
    return how


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
        requirement = _PROVIDERS.get(module, (module.split(".", maxsplit=1)[0], "", ""))[0]
        raise ModuleNotFoundError(
            f"{purpose} needs the optional package {requirement!r}, which is not installed. "
            f"Install it with: {install_hint(module)}",
            name=module,
        ) from exc
