"""The dali backend: CPU-only DALI (``device_id=None``) in CI, mixed (nvJPEG) on a GPU."""

from __future__ import annotations

import atexit
import gc
import multiprocessing
from typing import Any

import numpy as np
import pytest
import torch

from fastdata.decode import DecodingLoader, create_decoder
from fastdata.decode import dali as dali_module
from fastdata.errors import DecodeError
from tests.decode.conftest import BAD, GOOD, exif_rotated_jpeg, rgb_jpeg

# DALI's libjpeg-turbo / nvJPEG decode and its antialiased resize against OpenCV's area
# resize: mean absolute difference within 3 levels of 255.
MEAN_TOLERANCE = 3.0

pytestmark = pytest.mark.dali


@pytest.mark.parametrize("random_crop", [False, True])
def test_cpu_only_dali_agrees_with_cpu_backend(random_crop: bool) -> None:
    batch = [rgb_jpeg(240, 320, seed=s) for s in range(3)]
    dali = create_decoder("dali", size=(48, 64), device="cpu", random_crop=random_crop, seed=5)
    cpu = create_decoder("cpu", size=(48, 64), random_crop=random_crop, seed=5)
    got, want = dali(batch), cpu(batch)
    assert got.shape == want.shape == (3, 3, 48, 64) and got.dtype == torch.uint8
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert (got.float() - want.float()).abs().mean() <= MEAN_TOLERANCE
    dali.close()


def test_variable_and_growing_batch_sizes(images: dict[str, bytes]) -> None:
    decoder = dali_module.DaliDecoder(32, device="cpu", max_batch_size=2)
    assert decoder([images["color"]]).shape == (1, 3, 32, 32)
    assert decoder([images["color"]] * 5).shape == (5, 3, 32, 32)
    assert decoder([images["large"]] * 2).shape == (2, 3, 32, 32)


def test_bad_images_per_on_error(images: dict[str, bytes]) -> None:
    batch = [images[name] for name in (*GOOD, *BAD)]
    decoded = create_decoder("dali", size=40, device="cpu", on_error="skip").decode(batch)
    assert decoded.kept.tolist() == list(range(len(GOOD)))
    cpu = create_decoder("cpu", size=40)([images[name] for name in GOOD])
    assert (decoded.images.float() - cpu.float()).abs().mean() <= MEAN_TOLERANCE
    with pytest.raises(DecodeError, match="batch item 1"):
        create_decoder("dali", size=40, device="cpu")([images["color"], images["truncated"]])
    with pytest.warns(RuntimeWarning, match="skipped a sample: "):
        warned = create_decoder("dali", size=40, device="cpu", on_error="warn")
        assert warned.decode([images["corrupt"]]).images.shape == (0, 3, 40, 40)


def test_grayscale(images: dict[str, bytes]) -> None:
    decoder = create_decoder("dali", size=24, device="cpu", grayscale=True)
    out = decoder([images["color"], images["gray"], images["png"]])
    assert out.shape == (3, 1, 24, 24)
    cpu = create_decoder("cpu", size=24, grayscale=True)([images["color"]])
    assert (out[:1].float() - cpu.float()).abs().mean() <= MEAN_TOLERANCE


def test_rejects_bad_device_and_threads() -> None:
    with pytest.raises(ValueError, match="device must be the CPU or a CUDA device"):
        create_decoder("dali", size=24, device="meta")
    with pytest.raises(ValueError, match="num_threads must be a positive int"):
        create_decoder("dali", size=24, device="cpu", num_threads=0)


@pytest.mark.parametrize("random_crop", [False, True])
def test_exif_rotated_jpegs_decode_in_dali_like_the_cpu_backend(
    monkeypatch: pytest.MonkeyPatch, random_crop: bool
) -> None:
    """EXIF orientation is applied and crop boxes are drawn on the displayed image, as in
    the cpu backend: the same pixels for every orientation, in DALI itself (no fallback)."""

    def no_fallback(*args: object, **kwargs: object) -> None:
        raise AssertionError("DALI failed and fell back to the CPU decoder")

    monkeypatch.setattr(dali_module, "decode_crop", no_fallback)
    batch = [exif_rotated_jpeg(120, 200, seed=o, orientation=o) for o in range(1, 9)]
    dali = create_decoder("dali", size=(40, 24), device="cpu", random_crop=random_crop, seed=3)
    cpu = create_decoder("cpu", size=(40, 24), random_crop=random_crop, seed=3)
    got, want = dali(batch), cpu(batch)
    assert got.shape == want.shape == (8, 3, 40, 24)
    for row in range(8):
        diff = (got[row].float() - want[row].float()).abs().mean()
        assert diff <= MEAN_TOLERANCE, f"orientation {row + 1}: mean abs diff {diff:.1f}"
    dali.close()
    # the look-ahead pipeline (DecodingLoader's path) plans the same boxes
    dali = create_decoder("dali", size=(40, 24), device="cpu", random_crop=random_crop, seed=3)
    cpu = create_decoder("cpu", size=(40, 24), random_crop=random_crop, seed=3)
    streamed = list(dali.decode_stream([batch[:4], batch[4:]]))
    ahead = torch.cat([decoded.images for decoded in streamed])
    want = torch.cat([cpu(batch[:4]), cpu(batch[4:])])
    assert (ahead.float() - want.float()).abs().mean() <= MEAN_TOLERANCE
    dali.close()


