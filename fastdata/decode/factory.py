"""``create_decoder``: one entry point for every decoder backend.

The backends live in one registry, ``_REGISTRY`` (name to decoder class plus what
differs between them: the default device, whether they take CPU threads, and where
they can run). A new backend is one entry there, made by :func:`register_decoder`:
``create_decoder``, ``resolve_backend`` and :func:`backend_names` read it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fastdata._codec import DEFAULT_MAX_PIXELS
from fastdata._optional import install_hint
from fastdata.decode._base import Decoder
from fastdata.decode._geometry import parse_size
from fastdata.decode.cpu import CpuDecoder
from fastdata.decode.dali import DaliDecoder
from fastdata.decode.nvjpeg import (
    NvJpegDecoder,
    check_torchvision,
    torchvision_too_old,
    torchvision_version,
)
from fastdata.errors import OnError
from fastdata.ops import Executor, RandomResizedCrop


@dataclass(frozen=True)
class _Backend:
    """One registered decoder backend.

    Attributes:
        decoder: The :class:`Decoder` subclass; called as
            ``decoder(size, random_crop=..., device=..., on_error=..., grayscale=..., seed=...,
            max_pixels=...)``.
        default_device: The device used when ``create_decoder`` is given none.
        threaded: Whether the class also takes ``num_threads``.
        check_device: Called with the target device before the decoder is built; raises
            if the backend cannot run there (``None``: any device).
    """

    decoder: type[Decoder]
    default_device: Callable[[], str]
    threaded: bool
    check_device: Callable[[torch.device], None] | None = None


def _check_nvjpeg_device(target: torch.device) -> None:
    """nvJPEG decodes on CUDA only.

    Raises:
        ValueError: ``target`` is not a CUDA device, or CUDA is not available.
    """
    if target.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(
            f"backend='nvjpeg' decodes on a CUDA device, got device={str(target)!r} with "
            f"torch.cuda.is_available()={torch.cuda.is_available()}; use backend='cpu'"
        )


def _cuda_if_available() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


_REGISTRY: dict[str, _Backend] = {
    "cpu": _Backend(CpuDecoder, default_device=lambda: "cpu", threaded=True),
    "nvjpeg": _Backend(
        NvJpegDecoder,
        default_device=lambda: "cuda",
        threaded=False,
        check_device=_check_nvjpeg_device,
    ),
    "dali": _Backend(DaliDecoder, default_device=_cuda_if_available, threaded=True),
}


def backend_names() -> tuple[str, ...]:
    """The names ``create_decoder`` takes: ``"auto"`` and every registered backend."""
    return ("auto", *_REGISTRY)


def register_decoder(
    cls: type[Decoder],
    *,
    default_device: str | Callable[[], str] = "cpu",
    threaded: bool = False,
) -> type[Decoder]:
    """Make ``cls`` the backend named ``cls.backend`` (usable as a decorator).

    The class is then built by ``create_decoder(cls.backend, size=...)`` as
    ``cls(size, random_crop=..., device=..., on_error=..., grayscale=..., seed=...,
    max_pixels=...)`` (plus ``num_threads=...`` when ``threaded``), and runs wherever a
    decoder does (:class:`DecodingLoader`, ``decode_stream``). It subclasses
    :class:`Decoder` and implements ``_decode(buffers) -> DecodedBatch``: the 1-D uint8
    arrays of a batch, already checked and within ``max_pixels``, to the images that
    decoded (``(K, C, H, W)`` uint8 on ``self.device``) and their indices in the batch.

    Example:
        >>> @register_decoder                                       # doctest: +SKIP
        ... class PillowDecoder(Decoder):
        ...     backend = "pillow"
        ...     def _decode(self, buffers): ...
        >>> decoder = create_decoder("pillow", size=224)            # doctest: +SKIP

    Args:
        cls: A :class:`Decoder` subclass whose ``backend`` names it.
        default_device: The device used when ``create_decoder`` is given none (or a
            function returning it, called then).
        threaded: Whether ``cls`` takes ``num_threads``.

    Returns:
        ``cls``.

    Raises:
        TypeError: ``cls`` is not a :class:`Decoder` subclass, or ``default_device`` is
            neither a str nor callable.
        ValueError: ``cls.backend`` is empty or ``"auto"``, or another class already has
            the name.
    """
    if not (isinstance(cls, type) and issubclass(cls, Decoder)):
        raise TypeError(f"cls must be a Decoder subclass, got {cls!r}")
    name = cls.backend
    if not isinstance(name, str) or not name.strip() or name == "auto":
        raise ValueError(
            f"{cls.__qualname__}.backend must name the backend (a non-empty str other than "
            f"'auto'), got {name!r}"
        )
    if not (isinstance(default_device, str) or callable(default_device)):
        raise TypeError(
            f"default_device must be a device name or a function returning one, got "
            f"{default_device!r}"
        )
    held = _REGISTRY.get(name)
    if held is not None and held.decoder is not cls:
        raise ValueError(f"decoder backend {name!r} is already {held.decoder.__qualname__}")
    if isinstance(default_device, str):
        default_device = functools.partial(str, default_device)
    _REGISTRY[name] = _Backend(cls, default_device=default_device, threaded=bool(threaded))
    return cls


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
    if backend not in backend_names():
        raise ValueError(f"backend must be one of {backend_names()}, got {backend!r}")
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
    random_crop: RandomResizedCrop | Executor | bool | None = None,
    device: torch.device | str | int | None = None,
    on_error: OnError | str = "raise",
    grayscale: bool = False,
    num_threads: int | None = None,
    seed: int | None = None,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
) -> Decoder:
    """A decoder that turns a batch of encoded images into a uint8 batch on a device.

    Example:
        >>> decoder = create_decoder("cpu", size=224)
        >>> images = decoder([jpeg_bytes_1, jpeg_bytes_2])  # (2, 3, 224, 224) uint8

    Args:
        backend: ``"cpu"`` (OpenCV threads, reduced-size JPEG decoding), ``"nvjpeg"``
            (torchvision's batched nvJPEG on CUDA), ``"dali"`` (an NVIDIA DALI pipeline;
            CPU-only when ``device`` is the CPU), ``"auto"`` (nvjpeg when CUDA and
            torchvision >= 0.20 are present and ``device`` is unset or CUDA, else cpu;
            the choice and why are logged at INFO on the ``fastdata.decode`` logger), or
            a backend added with :func:`register_decoder`.
        size: Output ``(height, width)``, or an int for a square.
        random_crop: Random resized crop for training: a
            :class:`~fastdata.transforms.RandomResizedCrop` of the decoder's ``size`` (or the
            device module, or the description either holds as ``.op``), or ``True`` for the
            default scale (0.08, 1) and ratio (3/4, 4/3). ``None``/``False`` (evaluation):
            the largest centred crop of the output's aspect ratio.
        device: Where the output lives (an int is that CUDA device, e.g. ``local_rank``);
            default the current CUDA device for nvjpeg, and for dali when there is one,
            else ``"cpu"``.
        on_error: A sample that cannot be decoded: ``"raise"`` a
            :class:`~fastdata.DecodeError`, ``"warn"`` or ``"skip"`` (leave it out of the
            batch); see :class:`~fastdata.errors.OnError`.
        grayscale: One output channel instead of RGB.
        num_threads: CPU threads for the cpu and dali backends (default: usable CPUs).
        seed: Seed of the random crops (reproducible across backends).
        max_pixels: An image whose header claims more pixels (width x height) is refused
            before any backend decodes it, as a :class:`~fastdata.DecodeError` that
            ``on_error`` handles (every backend: a GPU one never allocates for it);
            ``0`` or ``None``: no limit. Default: PIL's limit, 89,478,485.

    Returns:
        A :class:`Decoder`: ``decoder(list_of_encoded)`` gives ``(B, C, H, W)`` uint8
        (channels_last memory format); ``decoder.decode(...)`` also gives the kept indices.

    Raises:
        ValueError: Unknown backend or on_error, bad size or max_pixels, or nvjpeg
            without CUDA.
        TypeError: ``size`` or ``random_crop`` of the wrong type.
        ModuleNotFoundError: The backend's optional package is missing (the message
            gives the pip command).
        FastDataError: nvjpeg with torchvision older than 0.20.
    """
    target = _check_device(device)
    name = resolve_backend(backend, target)
    parse_size(size)
    entry = _REGISTRY[name]
    target = torch.device(target) if target is not None else torch.device(entry.default_device())
    if entry.check_device is not None:
        entry.check_device(target)
    kwargs: dict[str, Any] = {"num_threads": num_threads} if entry.threaded else {}
    return entry.decoder(
        size,
        random_crop=random_crop,
        device=target,
        on_error=on_error,
        grayscale=grayscale,
        seed=seed,
        max_pixels=max_pixels,
        **kwargs,
    )


def _check_device(device: torch.device | str | int | None) -> torch.device | str | None:
    """``device`` with an int read as that CUDA device.

    Raises:
        TypeError: ``device`` is a bool or not a str, int or torch.device.
    """
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device, type(None))):
        raise TypeError(f"device must be a str, int or torch.device, got {device!r}")
    if isinstance(device, int):
        return torch.device("cuda", device)
    return device
