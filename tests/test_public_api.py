"""The public surface: what each package exports, and who may import what.

Each public package's ``__all__`` is its whole public namespace (every name resolves, every
class and function has a docstring for its API reference page, and nothing public-looking
sits beside it), and no package reaches into another package's private names.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import fastdata

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fastdata"
DOCS = ROOT / "docs"


def public_packages() -> list[str]:
    """``fastdata`` and its public subpackages (the CLI has no ``__all__``: it is
    documented by ``--help``)."""
    names = [
        f"fastdata.{info.name}"
        for info in pkgutil.iter_modules(fastdata.__path__)
        if info.ispkg and not info.name.startswith("_") and info.name != "cli"
    ]
    return ["fastdata", *sorted(names)]


@pytest.mark.parametrize("name", public_packages())
def test_every_exported_name_resolves_and_is_documented(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    for public in exported:
        value = getattr(module, public)  # AttributeError names what does not resolve
        if inspect.isclass(value) or inspect.isfunction(value):
            assert inspect.getdoc(value), f"{name}.{public} has no docstring for the API reference"


@pytest.mark.parametrize("name", public_packages())
def test_the_namespace_holds_only_what_all_exports(name: str) -> None:
    """A name a package's ``__init__`` imports but does not export would look public; the
    library imports such names from the private module that defines them instead."""
    module = importlib.import_module(name)
    names = set(dir(module))  # fastdata's lists its lazily loaded names too
    extra = sorted(
        public
        for public in names - {"annotations", "TYPE_CHECKING"}  # __future__, typing
        if not public.startswith("_")
        and public not in module.__all__
        and not isinstance(getattr(module, public), types.ModuleType)  # submodules
        and getattr(getattr(module, public), "__module__", "fastdata").startswith("fastdata")
    )
    assert not extra, f"{name} holds public names missing from __all__: {extra}"


def test_reference_pages_render_every_public_package() -> None:
    """The API reference pages render each subpackage's ``__all__`` (``::: fastdata.x``)."""
    for name in public_packages()[1:]:
        page = DOCS / "reference" / f"{name.split('.')[1]}.md"
        assert f"::: {name}\n" in page.read_text(), f"{page} does not render {name}"


def owning_package(path: Path) -> str | None:
    """The package a file under ``fastdata/`` belongs to (``"datasets"``), or ``None`` for
    the top-level modules (``fastdata/_crop.py``, ``fastdata/errors.py``...)."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_top_level_module(name: str) -> bool:
    """``fastdata._crop`` and the like: the shared internal modules of ``fastdata/`` (a
    compiled one, ``fastdata._lookup``, by its type stub), and its shared internal
    packages (``fastdata._storage``)."""
    return (
        (PACKAGE / f"{name}.py").is_file()
        or (PACKAGE / f"{name}.pyi").is_file()
        or (name.startswith("_") and (PACKAGE / name / "__init__.py").is_file())
    )


def imports(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """``(line, module, imported names)`` of every import of a fastdata module in ``path``,
    also inside functions; relative imports resolved; ``import a.b`` gives no names."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "fastdata":
                    yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] == "fastdata":
                yield node.lineno, target, [alias.name for alias in node.names]


