"""A Python dataset object as a preprocessing source (``preprocess(dataset, out, ...)``).

Any map-style dataset works: ``len(dataset)`` and ``dataset[i]`` for ``i`` in
``0..len-1``, items of the forms :mod:`fastdata.preprocess._dataset_items` lists (tuples or
dicts of a PIL image, uint8 ndarray or uint8 tensor, a label and a mask). Every item has
the parts item 0 has. ``dataset.classes`` (torchvision's convention) or the names of a
Hugging Face ``ClassLabel`` label feature become the manifest's ``class_names``; the
``path`` field of each sample holds its index.

How workers get the dataset: the local engine's workers are forked from this process
where that is safe (Linux, CUDA not initialised: :mod:`._fork`), and inherit it as it is
here, picklable or not (an open file, an h5py handle, a lock, a lambda, a class defined in
a notebook or in ``python -``), each reading the index ranges of its chunks. Elsewhere
it is pickled once in this process and unpickled once per spawned worker (Ray: once per
task); one that cannot be pickled is then read in this process alone by the local engine,
with a warning naming both reasons, and refused, with the reason, by the Ray engine and by
a local engine told to spawn (``LocalEngine(n, start_method="spawn")``).
``workers=1`` neither pickles nor forks.

Resumability: the job fingerprint covers the dataset's type, length and class names and
a SHA-256 of the pixels, labels and masks of items ``0``, ``len // 2`` and ``len - 1``
(item 0 is read twice: a dataset returning different pixels for the same index, i.e.
random augmentation, is refused, as its shards could never be byte-identical). A change
elsewhere in the dataset that keeps those three items goes unnoticed: pass
``overwrite=True`` after changing the data behind a dataset.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import logging
import operator
import os
import pickle
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import cv2

from fastdata.errors import DecodeError, PreprocessError
from fastdata.preprocess._dataset_items import (
    LABEL_KEYS,
    DatasetTypeError,
    DatasetValueError,
    LoadedSample,
    load_item,
    sample_digest,
    where,
)
from fastdata.preprocess._engine import Engine, LocalEngine
from fastdata.preprocess._fork import fork_refusal, resolve_start_method
from fastdata.preprocess._sources import SourceItem, SourceListing
from fastdata.preprocess._task import (
    SampleFailure,
    SampleResult,
    ShardJob,
    place_targets,
    process_pixels,
)

logger = logging.getLogger(__name__)

PYTHON_KIND = "python"


@dataclass(frozen=True)
class DatasetItem(SourceItem):
    """Item ``index`` of a dataset source (``path`` reads ``dataset[index]`` in messages)."""

    index: int = 0


class DatasetItems(Sequence[SourceItem]):
    """The items of a dataset source, made when asked for: a range of indices, not a list
    (a listing of 100 million items would take gigabytes before the first is read). A
    slice is another :class:`DatasetItems`, so shard tasks hold ranges too.

    Args:
        indices: The dataset indices, in order.
    """

    def __init__(self, indices: range) -> None:
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, position: int) -> SourceItem: ...

    @overload
    def __getitem__(self, position: slice) -> DatasetItems: ...

    def __getitem__(self, position: int | slice) -> SourceItem | DatasetItems:
        if isinstance(position, slice):
            return DatasetItems(self.indices[position])
        index = self.indices[position]
        return DatasetItem(where(index), str(index), index=index)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DatasetItems) and self.indices == other.indices

    def __hash__(self) -> int:
        return hash(self.indices)

    def __repr__(self) -> str:
        return f"DatasetItems({self.indices})"


def _main_is_importable() -> bool:
    """Whether spawned workers can import ``__main__`` (a script: yes; notebook, stdin: no)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)  # python -: "<stdin>"
    return isinstance(path, str) and os.path.isfile(path)


