"""Dataset items → uint8 pixels: the forms a dataset source accepts, checked per item.

An item is ``(image, label)``, ``(image, label, mask)``, ``(image, mask)``, a bare image,
or a dict with an image under ``"image"``/``"img"``, optionally a label under
``"label"``/``"labels"``/``"target"`` and a mask under ``"mask"`` (other keys ignored).
Detection items, torchvision style: ``(image, target)`` with ``target`` a dict holding
``"boxes"`` (``(N, 4)`` xyxy pixels) and ``"labels"`` (``(N,)`` ints), or a dict item with
``"boxes"`` and ``"labels"`` beside its image; other per-box entries of the target
(1-D or 2-D numeric arrays with ``N`` rows, such as ``"iscrowd"`` or ``"area"``) are kept
too, anything else in it (``"image_id"``, per-instance masks) is ignored. Boxes with a
NaN, a negative size or outside the image (by more than a pixel), or labels not one per
box, raise a :class:`~fastdata.errors.DecodeError` of reason ``"bad_annotation"``: the
item is skipped or refused by the ``on_error`` policy, as a corrupt image is.
An image is a PIL image (any mode but ``I`` and ``F``, read by
:func:`fastdata._codec.pil_pixels`, the rule files are decoded with: ``L`` and 16-bit modes
gray, 16 bits keeping their high byte; other modes converted to RGB as torchvision's
loader does), a uint8 ndarray ``(H, W, 3)``, ``(H, W, 1)`` or ``(H, W)``, or a uint8 tensor
``(3, H, W)``, ``(1, H, W)`` or ``(H, W)``. A mask is a single-channel PIL image or an
integer ``(H, W)`` array/tensor with values 0-255, the image's size. A label is an integer
(Python, NumPy, or a one-element integer array/tensor) in ``0..2**63 - 1``. Anything else raises a
:class:`DatasetTypeError`/:class:`DatasetValueError` naming the index and what it
found. torch is never imported here: a dataset of tensors has imported it already.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from fastdata._boxes import check_boxes, clip_to_image
from fastdata._codec import pil_pixels
from fastdata._labels import check_label
from fastdata.errors import DecodeError, PreprocessError

IMAGE_KEYS = ("image", "img")
LABEL_KEYS = ("label", "labels", "target")
MASK_KEYS = ("mask",)
BOXES_KEY = "boxes"
BOX_LABELS_KEY = "labels"
_ITEM_FORMS = (
    "(image, label), (image, label, mask), (image, mask), an image, or a dict with an 'image' "
    "(or 'img') key"
)


class DatasetTypeError(PreprocessError, TypeError):
    """A dataset source, one of its items or a part of one has a type preprocess cannot
    store (a ``TypeError`` and a ``PreprocessError``: the CLI reports it in one line)."""


class DatasetValueError(PreprocessError, ValueError):
    """A dataset item has a shape or value preprocess cannot store, or differs from item 0
    in its parts, or between two reads."""


class LoadedSample(NamedTuple):
    """One dataset item as uint8 pixels, before the offline transforms.

    Attributes:
        image: ``(H, W, 3)`` RGB or ``(H, W, 1)`` gray, uint8.
        mask: ``(H, W)`` uint8, or ``None``.
        label: The label, or ``None``.
        targets: Detection targets, or ``None``: ``"boxes"`` ``(N, 4)`` float32 xyxy pixels
            (clipped to the image), ``"labels"`` ``(N,)`` int64, and any other per-box
            array with ``N`` rows (int64, float32 or uint8 for bools).
    """

    image: np.ndarray
    mask: np.ndarray | None
    label: int | None
    targets: dict[str, np.ndarray] | None = None


def where(index: int) -> str:
    return f"dataset[{index}]"


def _split_item(item: Any, index: int) -> tuple[Any, Any, Any, Any]:
    """``(image, label, mask, targets)`` of one item (``None`` where absent), still in the
    dataset's types."""
    if isinstance(item, Mapping) and BOXES_KEY in item:
        image_keys = [key for key in IMAGE_KEYS if key in item]
        if len(image_keys) != 1:
            raise DatasetTypeError(
                f"{where(index)} is a dict with boxes and keys {sorted(map(str, item))}: it "
                f"needs exactly one image key of {IMAGE_KEYS}"
            )
        targets = {k: v for k, v in item.items() if k not in (*IMAGE_KEYS, *MASK_KEYS)}
        label = targets.pop("label", None)
        mask = next((item[key] for key in MASK_KEYS if key in item), None)
        return item[image_keys[0]], label, mask, targets
    if (
        isinstance(item, (tuple, list))
        and len(item) == 2
        and isinstance(item[1], Mapping)
        and BOXES_KEY in item[1]
    ):
        return item[0], None, None, dict(item[1])
    image, label, mask = _split_plain(item, index)
    return image, label, mask, None


