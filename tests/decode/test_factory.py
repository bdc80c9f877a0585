from __future__ import annotations

import importlib.util
import logging
import subprocess
import sys
from typing import Any

import pytest
import torch

from fastdata.decode import Decoder, create_decoder, dali, factory, nvjpeg
from fastdata.decode.factory import resolve_backend
from fastdata.decode.nvjpeg import load_decode_jpeg
from fastdata.errors import FastDataError, OnError


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
    assert factory.BACKENDS == ("auto", "cpu", "nvjpeg", "dali")
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