def is_private(name: str) -> bool:
    """``_name`` is private; a dunder (``__version__``) is not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reaches(path: Path) -> list[str]:
    """What ``path`` imports of another package's private names.

    The rule: a file of package ``fastdata.<pkg>`` may import anything of ``<pkg>``. From
    anywhere else it imports only public names: no module path component after
    ``fastdata`` starting with ``_`` (``fastdata.transforms._base``) and no imported name
    starting with ``_`` (``from fastdata.datasets.shard_dataset import _known_fields``).
    The one exception is the top-level shared internal modules (``fastdata/_crop.py``,
    ``fastdata/_system.py``...) and packages (``fastdata/_storage/``), which every package
    may import (``from fastdata import _system``, ``from fastdata._crop import
    parse_size``, ``from fastdata._storage import shard_files``), though not their own
    underscore names or a shared package's private modules (``fastdata._storage._s3``).
    Top-level modules belong to no package, so they follow the same rule.
    Tests, benchmarks and tools may import anything.
    """
    own = owning_package(path)
    found = []
    for line, target, names in imports(path):
        parts = target.split(".")[1:]  # after "fastdata"
        where = f"{path.relative_to(ROOT)}:{line}: {target}"
        if parts and parts[0] == own:
            continue
        if parts and is_top_level_module(parts[0]):
            if any(part.startswith("_") for part in parts[1:]):
                found.append(f"{where} (a private module of fastdata.{parts[0]})")
                continue
            private = [name for name in names if is_private(name)]
            found += [f"{where} import {name}" for name in private]
            continue
        if any(part.startswith("_") for part in parts):
            found.append(f"{where} (a private module of fastdata.{parts[0]})")
            continue
        for name in names:
            if name.startswith("_") and not (not parts and is_top_level_module(name)):
                found.append(f"{where} import {name}")
    return found


def test_no_package_imports_another_packages_private_names() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50
    reaches = [reach for path in files for reach in private_reaches(path)]
    assert not reaches, "give what is shared a public name:\n" + "\n".join(reaches)


@pytest.mark.parametrize(
    ("source", "where", "reaches"),
    [
        ("from fastdata.transforms._base import stack_images", "datasets/_x.py", True),
        ("from fastdata.transforms import _base", "datasets/_x.py", True),
        ("import fastdata.preprocess._options", "cli/x.py", True),
        ("from fastdata.datasets.shard_dataset import _known_fields", "tune/x.py", True),
        ("from fastdata._crop import _private", "decode/x.py", True),
        ("from .._base import check", "datasets/_x.py", True),
        ("from fastdata.transforms import Compose", "datasets/_x.py", False),
        ("from fastdata.transforms._base import stack_images", "transforms/x.py", False),
        ("from ._base import check", "transforms/x.py", False),
        ("from fastdata._crop import parse_size", "decode/x.py", False),
        ("from fastdata import _system", "datasets/_x.py", False),
        ("from fastdata.shards import load_manifest", "_crop.py", False),
        ("from fastdata.shards._schema import x", "_crop.py", True),
        ("from fastdata._version import __version__", "cli/x.py", False),
        ("from fastdata._version import _private", "cli/x.py", True),
        ("from fastdata._shared import shard_files", "shards/x.py", False),
        ("from fastdata._shared._s3 import S3Store", "shards/x.py", True),
        ("from fastdata._shared import _backend", "shards/x.py", True),
        ("from ._s3 import S3Store", "_shared/x.py", False),
    ],
)
def test_the_private_import_rule(
    source: str, where: str, reaches: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule of :func:`private_reaches` on a fake tree (the relative import in
    ``datasets/_x.py`` reaches ``fastdata._base``, which is no top-level module)."""
    root = tmp_path
    package = root / "fastdata"
    (package / where).parent.mkdir(parents=True, exist_ok=True)
    for shared in ("_crop.py", "_system.py", "_version.py", "_shared/__init__.py"):
        (package / shared).parent.mkdir(parents=True, exist_ok=True)
        (package / shared).write_text("")
    (package / where).write_text(source + "\n")
    monkeypatch.setitem(globals(), "ROOT", root)
    monkeypatch.setitem(globals(), "PACKAGE", package)
    assert bool(private_reaches(package / where)) is reaches, private_reaches(package / where)


# Every public namespace and exactly what it exports: a name added to or dropped from an
# ``__all__`` is a decision made here too. ``fastdata`` holds what a training script calls;
# each subpackage adds what its own users call; ``fastdata.preprocess.engine`` is for
# engine authors.
PUBLIC_NAMES = {
    "fastdata": [
        "DecodeError", "DecodingLoader", "FastDataError", "InsufficientMemoryError",
        "OnError", "PreprocessError", "PreprocessOptions", "RAMDataset",
        "ShardAwareDistributedSampler", "ShardDataset", "ShardFormatError", "StorageError",
        "__version__", "autotune", "create_decoder", "load_manifest", "passthrough_collate",
        "profile", "share_on_node",
    ],
    "fastdata.datasets": [
        "MemoryReport", "RAMDataset", "RaggedCollate", "ReadOptions", "ResumableDataLoader",
        "ShardAwareDistributedSampler", "ShardDataset", "pad_ragged", "passthrough_collate",
        "share_on_node",
    ],
    "fastdata.decode": [
        "DecodedBatch", "Decoder", "DecoderRecipe", "DecodingLoader", "create_decoder",
        "register_decoder",
    ],
    "fastdata.gpu": [
        "DeviceAugMix", "DeviceColorJitter", "DeviceCutMix", "DeviceGaussianBlur",
        "DeviceLetterbox",
        "DeviceMixUp", "DevicePrefetcher", "DeviceRandAugment", "DeviceRandomAdjustSharpness",
        "DeviceRandomAffine", "DeviceRandomAutocontrast", "DeviceRandomEqualize",
        "DeviceRandomErasing", "DeviceRandomGrayscale", "DeviceRandomHorizontalFlip",
        "DeviceRandomInvert", "DeviceRandomIoUCrop", "DeviceRandomPosterize",
        "DeviceRandomResizedCrop", "DeviceRandomSolarize", "DeviceStepModule",
        "DeviceTrivialAugmentWide", "MaskToLong", "Normalize", "PaddedBoxes", "compact",
        "to_device",
    ],
    "fastdata.ops": [
        "AugMix", "CenterCrop", "ColorJitter", "CutMix", "Executor", "GaussianBlur", "Letterbox",
        "MixUp",
        "Operation", "RandAugment", "RandomAdjustSharpness", "RandomAffine",
        "RandomAutocontrast", "RandomEqualize", "RandomErasing", "RandomGrayscale",
        "RandomHorizontalFlip", "RandomInvert", "RandomIoUCrop", "RandomPosterize",
        "RandomResizedCrop", "RandomSolarize", "Resize", "TrivialAugmentWide",
    ],
    "fastdata.preprocess": [
        "ANNOTATION_FORMATS", "DEFAULT_SHARD_BYTES", "RESIZE_MODES", "SOURCE_KINDS",
        "STORAGE_MODES", "AnnotationError", "CocoDetection", "DetectionSource", "FileListSource",
        "ImageFolderSource", "NpyFolderSource", "PreprocessOptions", "PreprocessSummary",
        "RayEngine", "SegmentationSource", "Source", "VocDetection", "YoloDetection",
        "load_python_source", "open_annotations", "preprocess",
    ],
    "fastdata.preprocess.engine": [
        "Engine", "LocalEngine", "ShardJob", "ShardResult", "ShardTask", "run_shard_task",
    ],
    "fastdata.shards": [
        "COMPRESSIONS", "Column", "FieldKind", "FieldSpec", "MANIFEST_NAME", "Manifest",
        "ShardInfo", "ShardReader", "ShardWriter", "VerifyProblem", "load_manifest",
        "register_field_kind", "save_manifest", "verify_shards",
    ],
    "fastdata.transforms": [
        "AugMix", "BatchTransform", "CenterCrop", "ColorJitter", "Compose", "CutMix", "FieldBatch",
        "GaussianBlur", "GeometricTransform", "Geometry", "Letterbox", "MixUp", "Move",
        "RandAugment", "RandomAdjustSharpness", "RandomAffine", "RandomAutocontrast",
        "RandomChoice", "RandomEqualize", "RandomErasing", "RandomGrayscale",
        "RandomHorizontalFlip", "RandomInvert", "RandomIoUCrop", "RandomPosterize",
        "RandomResizedCrop", "RandomSolarize", "Resize", "StepTransform", "TrivialAugmentWide",
        "register_mover",
    ],
    "fastdata.tune": [
        "LoaderConfig", "Measurement", "ProfileReport", "TuneResult", "autotune", "profile",
    ],
}  # fmt: skip