def _split_plain(item: Any, index: int) -> tuple[Any, Any, Any]:
    """``(image, label or None, mask or None)`` of one item, still in the dataset's types."""
    if isinstance(item, Mapping):
        image_keys = [key for key in IMAGE_KEYS if key in item]
        if len(image_keys) != 1:
            found = "none" if not image_keys else f"both {image_keys}"
            raise DatasetTypeError(
                f"{where(index)} is a dict with keys {sorted(map(str, item))}: it needs "
                f"exactly one image key of {IMAGE_KEYS} (found {found})"
            )
        label_keys = [key for key in LABEL_KEYS if key in item]
        if len(label_keys) > 1:
            raise DatasetTypeError(
                f"{where(index)} has several label keys {label_keys}: keep one of {LABEL_KEYS}"
            )
        label = item[label_keys[0]] if label_keys else None
        mask = next((item[key] for key in MASK_KEYS if key in item), None)
        return item[image_keys[0]], label, mask
    if isinstance(item, (tuple, list)):
        if len(item) == 2 and _is_image_like(item[1]) and _ndim(item[1]) >= 2:
            return item[0], None, item[1]  # (image, mask): e.g. torchvision's VOCSegmentation
        if len(item) == 2:
            return item[0], item[1], None
        if len(item) == 3:
            return item[0], item[1], item[2]
        raise DatasetTypeError(
            f"{where(index)} is a {type(item).__name__} of {len(item)} values; "
            f"expected {_ITEM_FORMS}"
        )
    if _is_image_like(item):
        return item, None, None
    raise DatasetTypeError(f"{where(index)} is a {type(item).__name__}; expected {_ITEM_FORMS}")


def _torch_tensor_type() -> Any:
    torch = sys.modules.get("torch")  # a dataset of tensors has imported torch already
    return None if torch is None else torch.Tensor


def _ndim(value: Any) -> int:
    """Dimensions of an array or tensor; 2 for a PIL image."""
    return 2 if isinstance(value, Image.Image) else len(getattr(value, "shape", ()))


def _is_image_like(value: Any) -> bool:
    tensor = _torch_tensor_type()
    return isinstance(value, (Image.Image, np.ndarray)) or (
        tensor is not None and isinstance(value, tensor)
    )


def _describe(value: Any) -> str:
    """``uint8 ndarray of shape (3, 4)``, ``PIL image (RGBA, 32x24)``, ``str``."""
    if isinstance(value, Image.Image):
        return f"PIL image (mode {value.mode}, {value.width}x{value.height})"
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        kind = "tensor" if type(value).__module__.startswith("torch") else "ndarray"
        dtype_name = str(dtype).removeprefix("torch.")
        return f"{dtype_name} {kind} of shape {tuple(shape)}"
    return type(value).__name__


def _to_numpy(value: Any, index: int, part: str) -> np.ndarray:
    """A tensor (CHW kept as is here) or ndarray as an ndarray; anything else refused."""
    tensor = _torch_tensor_type()
    if tensor is not None and isinstance(value, tensor):
        return np.asarray(value.detach().cpu().numpy())
    if isinstance(value, np.ndarray):
        return value
    raise DatasetTypeError(
        f"{where(index)}: the {part} is a {_describe(value)}; expected a PIL image, a uint8 "
        "ndarray (H, W, C) or a uint8 tensor (C, H, W)"
    )


def _check_pixels(height: int, width: int, index: int, max_pixels: int | None) -> None:
    """Refuse an image of more than ``max_pixels`` pixels, as a file's header is refused
    (a PIL image opened lazily is refused before its pixels are decoded)."""
    if max_pixels is not None and height * width > max_pixels:
        raise DecodeError(
            f"the image is {width}x{height} = {height * width:,} pixels, over the limit of "
            f"{max_pixels:,} (max_pixels; raise it to accept such images)",
            where(index),
            "too_large",
        )


