"""The CUDA stream bookkeeping of DevicePrefetcher, checked on the CPU with fake streams.

Fake ``torch.cuda`` streams and events log what the prefetcher asks of them, so CI checks
the order of waits, records and host synchronizations that the `gpu` tests check for real.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import pytest
import torch

from fastdata.gpu import DevicePrefetcher
from fastdata.gpu import prefetch as prefetch_module
from fastdata.gpu.prefetch import MAX_STEPS_AHEAD

Log = list[tuple[object, ...]]


class FakeEvent:
    ids = itertools.count()

    def __init__(self, log: Log) -> None:
        self.log = log
        self.id = next(self.ids)
        self.done = False

    def record(self, stream: FakeStream) -> None:
        self.log.append(("record", self.id, stream.name))

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.log.append(("host waits", self.id))


class FakeStream:
    def __init__(self, log: Log, name: str) -> None:
        self.log = log
        self.name = name

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event: FakeEvent) -> None:
        self.log.append(("wait_event", self.name, event.id))

    def synchronize(self) -> None:
        self.log.append(("stream sync", self.name))


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Log, list[str]]]:
    log: Log = []
    current = ["consumer"]
    consumer = FakeStream(log, "consumer")

    @contextlib.contextmanager
    def stream(side: FakeStream) -> Iterator[None]:
        current.append(side.name)
        yield
        current.pop()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: FakeStream(log, "side"))
    monkeypatch.setattr(torch.cuda, "Event", lambda: FakeEvent(log))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: consumer)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    yield log, current


def _prefetcher(batches: list[torch.Tensor], current: list[str], log: Log) -> DevicePrefetcher:
    def transform(batch: torch.Tensor) -> torch.Tensor:
        log.append(("transform", int(batch[0]), current[-1]))
        return batch

    prefetcher = DevicePrefetcher(batches, "cuda", transform=transform, pin_memory=False)
    assert prefetcher.device == torch.device("cuda", 0)
    prefetcher.device = torch.device("cpu")  # the copies themselves stay on the host here
    return prefetcher


def _event_of(log: Log, batch: int) -> int:
    """The id of the event recorded on the side stream right after ``batch``'s transform."""
    at = log.index(("transform", batch, "side"))
    entry = log[at + 1]
    assert entry[0] == "record"
    assert entry[2] == "side"
    return int(entry[1])  # type: ignore[call-overload]


def test_copy_waits_for_consumer_and_consumer_waits_for_its_batch_only(
    fake_cuda: tuple[Log, list[str]],
) -> None:
    log, current = fake_cuda
    batches = [torch.tensor([i]) for i in range(3)]
    iterator = iter(_prefetcher(batches, current, log))
    # Batch 0 is in flight: side stream waited for the consumer, then copied and transformed.
    assert log[0] == ("wait_stream", "side", "consumer")
    assert log[1] == ("transform", 0, "side")
    assert next(iterator).item() == 0
    waits = [entry for entry in log if entry[0] == "wait_event"]
    # The consumer waited for batch 0's event, issued before batch 1's copy started.
    assert waits == [("wait_event", "consumer", _event_of(log, 0))]
    assert log.index(waits[0]) < log.index(("transform", 1, "side"))
    assert [b.item() for b in iterator] == [1, 2]
    waits = [entry[2] for entry in log if entry[0] == "wait_event"]
    assert waits == [_event_of(log, i) for i in range(3)]


def test_host_waits_once_it_is_max_steps_ahead(fake_cuda: tuple[Log, list[str]]) -> None:
    log, current = fake_cuda
    steps = MAX_STEPS_AHEAD + 3
    for _ in _prefetcher([torch.tensor([i]) for i in range(steps)], current, log):
        pass
    marks = [entry[1] for entry in log if entry[0] == "record" and entry[2] == "consumer"]
    host_waits = [entry[1] for entry in log if entry[0] == "host waits"]
    assert len(marks) == steps
    assert host_waits == marks[: steps - MAX_STEPS_AHEAD]


def test_closing_a_pass_with_a_copy_in_flight_syncs_the_side_stream(
    fake_cuda: tuple[Log, list[str]],
) -> None:
    log, current = fake_cuda
    prefetcher = _prefetcher([torch.tensor([i]) for i in range(4)], current, log)
    for batch in prefetcher:
        if batch.item() == 1:
            break
    del batch
    assert log[-1] == ("stream sync", "side")


class _CudaLooking:
    """Stands in for a CUDA tensor where the prefetcher records tensors on the consumer."""

    device = torch.device("cuda", 0)

    def __init__(self, tensor: torch.Tensor, recorded: list[tuple[int, str]]) -> None:
        self.tensor = tensor
        self.recorded = recorded

    def record_stream(self, stream: FakeStream) -> None:
        self.recorded.append((int(self.tensor[0]), stream.name))


def test_every_handed_out_tensor_is_recorded_on_the_consumer_stream(
    fake_cuda: tuple[Log, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    log, current = fake_cuda
    recorded: list[tuple[int, str]] = []
    monkeypatch.setattr(
        prefetch_module, "iter_tensors", lambda batch: iter([_CudaLooking(batch, recorded)])
    )
    prefetcher = _prefetcher([torch.tensor([i]) for i in range(3)], current, log)
    for batch in prefetcher:
        # recorded before it is handed out, after the consumer's wait for its event
        assert recorded[-1] == (int(batch[0]), "consumer")
    assert recorded == [(0, "consumer"), (1, "consumer"), (2, "consumer")]


@pytest.mark.parametrize(
    ("local_rank", "count", "current", "expected"),
    [
        (None, 4, 1, 1),  # not under torchrun: the current device
        ("2", 4, 0, 2),  # built before torch.cuda.set_device(local_rank): the rank's GPU
        ("2", 4, 2, 2),  # after set_device
        ("3", 1, 0, 0),  # one GPU visible per rank (CUDA_VISIBLE_DEVICES)
        ("5", 4, 0, 0),  # a local rank beyond the visible GPUs: the current device
    ],
)
def test_bare_cuda_under_torchrun_is_the_local_ranks_gpu(
    monkeypatch: pytest.MonkeyPatch,
    local_rank: str | None,
    count: int,
    current: int,
    expected: int,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert prefetch_module.resolve_device("cuda") == torch.device("cuda", expected)
    assert prefetch_module.resolve_device("cuda:3") == torch.device("cuda", 3)  # as given
    assert prefetch_module.resolve_device(1) == torch.device("cuda", 1)


def test_bare_cuda_set_to_another_gpu_than_the_local_rank_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ValueError, match="LOCAL_RANK=2 but the current CUDA device is 1"):
        prefetch_module.resolve_device("cuda")
