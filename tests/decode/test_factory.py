from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Any

import pytest
import torch

from fastdata.decode import Decoder, create_decoder, dali, factory, resolve_backend
from fastdata.decode.nvjpeg import load_decode_jpeg


def test_auto_picks_nvjpeg_only_with_cuda_and_torchvision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_backend("auto") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(factory, "_has_torchvision", lambda: False)
    assert resolve_backend("auto") == "cpu"
    monkeypatch.setattr(factory, "_has_torchvision", lambda: True)
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