def _image_pixels(value: Any, index: int, max_pixels: int | None) -> np.ndarray:
    """``(H, W, 3)`` or ``(H, W, 1)`` uint8, C-contiguous.

    Raises:
        DecodeError: The image has more than ``max_pixels`` pixels (reason ``too_large``).
    """
    if isinstance(value, Image.Image):
        _check_pixels(value.height, value.width, index, max_pixels)
        try:
            pixels = pil_pixels(value)  # the decoders' rule: 16 bits keep the high byte
        except ValueError as exc:  # I or F, or a mode PIL cannot convert (OSError: corrupt)
            raise DatasetValueError(
                f"{where(index)}: the image is a {_describe(value)}; {exc}"
            ) from exc
    else:
        is_tensor = not isinstance(value, np.ndarray)
        array = _to_numpy(value, index, "image")
        if array.dtype != np.uint8:
            hint = (
                " (a float tensor from ToTensor()/Normalize(): build the dataset without them, "
                "preprocess stores uint8 and normalizes on the device)"
                if array.dtype.kind == "f"
                else ""
            )
            raise DatasetTypeError(
                f"{where(index)}: the image is a {_describe(value)}; preprocess stores uint8 "
                f"pixels{hint}"
            )
        if is_tensor and array.ndim == 3:
            if array.shape[0] not in (1, 3):
                raise DatasetValueError(
                    f"{where(index)}: the image is a {_describe(value)}; a tensor image must "
                    "be (3, H, W), (1, H, W) or (H, W)"
                )
            array = array.transpose(1, 2, 0)
        elif array.ndim == 3 and array.shape[2] not in (1, 3):
            raise DatasetValueError(
                f"{where(index)}: the image is a {_describe(value)}; an ndarray image must be "
                "(H, W, 3), (H, W, 1) or (H, W) (a (C, H, W) array: transpose it or pass a "
                "tensor)"
            )
        elif array.ndim not in (2, 3):
            raise DatasetValueError(
                f"{where(index)}: the image is a {_describe(value)}; expected 2 or 3 dimensions"
            )
        pixels = array
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    if pixels.shape[0] == 0 or pixels.shape[1] == 0:
        raise DatasetValueError(f"{where(index)}: the image is empty ({_describe(value)})")
    _check_pixels(pixels.shape[0], pixels.shape[1], index, max_pixels)
    return np.ascontiguousarray(pixels)


def _mask_pixels(value: Any, index: int, image_hw: tuple[int, int]) -> np.ndarray:
    """``(H, W)`` uint8, the image's size."""
    if isinstance(value, Image.Image):
        if value.mode not in ("L", "P", "1"):
            raise DatasetValueError(
                f"{where(index)}: the mask is a {_describe(value)}; a mask must be a "
                "single-channel (L, P or 1 mode) image of class ids"
            )
        mask = np.asarray(value.convert("L") if value.mode == "1" else value, dtype=np.uint8)
    else:
        array = _to_numpy(value, index, "mask")
        if array.ndim == 3 and 1 in (array.shape[0], array.shape[2]):
            array = array.reshape(array.shape[:2] if array.shape[2] == 1 else array.shape[1:])
        if array.ndim != 2 or array.dtype.kind not in "uib":
            raise DatasetTypeError(
                f"{where(index)}: the mask is a {_describe(value)}; expected integer class "
                "ids of shape (H, W)"
            )
        if array.dtype != np.uint8:
            if array.size and (array.min() < 0 or array.max() > 255):
                raise DatasetValueError(
                    f"{where(index)}: the mask holds values {array.min()}..{array.max()}; "
                    "masks are stored as uint8 class ids 0..255"
                )
            array = array.astype(np.uint8)
        mask = array
    if mask.shape != image_hw:
        raise DatasetValueError(
            f"{where(index)}: the mask is {mask.shape[1]}x{mask.shape[0]}, its image "
            f"{image_hw[1]}x{image_hw[0]}; they must have the same size"
        )
    return np.ascontiguousarray(mask)


def _label_value(value: Any, index: int) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return check_label(int(value), where(index), DatasetValueError)
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None and int(np.prod(shape)) == 1:
        array = _to_numpy(value, index, "label") if not isinstance(value, np.ndarray) else value
        if array.dtype.kind in "iu":
            return check_label(int(array.reshape(())), where(index), DatasetValueError)
    raise DatasetTypeError(
        f"{where(index)}: the label is a {_describe(value)} ({value!r:.40}); expected an "
        "integer (int, NumPy integer or a one-element integer tensor)"
    )