class _MainRecordingPickler(pickle.Pickler):
    """A pickler noting classes and functions it stores by reference to ``__main__``."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.main_names: list[str] = []

    def reducer_override(self, obj: Any) -> Any:
        if callable(obj) and getattr(obj, "__module__", None) == "__main__":
            self.main_names.append(getattr(obj, "__qualname__", repr(obj)))
        return NotImplemented


def pickle_dataset(dataset: Any) -> tuple[bytes | None, str]:
    """``(payload, "")`` when worker processes can rebuild ``dataset`` from ``payload``,
    else ``(None, reason)``."""
    buffer = io.BytesIO()
    # workers import a script's __main__ as spawn does; only an interactive one needs the
    # (slower, Python-level) check of what refers to it
    pickler = (
        pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        if _main_is_importable()
        else _MainRecordingPickler(buffer)
    )
    try:
        pickler.dump(dataset)
    except Exception as exc:  # PicklingError, TypeError, AttributeError...: all say why
        return None, f"it cannot be pickled ({type(exc).__name__}: {exc})"
    if isinstance(pickler, _MainRecordingPickler) and pickler.main_names:
        return None, (
            f"{pickler.main_names[0]} is defined in __main__ of an interactive session "
            "(a notebook, python - or -c), which worker processes cannot import; define it "
            "in a module"
        )
    return buffer.getvalue(), ""


class DatasetLoader:
    """Reads dataset items for the shard tasks (the job's ``loader``).

    In this process it uses the dataset object itself; pickled into a worker it carries
    the dataset's own pickle (made once by :meth:`prepare_for_workers`) and unpickles it
    on first use.

    Args:
        dataset: The map-style dataset.
        has_labels: Items carry labels (as item 0 does).
        has_masks: Items carry masks (as item 0 does).
        targets: Items carry detection targets: per key (``boxes``, ``labels``, per-box
            extras) its dtype and row shape, as item 0's (empty: none).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        has_labels: bool,
        has_masks: bool,
        targets: tuple[tuple[str, str, tuple[int, ...]], ...] = (),
    ) -> None:
        self._dataset: Any = dataset
        self._payload: bytes | None = None
        self.has_labels = has_labels
        self.has_masks = has_masks
        self.targets = targets

    def prepare_for_workers(self) -> str:
        """Pickle the dataset for worker processes; return ``""``, or why it cannot go."""
        if self._payload is not None:
            return ""
        payload, reason = pickle_dataset(self._dataset)
        self._payload = payload
        return reason

    def __getstate__(self) -> dict[str, Any]:
        if self._payload is None:
            reason = self.prepare_for_workers()
            if reason:
                raise PreprocessError(f"the dataset cannot be sent to worker processes: {reason}")
        return {
            "payload": self._payload,
            "has_labels": self.has_labels,
            "has_masks": self.has_masks,
            "targets": self.targets,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._dataset = None
        self._payload = state["payload"]
        self.has_labels = state["has_labels"]
        self.has_masks = state["has_masks"]
        self.targets = state["targets"]

    @property
    def dataset(self) -> Any:
        """The dataset object (unpickled on first use in a worker process)."""
        if self._dataset is None:
            try:
                self._dataset = pickle.loads(self._payload or b"")
            except Exception as exc:
                raise PreprocessError(
                    f"a worker process cannot unpickle the dataset ({type(exc).__name__}: "
                    f"{exc}); define its class in an importable module, or pass workers=1"
                ) from exc
        return self._dataset

    def process_sample(self, item: SourceItem, job: ShardJob) -> SampleResult:
        """The stored values of one dataset item; a :class:`SampleFailure` when the dataset
        could not read its input (``OSError``, e.g. a corrupt image file it opens).

        Raises:
            DatasetTypeError, DatasetValueError: The item's form is not supported or
                differs from item 0's (a missing label or mask).
            PreprocessError: ``dataset[i]`` raised another exception.
        """
        index = item.index if isinstance(item, DatasetItem) else int(item.name)
        try:
            loaded = load_item(self.dataset, index, job.options.max_pixels)
        except DecodeError as exc:
            return SampleFailure(item.path, exc.message if exc.source == item.path else str(exc))
        except OSError as exc:
            return SampleFailure(item.path, f"cannot read ({type(exc).__name__}: {exc})")
        if (loaded.label is not None) != self.has_labels or (
            loaded.mask is not None
        ) != self.has_masks:
            raise DatasetValueError(
                f"{item.path} has {_parts(loaded.label is not None, loaded.mask is not None)}, "
                f"but dataset[0] has {_parts(self.has_labels, self.has_masks)}: every item "
                "must have the same parts"
            )
        if target_layout(loaded) != self.targets:
            raise DatasetValueError(
                f"{item.path} has detection targets {_layout_text(target_layout(loaded))}, but "
                f"dataset[0] has {_layout_text(self.targets)}: every item must have the same "
                "per-box entries"
            )
        image = loaded.image
        if job.options.grayscale and image.shape[2] == 3:
            image = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)[..., None]
        elif not job.options.grayscale and image.shape[2] == 1:
            image = cv2.cvtColor(image, cv2.COLOR_GRAY2RGB)
        sample, stats = process_pixels(image, loaded.mask, job, item.path, f"{item.path} mask")
        sample["path"] = item.name
        if loaded.label is not None:
            sample["label"] = loaded.label
        if loaded.targets is not None:
            sample.update(place_targets(loaded.targets, image.shape[:2], job.options))
        return sample, stats


