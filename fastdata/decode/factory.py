"""``create_decoder``: one entry point for every decoder backend."""

from __future__ import annotations

import importlib.util

import torch

from fastdata.decode._base import Decoder, check_on_error
from fastdata.decode._geometry import RandomResizedCrop, parse_size
from fastdata.decode.cpu import CpuDecoder
from fastdata.decode.dali import DaliDecoder
from fastdata.decode.nvjpeg import NvJpegDecoder

BACKENDS = ("auto", "cpu", "nvjpeg", "dali")


def _has_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def resolve_backend(backend: str) -> str:
    """The concrete backend for ``backend``: ``"auto"`` is ``"nvjpeg"`` when CUDA and
    torchvision are present, else ``"cpu"``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    return "nvjpeg" if torch.cuda.is_available() and _has_torchvision() else "cpu"


def create_decoder(
    backend: str = "auto",
    *,
    size: int | tuple[int, int],
    random_crop: RandomResizedCrop | bool | None = None,
    device: torch.device | str | None = None,
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
            torchvision are present, else cpu).
        size: Output ``(height, width)``, or an int for a square.
        random_crop: Random resized crop for training: a :class:`RandomResizedCrop`, or
            ``True`` for the default scale (0.08, 1) and ratio (3/4, 4/3). ``None``/``False``
            (evaluation): the largest centred crop of the output's aspect ratio.
        device: Where the output lives; default ``"cuda"`` for nvjpeg, the current CUDA
            device for dali when there is one, else ``"cpu"``.
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
    """
    name = resolve_backend(backend)
    parse_size(size)
    check_on_error(on_error)
    if name == "cpu":
        return CpuDecoder(
            size,
            random_crop=random_crop,
            device=device or "cpu",
            on_error=on_error,
            grayscale=grayscale,
            num_threads=num_threads,
            seed=seed,
        )
    if name == "nvjpeg":
        target = torch.device(device or "cuda")
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
        device=device or default,
        on_error=on_error,
        grayscale=grayscale,
        num_threads=num_threads,
        seed=seed,
    )