@pytest.mark.gpu
def test_mixed_dali_agrees_with_cpu_backend(images: dict[str, bytes]) -> None:
    batch = [rgb_jpeg(240, 320, seed=s) for s in range(3)] + [images[g] for g in GOOD]
    got = create_decoder("dali", size=64, device="cuda", random_crop=True, seed=2)(batch)
    want = create_decoder("cpu", size=64, random_crop=True, seed=2)(batch)
    assert got.device.type == "cuda" and got.shape == want.shape
    assert (got.cpu().float() - want.float()).abs().mean() <= MEAN_TOLERANCE


def test_batches_own_their_memory() -> None:
    """DALI reuses its output buffers: a returned batch must survive the next run."""
    decoder = create_decoder("dali", size=32, device="cpu")
    first = decoder([rgb_jpeg(64, 64, seed=1)] * 2)
    kept = first.clone()
    second = decoder([rgb_jpeg(64, 64, seed=2)] * 2)
    assert torch.equal(first, kept) and not torch.equal(first, second)


def test_pipeline_is_rebuilt_after_a_failure(
    monkeypatch: pytest.MonkeyPatch, images: dict[str, bytes]
) -> None:
    built: list[tuple[int, object]] = []  # (max batch size, pipeline)
    real_build = dali_module._build_pipeline

    def counting_build(*args: Any, **kwargs: Any) -> object:
        built.append((args[0], real_build(*args, **kwargs)))
        return built[-1][1]

    monkeypatch.setattr(dali_module, "_build_pipeline", counting_build)
    decoder = create_decoder("dali", size=24, device="cpu", on_error="skip")
    assert decoder.decode([images["color"]] * 2).kept.tolist() == [0, 1]
    assert [size for size, _ in built] == [256]
    # the batch fails (its pipeline dropped, once); each image is retried alone through a
    # one-sample pipeline, rebuilt after each lone failure: never the 256-sample one
    with pytest.warns(RuntimeWarning, match="a batch failed in DALI"):
        decoded = decoder.decode(
            [images["color"], images["truncated"], images["truncated"], images["color"]]
        )
    assert decoded.kept.tolist() == [0, 3]
    assert [size for size, _ in built[1:]] == [1, 1, 1]
    assert decoder._pipeline is None
    assert decoder.fallbacks["batch_retry"] == 1
    assert decoder.decode([images["color"]] * 2).kept.tolist() == [0, 1]
    assert [size for size, _ in built[4:]] == [256]
    assert decoder._pipeline is built[-1][1]


def test_environment_errors_raise(
    monkeypatch: pytest.MonkeyPatch, images: dict[str, bytes]
) -> None:
    def out_of_memory(*args: object) -> None:
        raise RuntimeError("[/opt/dali/dali/core/mm] CUDA allocation failed")

    decoder = create_decoder("dali", size=24, device="cpu", on_error="skip")
    monkeypatch.setattr(decoder, "_run_pipeline", out_of_memory)
    with pytest.raises(RuntimeError, match="CUDA allocation failed"):
        decoder.decode([images["color"]])


class _FakeTensor:
    def shape(self) -> list[int]:
        return [2, 4, 4, 3]


class _FakeOutput:
    def as_tensor(self) -> _FakeTensor:
        return _FakeTensor()


class _FakePipeline:
    def __init__(self) -> None:
        self.run_args: list[tuple[object, ...]] = []

    def feed_input(self, name: str, data: object) -> None:
        pass

    def run(self, *args: object) -> tuple[_FakeOutput]:
        self.run_args.append(args)
        return (_FakeOutput(),)


def test_gpu_pipeline_runs_and_copies_on_the_callers_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CPU-side check of the CUDA path: the outputs are asked for on the caller's current
    # stream (no host sync in run()) and the copy is queued on that same stream.
    consumer = object()
    copies: list[object] = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: consumer)

    class FakePlugin:
        @staticmethod
        def feed_ndarray(tensor: object, target: torch.Tensor, cuda_stream: object = None) -> None:
            copies.append(cuda_stream)

    monkeypatch.setattr(dali_module, "import_optional", lambda module, purpose: FakePlugin)
    decoder = dali_module.DaliDecoder(4, device="cpu")
    decoder.device = torch.device("meta")  # not the CPU: the GPU code path, without a GPU
    pipeline = _FakePipeline()
    box = dali_module.Box(0, 0, 4, 4)
    out = decoder._run_pipeline(pipeline, [(np.zeros(4, np.uint8), box)] * 2)
    assert out.shape == (2, 4, 4, 3)
    assert pipeline.run_args == [(consumer,)]
    assert copies == [consumer]