def target_layout(sample: LoadedSample) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """Per detection-target key its dtype and row shape (empty without targets)."""
    return tuple(
        (key, array.dtype.name, tuple(array.shape[1:]))
        for key, array in (sample.targets or {}).items()
    )


def _layout_text(layout: tuple[tuple[str, str, tuple[int, ...]], ...]) -> str:
    return ", ".join(f"{key} {dtype} {tail}" for key, dtype, tail in layout) or "none"


def _parts(label: bool, mask: bool) -> str:
    parts = ["an image"] + ["a label"] * label + ["a mask"] * mask
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


@dataclass
class DatasetListing(SourceListing):
    """The listing of a dataset source: one :class:`DatasetItem` per index.

    Attributes:
        loader: Reads the items (the job's ``loader``).
        digest: The fingerprint (see the module docstring).
    """

    loader: DatasetLoader = field(kw_only=True)
    digest: str = field(kw_only=True)

    @property
    def has_labels(self) -> bool:
        return self.loader.has_labels

    @property
    def has_masks(self) -> bool:
        return self.loader.has_masks

    @property
    def target_fields(self) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
        """Detection targets per key: dtype and row shape (empty: none)."""
        return self.loader.targets

    def fingerprint(self) -> str:
        return self.digest

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "dataset": self.root, "num_inputs": len(self.items)}


