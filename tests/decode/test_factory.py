from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fastdata.datasets import ShardDataset, passthrough_collate
from fastdata.decode import (
    DecodedBatch,
    Decoder,
    DecodingLoader,
    create_decoder,
    dali,
    factory,
    nvjpeg,
    register_decoder,
)
from fastdata.decode.factory import resolve_backend
from fastdata.decode.nvjpeg import load_decode_jpeg
from fastdata.errors import FastDataError, OnError
from fastdata.preprocess import PreprocessOptions, preprocess


def test_auto_picks_nvjpeg_only_with_cuda_and_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_backend("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(factory, "_has_torchvision", lambda: False)
    assert resolve_backend("auto") == "cpu"
    monkeypatch.setattr(factory, "_has_torchvision", lambda: True)
    monkeypatch.setattr(factory, "torchvision_version", lambda: "0.20.0")
    assert resolve_backend("auto") == "nvjpeg"
    assert resolve_backend("dali") == "dali"


def test_auto_decoder_works_here() -> None:
    decoder = create_decoder(size=16)
    assert isinstance(decoder, Decoder) and decoder.backend in ("cpu", "nvjpeg")
    assert "size=(16, 16)" in repr(decoder)


def test_missing_dali_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = dali.import_optional

    def no_dali(module: str, purpose: str) -> Any:
        if module.startswith("nvidia.dali"):
            raise ModuleNotFoundError(
                f"{purpose} needs 'nvidia-dali-cuda130'. Install it with: "
                "pip install 'nvidia-dali-cuda130'"
            )
        return real_import(module, purpose)

    monkeypatch.setattr(dali, "import_optional", no_dali)
    with pytest.raises(ModuleNotFoundError, match="pip install 'nvidia-dali-cuda130'"):
        create_decoder("dali", size=16, device="cpu")


def test_missing_torchvision_names_the_gpu_extra() -> None:
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed")
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'torch-fastdata\[gpu\]'"):
        load_decode_jpeg(grayscale=False)


def test_importing_decode_loads_no_optional_backend() -> None:
    code = (
        "import sys, fastdata.decode; "
        "print(any(m.startswith(('nvidia.dali', 'torchvision')) for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.fixture
def cuda_and_torchvision(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A machine with CUDA and torchvision 0.21 (as far as backend choice can tell)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(factory, "_has_torchvision", lambda: True)
    monkeypatch.setattr(factory, "torchvision_version", lambda: "0.21.0")
    monkeypatch.setattr(nvjpeg, "torchvision_version", lambda: "0.21.0")
    return monkeypatch


def test_auto_honours_a_cpu_device(cuda_and_torchvision: pytest.MonkeyPatch) -> None:
    assert resolve_backend("auto") == "nvjpeg"
    assert resolve_backend("auto", "cpu") == "cpu"
    assert resolve_backend("auto", torch.device("cpu")) == "cpu"
    decoder = create_decoder("auto", size=16, device="cpu")
    assert decoder.backend == "cpu" and decoder.device == torch.device("cpu")


def test_auto_logs_its_choice_and_why(
    cuda_and_torchvision: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="fastdata.decode"):
        resolve_backend("auto")
        resolve_backend("auto", "cpu")
    assert [r.getMessage() for r in caplog.records] == [
        "decoder backend 'auto' chose 'nvjpeg': CUDA and torchvision >= 0.20 are present",
        "decoder backend 'auto' chose 'cpu': the requested device is 'cpu'",
    ]


def test_torchvision_before_0_20_is_refused_or_warned(
    cuda_and_torchvision: pytest.MonkeyPatch,
) -> None:
    cuda_and_torchvision.setattr(factory, "torchvision_version", lambda: "0.19.1+cu121")
    cuda_and_torchvision.setattr(nvjpeg, "torchvision_version", lambda: "0.19.1+cu121")
    with pytest.raises(FastDataError, match=r"torchvision >= 0.20 .* found torchvision 0.19.1"):
        resolve_backend("nvjpeg")
    with pytest.raises(FastDataError, match=r"found torchvision 0\.19\.1"):
        load_decode_jpeg(grayscale=False)
    with pytest.warns(RuntimeWarning, match="predates batched GPU decoding"):
        assert resolve_backend("auto") == "cpu"


def test_registry_lists_exactly_the_backends() -> None:
    assert set(factory._REGISTRY) == {"cpu", "nvjpeg", "dali"}
    assert factory.backend_names() == ("auto", "cpu", "nvjpeg", "dali")
    for name, entry in factory._REGISTRY.items():
        assert issubclass(entry.decoder, Decoder), name


def test_unknown_backend_names_the_registered_ones() -> None:
    with pytest.raises(
        ValueError, match=r"backend must be one of \('auto', 'cpu', 'nvjpeg', 'dali'\)"
    ):
        create_decoder("turbojpeg", size=16)


@pytest.mark.parametrize("device", [True, 1.5])
def test_device_of_the_wrong_type_is_a_type_error(device: Any) -> None:
    with pytest.raises(TypeError, match=r"device must be a str, int or torch\.device"):
        create_decoder("cpu", size=16, device=device)


def test_each_backend_gets_the_arguments_it_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry passes num_threads only to threaded backends, and fills the default device."""
    calls: dict[str, dict[str, Any]] = {}

    def recorder(name: str) -> Any:
        def make(size: Any, **kwargs: Any) -> str:
            calls[name] = {"size": size, **kwargs}
            return name

        return make

    for name, entry in list(factory._REGISTRY.items()):
        fake = factory._Backend(
            recorder(name), entry.default_device, entry.threaded, entry.check_device
        )  # type: ignore[arg-type]
        monkeypatch.setitem(factory._REGISTRY, name, fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(factory, "torchvision_version", lambda: "0.21.0")
    for name in ("cpu", "nvjpeg", "dali"):
        create_decoder(
            name, size=8, num_threads=3, seed=5, grayscale=True, on_error="skip", max_pixels=9
        )
    common = {"size": 8, "random_crop": None, "on_error": "skip", "grayscale": True, "seed": 5}
    common["max_pixels"] = 9
    assert calls["cpu"] == {**common, "device": torch.device("cpu"), "num_threads": 3}
    assert calls["nvjpeg"] == {**common, "device": torch.device("cuda")}
    assert calls["dali"] == {**common, "device": torch.device("cuda"), "num_threads": 3}


def test_on_error_is_parsed_once_by_the_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """``create_decoder`` hands ``on_error`` on as given; the decoder parses it, once."""
    parsed: list[object] = []
    parse = OnError.parse.__func__  # type: ignore[attr-defined]

    def counting_parse(cls: type[OnError], value: OnError | str, name: str = "on_error") -> OnError:
        parsed.append(value)
        return parse(cls, value, name)  # type: ignore[no-any-return]

    monkeypatch.setattr(OnError, "parse", classmethod(counting_parse))
    decoder = create_decoder("cpu", size=8, on_error="warn")
    assert decoder.on_error is OnError.WARN
    assert parsed == ["warn"]
    with pytest.raises(ValueError, match="on_error must be one of"):
        create_decoder("cpu", size=8, on_error="ignore")


class ToyDecoder(Decoder):
    """A third-party backend: OpenCV decodes and stretches each image to ``size``."""

    backend = "toy"

    def _decode(self, buffers: list[np.ndarray]) -> DecodedBatch:
        images, kept = [], []
        for index, buffer in enumerate(buffers):
            image = cv2.imdecode(buffer, cv2.IMREAD_COLOR)
            if image is not None:
                height, width = self.size
                images.append(cv2.resize(image, (width, height))[..., ::-1].copy())
                kept.append(index)
        batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).to(self.device)
        return DecodedBatch(batch, torch.tensor(kept, dtype=torch.int64))


@pytest.fixture
def toy_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ToyDecoder`` registered in a copy of the registry, dropped after the test."""
    monkeypatch.setattr(factory, "_REGISTRY", dict(factory._REGISTRY))
    assert register_decoder(ToyDecoder) is ToyDecoder


def test_a_registered_decoder_is_made_by_create_decoder(toy_registered: None) -> None:
    assert factory.backend_names() == ("auto", "cpu", "nvjpeg", "dali", "toy")
    decoder = create_decoder("toy", size=(12, 16))
    assert isinstance(decoder, ToyDecoder) and decoder.device == torch.device("cpu")
    pixels = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    png = cv2.imencode(".png", pixels)[1]
    images = decoder([png.tobytes(), b"not an image"])  # its own policy for what fails
    expected = cv2.resize(pixels, (16, 12))[..., ::-1]
    assert images.shape == (1, 3, 12, 16)
    assert images[0].permute(1, 2, 0).numpy().tolist() == expected.tolist()


def test_a_registered_decoder_decodes_a_datasets_batches(
    toy_registered: None, tmp_path: Path
) -> None:
    """Through a dataset: ``ShardDataset(decode=False)`` batches in a DataLoader, decoded
    by the registered backend in :class:`DecodingLoader`, labels alongside."""
    for index in range(6):
        path = tmp_path / "src" / f"class{index % 2}" / f"{index}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(path), np.full((20, 20, 3), 40 * index, np.uint8))
    options = PreprocessOptions(sizes=(20,), storage="jpeg")
    preprocess(tmp_path / "src", tmp_path / "out", options, workers=1, show_progress=False)
    dataset = ShardDataset(tmp_path / "out", fields=("image", "label"), decode=False)
    loader = DataLoader(dataset, batch_size=4, collate_fn=passthrough_collate)
    batches = list(DecodingLoader(loader, create_decoder("toy", size=8)))
    assert [tuple(images.shape) for images, _ in batches] == [(4, 3, 8, 8), (2, 3, 8, 8)]
    labels = torch.cat([labels for _, labels in batches]).tolist()
    assert labels == [int(dataset[i][1]) for i in range(6)]
    means = [float(image.float().mean()) for images, _ in batches for image in images]
    stored = [float(cv2.imdecode(dataset[i][0].numpy(), 1).mean()) for i in range(6)]
    assert means == pytest.approx(stored, abs=1.0)


def test_bad_registrations_are_refused(
    toy_registered: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(TypeError, match="cls must be a Decoder subclass, got <class 'int'>"):
        register_decoder(int)  # type: ignore[arg-type]
    unnamed = type("Unnamed", (ToyDecoder,), {"backend": ""})
    with pytest.raises(ValueError, match=r"Unnamed.backend must name the backend .* got ''"):
        register_decoder(unnamed)
    auto = type("Auto", (ToyDecoder,), {"backend": "auto"})
    with pytest.raises(ValueError, match="other than 'auto'"):
        register_decoder(auto)
    other = type("OtherCpu", (ToyDecoder,), {"backend": "cpu"})
    with pytest.raises(ValueError, match="decoder backend 'cpu' is already CpuDecoder"):
        register_decoder(other)
    with pytest.raises(TypeError, match="default_device must be a device name or a function"):
        register_decoder(ToyDecoder, default_device=0)  # type: ignore[arg-type]
    assert register_decoder(ToyDecoder) is ToyDecoder  # the same class again: a no-op
    with pytest.raises(ValueError, match=r"backend must be one of .*'toy'\), got 'turbo'"):
        create_decoder("turbo", size=8)