def _batches(images: dict[str, bytes]) -> list[list[bytes]]:
    good = [rgb_jpeg(60 + 8 * s, 80, seed=s) for s in range(4)]
    return [
        good[:3],
        [good[0], images["truncated"], good[1]],  # fails in DALI: queue dropped, decoded alone
        good[1:4],
        [images["png"], good[2]],  # not for DALI: drains the queue, decoded alone
        good[:3],
        good * 2,  # larger than the pipeline: drained, rebuilt larger
        good[:2],
    ]


def test_decode_stream_gives_what_decode_gives(images: dict[str, bytes]) -> None:
    batches = _batches(images)
    ahead = dali_module.DaliDecoder(24, device="cpu", on_error="skip", seed=3, max_batch_size=4)
    alone = dali_module.DaliDecoder(24, device="cpu", on_error="skip", seed=3, max_batch_size=4)
    with pytest.warns(RuntimeWarning):
        streamed = list(ahead.decode_stream(iter(batches)))
        one_by_one = [alone.decode(batch) for batch in batches]
    assert len(streamed) == len(batches)
    for got, want in zip(streamed, one_by_one, strict=True):
        assert got.kept.tolist() == want.kept.tolist()
        assert torch.equal(got.images, want.images)
        assert got.images.is_contiguous(memory_format=torch.channels_last)
    for count in (0, 1):  # empty and single-batch streams
        assert len(list(ahead.decode_stream(iter(batches[:count])))) == count


def test_decode_stream_feeds_the_next_batch_before_collecting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoder = dali_module.DaliDecoder(16, device="cpu", seed=0)
    log: list[str] = []
    real_feed, real_collect = decoder._feed, decoder._collect_ahead
    monkeypatch.setattr(
        decoder, "_feed", lambda pipe, items: (log.append("feed"), real_feed(pipe, items))[1]
    )
    monkeypatch.setattr(
        decoder, "_collect_ahead", lambda: (log.append("collect"), real_collect())[1]
    )
    batches = [[rgb_jpeg(40, 40, seed=s)] * 2 for s in range(4)]
    for decoded in decoder.decode_stream(iter(batches)):
        log.append(f"got {len(decoded.kept)}")
    assert log == ["feed", "feed", "collect", "got 2", "feed", "collect", "got 2",
                   "feed", "collect", "got 2", "collect", "got 2"]  # fmt: skip


def test_leaving_a_stream_early_then_streaming_again(images: dict[str, bytes]) -> None:
    decoder = dali_module.DaliDecoder(16, device="cpu", seed=0)
    batches = [[rgb_jpeg(40, 40, seed=s)] * 2 for s in range(5)]
    for _ in decoder.decode_stream(iter(batches)):
        break
    assert decoder._ahead is None  # its scheduled outputs were dropped with it
    assert [len(d.kept) for d in decoder.decode_stream(iter(batches))] == [2] * 5


def test_decoding_loader_streams_through_dali() -> None:
    decoder = create_decoder("dali", size=16, device="cpu", seed=1)
    batches = [([rgb_jpeg(40, 48, seed=s)] * 3, torch.arange(3) + 10 * s) for s in range(3)]
    out = list(DecodingLoader(batches, decoder))
    assert [labels.tolist() for _, labels in out] == [[0, 1, 2], [10, 11, 12], [20, 21, 22]]
    want = create_decoder("dali", size=16, device="cpu", seed=1)
    for (images, _), (encoded, _) in zip(out, batches, strict=True):
        assert torch.equal(images, want(encoded))


def _drop_and_exit(held: dict[str, Any], done: Any) -> None:
    """In a forked child: drop the last reference to the inherited decoder, collect it, and
    run the interpreter's exit handlers (DALI's shuts down every pipeline it knows of)."""
    held.clear()
    gc.collect()
    atexit._run_exitfuncs()
    done.set()


def test_pipelines_inherited_by_a_forked_child_are_not_destroyed_there() -> None:
    # DALI's destructor joins the pipeline's threads, which a forked child does not have:
    # freed in the child (a DataLoader worker forked while a decoder was held), it hangs.
    decoder = dali_module.DaliDecoder(16, device="cpu", seed=0, num_threads=2)
    batches = [[rgb_jpeg(40, 40, seed=s)] * 2 for s in range(3)]
    assert [len(d.kept) for d in decoder.decode_stream(iter(batches))] == [2] * 3
    assert decoder.decode(batches[0]).images.shape == (2, 3, 16, 16)
    assert decoder._pipeline is not None and decoder._ahead is not None
    held = {"decoder": decoder}
    del decoder
    context = multiprocessing.get_context("fork")
    done = context.Event()
    child = context.Process(target=_drop_and_exit, args=(held, done))
    child.start()
    child.join(timeout=60)  # a bound on a hang, not a timing margin: it ends at once
    if child.is_alive():
        child.kill()
        child.join()
    assert done.is_set() and child.exitcode == 0
    assert held["decoder"].decode(batches[1]).images.shape == (2, 3, 16, 16)  # here: intact
