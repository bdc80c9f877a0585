"""``create_decoder``: one entry point for every decoder backend."""

from __future__ import annotations

import importlib.util
import logging
import warnings

import torch

from fastdata._optional import install_hint
from fastdata.decode._base import Decoder, check_on_error
from fastdata.decode._geometry import RandomResizedCrop, parse_size
from fastdata.decode.cpu import CpuDecoder
from fastdata.decode.dali import DaliDecoder
from fastdata.decode.nvjpeg import (
    NvJpegDecoder,
    check_torchvision,
    torchvision_too_old,
    torchvision_version,
)

BACKENDS = ("auto", "cpu", "nvjpeg", "dali")

logger = logging.getLogger("fastdata.decode")


def _has_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def _auto_choice(device: torch.device | None) -> tuple[str, str]:
    """``"auto"``'s backend and the reason for it."""
    if device is not None and device.type != "cuda":
        return "cpu", f"the requested device is {str(device)!r}"
    if not torch.cuda.is_available():
        return "cpu", "CUDA is not available"
    if not _has_torchvision():
        return "cpu", f"torchvision is not installed ({install_hint('torchvision')} for nvjpeg)"
    version = torchvision_version()
    if version is not None and torchvision_too_old(version):
        reason = f"torchvision {version} predates batched GPU decoding (0.20)"
        warnings.warn(
            f"backend='auto' decodes on the CPU: {reason}; pip install 'torchvision>=0.20' "
            "to decode on the GPU",
            RuntimeWarning,
            stacklevel=3,
        )
        return "cpu", reason
    return "nvjpeg", "CUDA and torchvision >= 0.20 are present"


def resolve_backend(backend: str, device: torch.device | str | int | None = None) -> str:
    """The concrete backend for ``backend`` and the requested ``device``.

    ``"auto"`` is ``"nvjpeg"`` when CUDA and torchvision >= 0.20 are present and
    ``device`` is unset or a CUDA device, else ``"cpu"``; the choice and its reason are
    logged (logger ``fastdata.decode``, level INFO). ``"nvjpeg"`` checks torchvision.

    Raises:
        ValueError: Unknown backend.
        FastDataError: ``"nvjpeg"`` with torchvision older than 0.20.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nvjpeg":
        version = torchvision_version()
        if version is not None and torchvision_too_old(version):
            check_torchvision()  # raises, naming the version and the fix
    if backend != "auto":
        return backend
    target = None
    if device is not None:
        target = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    name, reason = _auto_choice(target)
    logger.info("decoder backend 'auto' chose %r: %s", name, reason)
    return name


def create_decoder(
    backend: str = "auto",
    *,
    size: int | tuple[int, int],
    random_crop: RandomResizedCrop | bool | None = None,
    device: torch.device | str | int | None = None,
    on_error: str = "raise",
    grayscale: bool = False,
    num_threads: int | None = None,
    seed: int | None = None,
) -> Decoder:
    """A decoder that turns a batch of encoded images into a uint8 batch on a device.

    Example:
        >>> decoder = create_decoder("cpu", size=224)
        >>> images = decoder([jpeg_bytes_1, jpeg_bytes_2])  # (2, 3, 224, 224) uint8

    Args:
        backend: ``"cpu"`` (OpenCV threads, reduced-size JPEG decoding), ``"nvjpeg"``
            (torchvision's batched nvJPEG on CUDA), ``"dali"`` (an NVIDIA DALI pipeline;
            CPU-only when ``device`` is the CPU) or ``"auto"`` (nvjpeg when CUDA and
            torchvision >= 0.20 are present and ``device`` is unset or CUDA, else cpu;
            the choice and why are logged at INFO on the ``fastdata.decode`` logger).
        size: Output ``(height, width)``, or an int for a square.
        random_crop: Random resized crop for training: a :class:`RandomResizedCrop`, or
            ``True`` for the default scale (0.08, 1) and ratio (3/4, 4/3). ``None``/``False``
            (evaluation): the largest centred crop of the output's aspect ratio.
        device: Where the output lives (an int is that CUDA device, e.g. ``local_rank``);
            default the current CUDA device for nvjpeg, and for dali when there is one,
            else ``"cpu"``.
        on_error: A sample that cannot be decoded: ``"raise"`` a
            :class:`~fastdata.DecodeError`, ``"skip"`` it, or ``"warn"`` and skip it.
        grayscale: One output channel instead of RGB.
        num_threads: CPU threads for the cpu and dali backends (default: usable CPUs).
        seed: Seed of the random crops (reproducible across backends).

    Returns:
        A :class:`Decoder`: ``decoder(list_of_encoded)`` gives ``(B, C, H, W)`` uint8
        (channels_last memory format); ``decoder.decode(...)`` also gives the kept indices.

    Raises:
        ValueError: Unknown backend or on_error, bad size, or nvjpeg without CUDA.
        TypeError: ``size`` or ``random_crop`` of the wrong type.
        ModuleNotFoundError: The backend's optional package is missing (the message
            gives the pip command).
        FastDataError: nvjpeg with torchvision older than 0.20.
    """
    if isinstance(device, bool):
        raise TypeError(f"device must be a str, int or torch.device, got {device!r}")
    if isinstance(device, int):
        device = torch.device("cuda", device)
    name = resolve_backend(backend, device)
    parse_size(size)
    check_on_error(on_error)
    if name == "cpu":
        return CpuDecoder(
            size,
            random_crop=random_crop,
            device=device if device is not None else "cpu",
            on_error=on_error,
            grayscale=grayscale,
            num_threads=num_threads,
            seed=seed,
        )
    if name == "nvjpeg":
        target = torch.device(device if device is not None else "cuda")
        if target.type != "cuda" or not torch.cuda.is_available():
            raise ValueError(
                f"backend='nvjpeg' decodes on a CUDA device, got device={str(target)!r} with "
                f"torch.cuda.is_available()={torch.cuda.is_available()}; use backend='cpu'"
            )
        return NvJpegDecoder(
            size,
            random_crop=random_crop,
            device=target,
            on_error=on_error,
            grayscale=grayscale,
            seed=seed,
        )
    default = "cuda" if torch.cuda.is_available() else "cpu"
    return DaliDecoder(
        size,
        random_crop=random_crop,
        device=device if device is not None else default,
        on_error=on_error,
        grayscale=grayscale,
        num_threads=num_threads,
        seed=seed,
    )