def test_every_public_namespace_is_pinned() -> None:
    modules = ["fastdata.ops", "fastdata.preprocess.engine"]  # public modules with an __all__
    assert sorted(PUBLIC_NAMES) == sorted([*public_packages(), *modules])


@pytest.mark.parametrize("name", sorted(PUBLIC_NAMES))
def test_each_namespace_exports_exactly_its_pinned_names(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(PUBLIC_NAMES[name]), (
        f"{name}.__all__ changed: added {sorted(set(module.__all__) - set(PUBLIC_NAMES[name]))}, "
        f"dropped {sorted(set(PUBLIC_NAMES[name]) - set(module.__all__))}; update PUBLIC_NAMES "
        "if that is meant"
    )
    for public in PUBLIC_NAMES[name]:
        getattr(module, public)


ENGINE_NAMES = PUBLIC_NAMES["fastdata.preprocess.engine"]


def test_engine_author_names_live_in_the_engine_module_only() -> None:
    """What only an engine author needs is ``fastdata.preprocess.engine``'s, not the
    preprocessing package's (one place per name)."""
    import fastdata.preprocess  # noqa: PLC0415
    import fastdata.preprocess.engine  # noqa: PLC0415

    for name in ENGINE_NAMES:
        assert getattr(fastdata.preprocess.engine, name).__doc__, name
        assert name not in fastdata.preprocess.__all__
        assert not hasattr(fastdata.preprocess, name), f"fastdata.preprocess.{name} still resolves"
        with pytest.raises(ImportError):
            exec(f"from fastdata.preprocess import {name}", {})


def executor_classes(name: str) -> list[type]:
    """The classes ``name`` exports that run a description (those with an ``op_type``)."""
    module = importlib.import_module(name)
    values = [getattr(module, public) for public in module.__all__]
    return [value for value in values if inspect.isclass(value) and hasattr(value, "op_type")]


def test_descriptions_executors_and_device_modules_are_one_family_of_names() -> None:
    """Users write the CPU executors' names (``transforms.RandomHorizontalFlip``); the
    description each holds as ``.op`` carries the same name (``ops.RandomHorizontalFlip``)
    and the device module runs it as ``Device`` + that name."""
    import fastdata.ops  # noqa: PLC0415

    cpu = executor_classes("fastdata.transforms")
    device = executor_classes("fastdata.gpu")
    assert len(cpu) > 15 and len(device) > 15
    mismatched = [
        f"{cls.__module__}.{cls.__name__} runs ops.{cls.op_type.__name__}"
        for cls, prefix in [*((cls, "") for cls in cpu), *((cls, "Device") for cls in device)]
        if cls.__name__ != prefix + cls.op_type.__name__
    ]
    assert not mismatched, "one name per augmentation:\n" + "\n".join(mismatched)
    for cls in [*cpu, *device]:
        assert getattr(fastdata.ops, cls.op_type.__name__) is cls.op_type