def _class_names(dataset: Any) -> list[str]:
    """``dataset.classes`` (torchvision's convention), else the names of a Hugging Face
    ``ClassLabel`` feature under a label key (``dataset.features["label"].names``)."""
    try:
        candidates = [getattr(dataset, "classes", None)]
        features = getattr(dataset, "features", None)
    except Exception as exc:  # a property of the dataset's own code failed
        raise PreprocessError(
            f"reading the dataset's class names (.classes, .features) raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(features, Mapping):
        candidates += [getattr(features.get(key), "names", None) for key in LABEL_KEYS]
    for names in candidates:
        is_list = isinstance(names, Sequence) and not isinstance(names, str)
        if is_list and names and all(isinstance(name, str) for name in names):
            return list(names)
    return []


def list_dataset(
    dataset: Any, *, name: str | None = None, max_pixels: int | None = None
) -> DatasetListing:
    """Validate a map-style dataset and list its items (reads items 0, the middle and last).

    Args:
        dataset: An object with ``__len__`` and ``__getitem__`` (see the module docstring).
        name: How the manifest names the source; default ``module.Class`` of the dataset.
        max_pixels: The job's pixel limit: item 0 over it is an error (it decides the
            schema), the others are left to the job's ``on_error``.

    Raises:
        DatasetTypeError: ``dataset`` is not a map-style dataset (e.g. an iterable-style
            one), or an item's form is not supported.
        DatasetValueError: An item has an unsupported shape or value, or item 0 reads
            differently twice (random augmentation).
        PreprocessError: The dataset is empty, or reading a probed item failed.
    """
    kind = type(dataset)
    if not (hasattr(kind, "__len__") and hasattr(kind, "__getitem__")) or isinstance(
        dataset, (str, bytes, Mapping)
    ):
        raise DatasetTypeError(
            f"src must be a path or a map-style dataset (with __len__ and __getitem__), got "
            f"a {kind.__module__}.{kind.__qualname__}; wrap an iterable in a list, or index it"
        )
    try:
        size = len(dataset)
    except Exception as exc:  # the dataset's own code: any failure, reported in one line
        raise PreprocessError(
            f"len() of the dataset ({kind.__qualname__}) raised {type(exc).__name__}: {exc}"
        ) from exc
    if size == 0:
        raise PreprocessError(f"the dataset has no items: {kind.__qualname__} of length 0")
    probes = sorted({0, size // 2, size - 1})
    try:
        first = load_item(dataset, 0, max_pixels)  # item 0 decides the schema
    except (OSError, DecodeError) as exc:
        raise PreprocessError(f"dataset[0] cannot be read: {exc}") from exc
    loaded: dict[int, LoadedSample | None] = {0: first}
    for index in probes[1:]:
        try:
            loaded[index] = load_item(dataset, index, max_pixels)
        except (OSError, DecodeError):
            loaded[index] = None  # on_error decides when the job reaches it
    if sample_digest(load_item(dataset, 0, max_pixels)) != sample_digest(first):
        raise DatasetValueError(
            "dataset[0] differs between two reads: the dataset applies random transforms "
            "(augmentation); preprocess stores one fixed sample per item: build the dataset "
            "without them and augment at training time"
        )
    loader = DatasetLoader(
        dataset,
        has_labels=first.label is not None,
        has_masks=first.mask is not None,
        targets=target_layout(first),
    )
    for index in probes[1:]:
        sample = loaded[index]
        if sample is not None and (sample.label is not None, sample.mask is not None) != (
            loader.has_labels,
            loader.has_masks,
        ):
            raise DatasetValueError(
                f"{where(index)} has {_parts(sample.label is not None, sample.mask is not None)}"
                f", but dataset[0] has {_parts(loader.has_labels, loader.has_masks)}: every "
                "item must have the same parts"
            )
        if sample is not None and target_layout(sample) != loader.targets:
            raise DatasetValueError(
                f"{where(index)} has detection targets {_layout_text(target_layout(sample))}, "
                f"but dataset[0] has {_layout_text(loader.targets)}: every item must have the "
                "same per-box entries"
            )
    class_names = _class_names(dataset)
    label = f"{kind.__module__}.{kind.__qualname__}" if name is None else name
    digest = hashlib.sha256(
        f"{PYTHON_KIND}\0{kind.__module__}.{kind.__qualname__}\0{size}\0{class_names}\0".encode()
    )
    for index in probes:
        sample = loaded[index]
        digest.update(f"{index}:".encode() + (b"-" if sample is None else sample_digest(sample)))
    return DatasetListing(
        PYTHON_KIND,
        label,
        DatasetItems(range(size)),
        class_names,
        loader=loader,
        digest=digest.hexdigest(),
    )


def dataset_engine(loader: DatasetLoader, engine: Engine) -> Engine:
    """The engine that runs a dataset job: ``engine`` when its workers can get the
    dataset (or it has none); for a local engine of ``start_method="auto"`` and a dataset
    that cannot be pickled, a forking :class:`LocalEngine` where that is safe, else one
    reading it here.

    Raises:
        PreprocessError: The dataset cannot be pickled and ``engine`` is not local, or is
            a local engine told to spawn its workers (``start_method="spawn"``).
    """
    if isinstance(engine, LocalEngine):
        if engine.workers == 1 or resolve_start_method(engine.start_method) == "fork":
            return engine  # nothing to pickle: everything runs here, or workers inherit it
        reason = loader.prepare_for_workers()
        if not reason:
            return engine
        if engine.start_method == "spawn":  # asked for: honoured, or refused with why
            raise PreprocessError(
                f"LocalEngine(start_method='spawn') sends the dataset to its worker "
                f"processes, but {reason}; make it picklable (e.g. open files in "
                "__getitem__, not in __init__), or use start_method='auto' (workers fork "
                "and inherit it where that is safe) or workers=1"
            )
        refusal = fork_refusal()
        if refusal:
            logger.warning(
                "the dataset is read in this process only, not by %d worker processes: %s, "
                "and %s; make it picklable (e.g. open files in __getitem__, not in "
                "__init__) to read it in parallel",
                engine.workers,
                reason,
                refusal,
            )
            return LocalEngine(1)
        logger.info(
            "%d worker processes fork from this one to inherit the dataset: %s",
            engine.workers,
            reason,
        )
        return LocalEngine(engine.workers, start_method="fork")
    reason = loader.prepare_for_workers()
    if reason:
        raise PreprocessError(
            f"{type(engine).__name__} sends the dataset to its workers, but {reason}; make it "
            "picklable (e.g. open files in __getitem__, not in __init__), or use the local "
            "engine, whose workers inherit it where they can fork (Linux)"
        )
    return engine


def load_python_source(spec: str) -> Any:
    """The dataset named ``module:attribute`` (or ``path/to/file.py:attribute``): the
    attribute itself, or what it returns when it is a zero-argument callable (a function
    or class) rather than a dataset. The module is imported as ``import`` would, with the
    current folder (or the file's folder) first on ``sys.path``, so that worker processes
    import it the same way.

    Raises:
        PreprocessError: ``spec`` is malformed, the module cannot be imported, the attribute
            is missing, or calling it raised.
    """
    module_name, sep, attribute = spec.rpartition(":")
    if not sep or not module_name or not attribute:
        raise PreprocessError(
            f"--from-python takes module:attribute (e.g. mypackage.data:train_set or "
            f"data.py:make_dataset), got {spec!r}"
        )
    folder = os.getcwd()
    if module_name.endswith(".py"):
        path = Path(module_name).absolute()
        if not path.is_file():
            raise PreprocessError(f"--from-python: no such file {path}")
        folder, module_name = str(path.parent), path.stem
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except SystemExit as exc:  # a script's exit on import, e.g. argparse without arguments
        raise PreprocessError(
            f"--from-python: importing {module_name!r} called sys.exit({exc.code!r}); a "
            'module that runs a script at import needs `if __name__ == "__main__":`'
        ) from exc
    except Exception as exc:
        raise PreprocessError(
            f"--from-python: cannot import {module_name!r} ({type(exc).__name__}: {exc}); "
            f"run from the folder that holds it, or set PYTHONPATH"
        ) from exc
    try:
        value = operator.attrgetter(attribute)(module)
    except AttributeError as exc:
        raise PreprocessError(
            f"--from-python: module {module_name!r} has no attribute {attribute!r}"
        ) from exc
    kind = type(value)
    if callable(value) and not (hasattr(kind, "__len__") and hasattr(kind, "__getitem__")):
        try:
            value = value()
        except (Exception, SystemExit) as exc:
            raise PreprocessError(
                f"--from-python: {spec}() raised {type(exc).__name__}: {exc}"
            ) from exc
    return value
