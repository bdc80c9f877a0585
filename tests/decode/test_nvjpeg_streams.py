"""The nvjpeg decoder's CUDA stream and device bookkeeping, checked on the CPU with fake
streams and events (as ``tests/gpu/test_prefetch_streams.py`` does for the prefetcher), and
its error handling with a fake ``decode_jpeg``."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from fastdata.decode import nvjpeg as nvjpeg_module
from fastdata.decode.nvjpeg import NvJpegDecoder
from fastdata.errors import DecodeError
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


class _Source:
    """Batches of encoded images that record how far they have been read."""

    def __init__(self, batches: list[list[bytes]]) -> None:
        self.batches = batches
        self.read = 0

    def __iter__(self) -> Iterator[list[bytes]]:
        for batch in self.batches:
            self.read += 1
            yield batch


def _stream_batches() -> list[list[bytes]]:
    return [[rgb_jpeg(60 + 8 * b, 80, seed=10 * b + s) for s in range(3)] for b in range(4)]


def test_decode_stream_decodes_the_next_batch_on_a_thread_while_this_one_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[str] = []

    class ThreadRecording(FakeDecodeJpeg):
        def __call__(self, data: Any, device: torch.device) -> Any:
            threads.append(threading.current_thread().name)
            return super().__call__(data, device)

    monkeypatch.setattr(nvjpeg_module, "load_decode_jpeg", ThreadRecording)
    batches = _stream_batches()
    reference = NvJpegDecoder(32, device="cpu", random_crop=True, seed=5)
    want = [reference.decode(batch) for batch in batches]
    threads.clear()
    source = _Source(batches)
    stream = NvJpegDecoder(32, device="cpu", random_crop=True, seed=5).decode_stream(source)
    for i, got in enumerate(stream):
        # batch i + 1 was read (its crops drawn) and handed to the thread before batch i
        # came out
        assert source.read == min(i + 2, len(batches))
        assert torch.equal(got.images, want[i].images)
        assert torch.equal(got.kept, want[i].kept)
    assert len(threads) == len(batches)
    assert all(name.startswith("fastdata-nvjpeg") for name in threads)


def test_decode_stream_raises_in_order_and_can_be_left_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nvjpeg_module, "load_decode_jpeg", FakeDecodeJpeg)
    batches = _stream_batches()
    bad = [*batches[:2], [b"not an image"], batches[3]]
    stream = NvJpegDecoder(32, device="cpu").decode_stream(bad)
    assert next(stream).images.shape == (3, 3, 32, 32)
    assert next(stream).images.shape == (3, 3, 32, 32)
    with pytest.raises(DecodeError, match="batch item 0"):
        next(stream)
    early = NvJpegDecoder(32, device="cpu").decode_stream(_Source(batches))
    next(early)
    early.close()  # a batch in flight: waited for, not handed out; no error


def test_decode_stream_hands_each_batch_out_after_its_own_event(
    fake_cuda: tuple[Log, list[str], list[object]],
) -> None:
    log, _, _ = fake_cuda
    decoder = _decoder()
    for decoded in decoder.decode_stream(_stream_batches()):
        assert decoded.images.shape == (3, 3, 32, 32)
    done = [e[1] for e in log if e[0] == "record" and e[2] == "side"]
    # the consumer's stream waits for each batch's own event, not the latest one
    assert [e[2] for e in log if e[0] == "wait_event"] == done
    assert log.count(("record_stream", "consumer")) == 4
    assert ("decode_jpeg", "side") in log and ("decode_jpeg", "consumer") not in log