def _numeric(value: Any, index: int, part: str) -> np.ndarray:
    """A list, array or tensor as a numeric ndarray (``DatasetTypeError`` otherwise)."""
    tensor = _torch_tensor_type()
    if tensor is not None and isinstance(value, tensor):
        array = np.asarray(value.detach().cpu().numpy())
    else:
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise DatasetTypeError(f"{where(index)}: the {part} is a {_describe(value)}") from exc
    if array.dtype.kind not in "biuf":
        raise DatasetTypeError(
            f"{where(index)}: the {part} is a {_describe(value)}; expected numbers"
        )
    return array


def _target_arrays(value: Any, index: int, image_hw: tuple[int, int]) -> dict[str, np.ndarray]:
    """The checked detection targets of one item (see :class:`LoadedSample`).

    Raises:
        DatasetTypeError: The target is not a dict, or boxes or labels are not numbers.
        DecodeError: Bad boxes or labels (reason ``bad_annotation``).
    """
    if not isinstance(value, Mapping):
        raise DatasetTypeError(
            f"{where(index)}: the target is a {_describe(value)}; expected a dict"
        )
    boxes = _numeric(value[BOXES_KEY], index, "boxes").astype(np.float32)
    if boxes.size == 0:
        boxes = boxes.reshape(0, 4)
    problem = check_boxes(boxes, image_hw)
    if problem is not None:
        raise DecodeError(problem, where(index), "bad_annotation")
    count = len(boxes)
    if BOX_LABELS_KEY not in value:
        raise DatasetTypeError(f"{where(index)}: the target has boxes but no 'labels'")
    labels = _numeric(value[BOX_LABELS_KEY], index, "labels").reshape(-1)
    if len(labels) != count:
        raise DecodeError(f"{len(labels)} labels for {count} boxes", where(index), "bad_annotation")
    if labels.dtype.kind == "f" and not np.array_equal(labels, np.round(labels)):
        raise DatasetTypeError(f"{where(index)}: the labels are not integers ({labels[:4]!r})")
    targets: dict[str, np.ndarray] = {
        BOXES_KEY: clip_to_image(boxes, image_hw),
        BOX_LABELS_KEY: labels.astype(np.int64),
    }
    for key, extra in value.items():
        if key in (BOXES_KEY, BOX_LABELS_KEY) or not isinstance(key, str):
            continue
        array = np.asarray(extra) if not hasattr(extra, "detach") else extra.detach().cpu().numpy()
        if array.dtype.kind not in "biuf" or array.ndim not in (1, 2) or len(array) != count:
            continue  # not per box (an image id, instance masks): not stored
        if array.dtype.kind == "b":
            array = array.astype(np.uint8)
        elif array.dtype.kind in "iu":
            array = array.astype(np.int64)
        else:
            array = array.astype(np.float32)
        targets[key] = np.ascontiguousarray(array)
    return targets


def load_item(dataset: Any, index: int, max_pixels: int | None = None) -> LoadedSample:
    """Read ``dataset[index]`` and convert it to uint8 pixels (see the module docstring).

    Args:
        dataset: The map-style dataset.
        index: The item to read.
        max_pixels: An image of more pixels (width x height) is refused; ``None``: no limit.

    Raises:
        DatasetTypeError, DatasetValueError: The item is not of a supported form.
        OSError, DecodeError: The dataset could not read the input (a corrupt file), or
            the image is over ``max_pixels`` (``DecodeError`` of reason ``too_large``).
        PreprocessError: ``dataset[index]`` raised another exception.
    """
    try:
        item = dataset[index]
    except (OSError, DecodeError):
        raise
    except Exception as exc:
        raise PreprocessError(
            f"{where(index)} raised {type(exc).__name__}: {exc}".rstrip(": ")
        ) from exc
    image_value, label_value, mask_value, target_value = _split_item(item, index)
    image = _image_pixels(image_value, index, max_pixels)
    mask = None if mask_value is None else _mask_pixels(mask_value, index, image.shape[:2])
    label = None if label_value is None else _label_value(label_value, index)
    targets = None if target_value is None else _target_arrays(target_value, index, image.shape[:2])
    return LoadedSample(image, mask, label, targets)


def sample_digest(sample: LoadedSample) -> bytes:
    digest = hashlib.sha256(f"{sample.image.shape}\0{sample.label}\0".encode())
    digest.update(sample.image.tobytes())
    if sample.mask is not None:
        digest.update(b"mask")
        digest.update(sample.mask.tobytes())
    for key, array in sorted((sample.targets or {}).items()):
        digest.update(f"{key}\0{array.dtype}\0{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.digest()
