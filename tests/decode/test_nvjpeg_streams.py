"""The nvjpeg decoder's CUDA stream and device bookkeeping, checked on the CPU with fake
streams and events (as ``tests/gpu/test_prefetch_streams.py`` does for the prefetcher), and
its error handling with a fake ``decode_jpeg``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from fastdata.decode import nvjpeg as nvjpeg_module
from fastdata.decode.nvjpeg import NvJpegDecoder
from tests.decode.conftest import rgb_jpeg
from tests.decode.test_nvjpeg import FakeDecodeJpeg
from tests.gpu.test_prefetch_streams import FakeEvent, FakeStream, Log


class LoggingDecodeJpeg(FakeDecodeJpeg):
    def __init__(self, grayscale: bool, log: Log, current: list[str]) -> None:
        super().__init__(grayscale)
        self.log = log
        self.current = current

    def __call__(self, data: Any, device: torch.device) -> Any:
        self.log.append(("decode_jpeg", self.current[-1]))
        return super().__call__(data, device)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Log, list[str], list[object]]]:
    log: Log = []
    current = ["consumer"]
    stream_devices: list[object] = []
    consumer = FakeStream(log, "consumer")

    @contextlib.contextmanager
    def stream(side: FakeStream) -> Iterator[None]:
        current.append(side.name)
        yield
        current.pop()

    def make_stream(device: object, priority: int = 0) -> FakeStream:
        stream_devices.append((device, priority))
        return FakeStream(log, "side")

    def record_stream(self: torch.Tensor, on: FakeStream) -> None:
        log.append(("record_stream", on.name))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "Stream", make_stream)
    monkeypatch.setattr(torch.cuda, "Event", lambda: FakeEvent(log))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: consumer)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.Tensor, "record_stream", record_stream)
    monkeypatch.setattr(
        nvjpeg_module,
        "load_decode_jpeg",
        lambda grayscale: LoggingDecodeJpeg(grayscale, log, current),
    )
    yield log, current, stream_devices


def _decoder(**options: Any) -> NvJpegDecoder:
    decoder = NvJpegDecoder(32, device="cuda", **options)
    decoder.device = torch.device("cpu")  # the tensors themselves stay on the host here
    return decoder


def test_decoding_never_waits_for_the_callers_stream(
    fake_cuda: tuple[Log, list[str], list[object]],
) -> None:
    log, _, _ = fake_cuda
    decoder = _decoder()
    batch = [rgb_jpeg(64, 80, seed=s) for s in range(2)]
    for _ in range(3):
        assert decoder(batch).shape == (2, 3, 32, 32)
    # Neither the side stream waiting for the consumer nor a host sync of the side stream:
    # both would make the host wait for all queued training work.
    assert not [e for e in log if e[0] == "wait_stream"]
    assert ("stream sync", "side") not in log
    decodes = [i for i, e in enumerate(log) if e == ("decode_jpeg", "side")]
    done = [e[1] for e in log if e[0] == "record" and e[2] == "side"]
    assert len(decodes) == len(done) == 3
    # Before decode k the host waits for the event recorded after batch k - 1 (our own
    # work only); the first decode waits for nothing.
    host_waits = [(i, e[1]) for i, e in enumerate(log) if e[0] == "host waits"]
    assert [event for _, event in host_waits] == done[:2]
    for (at, _), decode_at in zip(host_waits, decodes[1:], strict=True):
        assert decodes[0] < at < decode_at
    # The consumer waits for each batch's event and the output is recorded on its stream.
    assert [e[2] for e in log if e[0] == "wait_event"] == done
    assert log.count(("record_stream", "consumer")) == 3


def test_bare_cuda_resolves_to_the_current_device_index(
    fake_cuda: tuple[Log, list[str], list[object]],
) -> None:
    _, _, stream_devices = fake_cuda
    decoder = NvJpegDecoder(32, device="cuda")
    assert decoder.device == torch.device("cuda", 3)
    # a high-priority stream: apart from the pool torchvision's private stream comes from
    assert stream_devices == [(torch.device("cuda", 3), -1)]
    assert NvJpegDecoder(32, device=1).device == torch.device("cuda", 1)
