from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fastdata.errors import ShardFormatError
from fastdata.gpu import MaskToLong, Normalize, _normalize_tables
from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest

MEAN = [120.0, 110.0, 100.0]
STD = [60.0, 55.0, 50.0]


def _reference(bchw: torch.Tensor, mean: list[float], std: list[float]) -> np.ndarray:
    array = bchw.numpy().astype(np.float64)
    return (array - np.array(mean).reshape(1, -1, 1, 1)) / np.array(std).reshape(1, -1, 1, 1)


@pytest.fixture
def bchw() -> torch.Tensor:
    return torch.randint(
        0, 256, (2, 3, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )


@pytest.mark.parametrize("layout", ["auto", "CHW", "HWC"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_matches_numpy_reference_in_every_layout(
    bchw: torch.Tensor, layout: str, channels_last: bool
) -> None:
    normalize = Normalize(MEAN, STD, layout=layout, channels_last=channels_last)
    given = bchw.permute(0, 2, 3, 1).contiguous() if layout == "HWC" else bchw
    out = normalize(given)
    assert out.shape == (2, 3, 5, 7)
    assert out.dtype == torch.float32
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    assert out.is_contiguous(memory_format=memory_format)
    np.testing.assert_allclose(out.numpy(), _reference(bchw, MEAN, STD), rtol=1e-6, atol=1e-6)


def test_auto_layout_reads_channels_last_input(bchw: torch.Tensor) -> None:
    bhwc = bchw.permute(0, 2, 3, 1).contiguous()
    out = Normalize(MEAN, STD)(bhwc)
    np.testing.assert_allclose(out.numpy(), _reference(bchw, MEAN, STD), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_outputs_are_close(bchw: torch.Tensor, dtype: torch.dtype) -> None:
    out = Normalize(MEAN, STD, dtype=dtype)(bchw)
    assert out.dtype == dtype
    # Computed in float32, rounded once: within half a unit in the last place of the output.
    half_ulp = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    np.testing.assert_allclose(
        out.float().numpy(), _reference(bchw, MEAN, STD), rtol=half_ulp * 1.01, atol=1e-5
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_cpu_chunks_match_the_fused_expression_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, channels_last: bool, layout: str
) -> None:
    # The CPU path works in chunks of images; an odd batch in 2-image chunks must give
    # exactly the one fused ``bias + images * scale`` in float32, rounded once to ``dtype``.
    monkeypatch.setattr("fastdata.gpu.normalize._CPU_CHUNK_ELEMENTS", 2 * 3 * 5 * 7)
    bchw = torch.randint(
        0, 256, (5, 3, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    normalize = Normalize(MEAN, STD, dtype=dtype, channels_last=channels_last, layout=layout)
    out = normalize(bchw.permute(0, 2, 3, 1).contiguous() if layout == "HWC" else bchw)
    scale = torch.tensor(STD).reciprocal().view(1, 3, 1, 1)
    bias = -torch.tensor(MEAN).view(1, 3, 1, 1) * scale
    expected = torch.addcmul(bias, bchw.float(), scale).to(dtype)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    assert out.dtype == dtype and out.is_contiguous(memory_format=memory_format)
    assert torch.equal(out, expected)


def test_cpu_outputs_reuse_memory_nothing_refers_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """A freed output's memory is written again (no fresh batch whose pages all fault);
    an output still held, through itself, a view or a NumPy array, is never written."""
    allocations = []
    real_empty = torch.empty

    def counting_empty(*args: object, **kwargs: object) -> torch.Tensor:
        tensor = real_empty(*args, **kwargs)  # type: ignore[call-overload]
        if tensor.device.type != "meta" and tensor.numel() > 0:
            allocations.append(tensor.numel())
        return tensor

    monkeypatch.setattr(torch, "empty", counting_empty)
    normalize = Normalize(MEAN, STD, layout="CHW")
    batches = [torch.full((4, 3, 8, 8), value, dtype=torch.uint8) for value in (10, 20, 30, 40)]
    first = normalize(batches[0])
    view = first[1:2]
    second = normalize(batches[1])
    as_numpy = second.numpy()
    del first, second
    for batch in batches[2:]:
        normalize(batch)  # two calls whose outputs are dropped at once
    assert np.allclose(view.numpy(), _reference(batches[0], MEAN, STD)[1:2])
    assert np.allclose(as_numpy, _reference(batches[1], MEAN, STD))
    assert len(allocations) == 3  # the first two outputs are held; the last two share one
    del view, as_numpy
    allocations.clear()
    for batch in batches:
        out = normalize(batch)
        assert np.allclose(out.numpy(), _reference(batch, MEAN, STD))
    assert allocations == []
    # sent to another process, whose readers no count here sees: never reused (the two
    # kept outputs serve the first two calls, the next two need fresh memory)
    del out
    for _ in range(4):
        normalize(batches[0]).share_memory_()
    assert len(allocations) == 2
    channels_last = Normalize(MEAN, STD, layout="CHW", channels_last=True)
    for batch in batches[:2]:
        out = channels_last(batch)
        assert out.is_contiguous(memory_format=torch.channels_last)
    assert len(pickle.loads(pickle.dumps(normalize))._cpu_outputs.kept) == 0


def _normalized_batch(items: list[torch.Tensor]) -> torch.Tensor:
    return _WORKER_NORMALIZE(torch.stack(items))


_WORKER_NORMALIZE = Normalize(MEAN, STD, layout="CHW")


def test_batches_normalized_in_dataloader_workers_stay_intact() -> None:
    """Outputs a worker sends to the training process (shared memory) are never written
    again, however many batches the training process holds."""
    items = [torch.full((3, 4, 4), index, dtype=torch.uint8) for index in range(24)]
    loader = torch.utils.data.DataLoader(
        items, batch_size=2, num_workers=1, collate_fn=_normalized_batch, prefetch_factor=4
    )
    held = list(loader)
    for start, batch in zip(range(0, 24, 2), held, strict=True):
        assert np.allclose(
            batch.numpy(), _reference(torch.stack(items[start : start + 2]), MEAN, STD)
        )


def test_value_range_one_takes_torchvision_constants(bchw: torch.Tensor) -> None:
    unit = Normalize([m / 255 for m in MEAN], [s / 255 for s in STD], value_range=1.0)
    torch.testing.assert_close(unit(bchw), Normalize(MEAN, STD)(bchw))
    torch.testing.assert_close(unit.mean, torch.tensor(MEAN))


def test_grayscale_single_channel() -> None:
    images = torch.arange(12, dtype=torch.uint8).view(1, 1, 3, 4)
    out = Normalize([6.0], [2.0])(images)
    torch.testing.assert_close(out, (images.float() - 6) / 2)


def test_buffers_move_and_save_with_the_module() -> None:
    normalize = Normalize(MEAN, STD)
    state = normalize.state_dict()
    assert set(state) == {"mean", "std"}
    restored = Normalize([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    restored.load_state_dict(state)
    torch.testing.assert_close(restored.std, torch.tensor(STD))
    moved = normalize.to("meta")
    assert moved.mean.device.type == "meta"


def test_statistics_changed_after_a_call_take_effect(bchw: torch.Tensor) -> None:
    # the constants of the statistics are kept between calls: every way of changing the
    # buffers must still reach the output
    normalize = Normalize(MEAN, STD)
    normalize(bchw)
    normalize.load_state_dict({"mean": torch.zeros(3), "std": torch.ones(3)})
    torch.testing.assert_close(normalize(bchw), bchw.float())
    normalize.std.mul_(2)  # in place
    torch.testing.assert_close(normalize(bchw), bchw.float() / 2)
    normalize.mean = torch.full((3,), 4.0)  # a new buffer
    torch.testing.assert_close(normalize(bchw), (bchw.float() - 4) / 2)
    copied = pickle.loads(pickle.dumps(normalize))
    copied.mean.fill_(0)
    torch.testing.assert_close(copied(bchw), bchw.float() / 2)
    torch.testing.assert_close(normalize(bchw), (bchw.float() - 4) / 2)


def test_a_module_made_under_inference_mode_normalizes_and_follows_its_buffers(
    bchw: torch.Tensor,
) -> None:
    # inference tensors keep no version counter: nothing can tell that they changed
    with torch.inference_mode():
        normalize = Normalize([0.0] * 3, [1.0] * 3)
        torch.testing.assert_close(normalize(bchw), bchw.float())
        normalize.std.fill_(2.0)
        torch.testing.assert_close(normalize(bchw), bchw.float() / 2)
    torch.testing.assert_close(normalize(bchw), bchw.float() / 2)


def test_constants_are_not_kept_from_a_cuda_graph_capture(
    bchw: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # During a capture kernels are recorded, not run: constants made then hold nothing
    # until the graph replays, and a graph must read the buffers as they are at each replay.
    normalize = Normalize(MEAN, STD)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    first, _ = normalize._kept_scale_and_bias()
    second, _ = normalize._kept_scale_and_bias()
    assert first is not second  # made again for each captured call
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    kept, _ = normalize._kept_scale_and_bias()
    assert normalize._kept_scale_and_bias()[0] is kept  # kept outside a capture


def test_module_cast_keeps_output_dtype_and_wrong_device_is_explained(bchw: torch.Tensor) -> None:
    normalize = Normalize(MEAN, STD).double()
    assert normalize.mean.dtype == torch.float64
    assert normalize(bchw).dtype == torch.float32
    with pytest.raises(ValueError, match=r"images are on meta but mean/std on cpu.*\.to\('meta'\)"):
        normalize(bchw.to("meta"))


def test_autocast_keeps_the_requested_dtype(bchw: torch.Tensor) -> None:
    normalize = Normalize(MEAN, STD, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = normalize(bchw)
    assert out.dtype == torch.float32
    np.testing.assert_allclose(out.numpy(), _reference(bchw, MEAN, STD), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_torch_compile_matches_eager(bchw: torch.Tensor) -> None:
    normalize = Normalize(MEAN, STD, channels_last=True)
    compiled = torch.compile(normalize, backend="inductor", fullgraph=True)
    out = compiled(bchw.permute(0, 2, 3, 1).contiguous())
    torch.testing.assert_close(out, normalize(bchw))


def test_torch_compile_eager_backend_traces_without_graph_breaks(bchw: torch.Tensor) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(Normalize(MEAN, STD), backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(bchw), Normalize(MEAN, STD)(bchw))


def _write_manifest(root: Path, stats: dict[str, dict[str, object]]) -> Path:
    fields = [FieldSpec("image", "array", "uint8", (4, 4, 3), "HWC")]
    with ShardWriter(root / "shard-00000.h5", fields) as writer:
        writer.append({"image": np.zeros((4, 4, 3), np.uint8)})
        info = writer.close()
    save_manifest(root, Manifest(fields=fields, shards=[info], stats=stats))
    return root


def test_from_manifest_reads_pixel_statistics(tmp_path: Path, bchw: torch.Tensor) -> None:
    root = _write_manifest(tmp_path, {"image": {"mean": MEAN, "std": STD, "count": 1}})
    normalize = Normalize.from_manifest(root, dtype=torch.float16, channels_last=True)
    assert normalize.dtype == torch.float16
    assert normalize.channels_last
    torch.testing.assert_close(normalize(bchw), Normalize(MEAN, STD, dtype=torch.float16)(bchw))
    by_file = Normalize.from_manifest(root / "index.json", field="image")
    torch.testing.assert_close(by_file.mean, torch.tensor(MEAN))


def test_from_manifest_errors(tmp_path: Path) -> None:
    root = _write_manifest(tmp_path, {"image": {"count": 1}})
    with pytest.raises(ValueError, match=r"field='image' has no mean/std statistics.*\['image'\]"):
        Normalize.from_manifest(root)
    with pytest.raises(ValueError, match="field='mask' has no mean/std"):
        Normalize.from_manifest(root, field="mask")
    with pytest.raises(ShardFormatError, match="no shard manifest found"):
        Normalize.from_manifest(tmp_path / "missing")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"mean": "abc", "std": STD}, TypeError, "mean must be a sequence of floats"),
        ({"mean": MEAN, "std": 3.0}, TypeError, "std must be a sequence of floats"),
        ({"mean": [], "std": []}, ValueError, "mean must be a non-empty sequence"),
        ({"mean": [float("nan")] * 3, "std": STD}, ValueError, "finite floats"),
        ({"mean": MEAN, "std": [1.0, 2.0]}, ValueError, "got 3 means and 2 stds"),
        ({"mean": MEAN, "std": [1.0, 0.0, 2.0]}, ValueError, r"std must be > 0.*0\.0"),
        ({"mean": MEAN, "std": STD, "value_range": 0}, ValueError, "value_range must be > 0"),
        ({"mean": MEAN, "std": STD, "value_range": "1"}, TypeError, "value_range must be"),
        ({"mean": MEAN, "std": STD, "dtype": torch.int32}, TypeError, "dtype must be one of"),
        ({"mean": MEAN, "std": STD, "layout": "NCHW"}, ValueError, "layout must be one of"),
    ],
)
def test_constructor_validation(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        Normalize(**kwargs)  # type: ignore[arg-type]


def test_forward_validation(bchw: torch.Tensor) -> None:
    normalize = Normalize(MEAN, STD)
    with pytest.raises(TypeError, match=r"images must be a uint8 tensor, got torch.float32"):
        normalize(bchw.float())
    with pytest.raises(TypeError, match="images must be a uint8 tensor, got ndarray"):
        normalize(bchw.numpy())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"must be 4-D .* got shape \(3, 5, 7\)"):
        normalize(bchw[0])
    with pytest.raises(ValueError, match=r"images have 4 channels in layout CHW"):
        Normalize(MEAN, STD, layout="CHW")(torch.zeros(1, 4, 2, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"cannot tell the channel dim .*\(1, 3, 5, 3\)"):
        normalize(torch.zeros(1, 3, 5, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"cannot tell the channel dim .*\(1, 4, 5, 4\)"):
        normalize(torch.zeros(1, 4, 5, 4, dtype=torch.uint8))


def test_mask_to_long_squeezes_and_remaps() -> None:
    masks = torch.tensor([[[0, 1], [255, 2]]], dtype=torch.uint8)
    out = MaskToLong()(masks.unsqueeze(1))
    assert out.dtype == torch.int64
    assert out.tolist() == [[[0, 1], [255, 2]]]
    assert MaskToLong()(masks.unsqueeze(-1)).shape == (1, 2, 2)
    kept = MaskToLong(squeeze_channel=False)(masks.unsqueeze(1))
    assert kept.shape == (1, 1, 2, 2)
    remapped = MaskToLong(ignore_value=255, ignore_index=-100)(masks)
    assert remapped.tolist() == [[[0, 1], [-100, 2]]]


def test_mask_to_long_validation() -> None:
    with pytest.raises(ValueError, match="ignore_value and ignore_index go together"):
        MaskToLong(ignore_value=255)
    with pytest.raises(ValueError, match="ignore_value must be a uint8 value 0-255, got 300"):
        MaskToLong(ignore_value=300, ignore_index=-1)
    with pytest.raises(TypeError, match=r"masks must be a uint8 tensor, got torch\.int64"):
        MaskToLong()(torch.zeros(1, 2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="no singleton channel dim"):
        MaskToLong()(torch.zeros(1, 2, 2, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"masks must be \(B, H, W\)"):
        MaskToLong()(torch.zeros(2, 2, dtype=torch.uint8))


def test_repr_reads_no_buffer_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # printing a model must not sync the host: `.tolist()` of a CUDA buffer would
    normalize = Normalize([123.675, 116.28, 103.53], [58.395, 57.12, 57.375])

    def no_read_back(self: torch.Tensor) -> list[float]:
        raise AssertionError("a buffer was read back")

    monkeypatch.setattr(torch.Tensor, "tolist", no_read_back)
    assert "mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]" in repr(normalize)


def _every_level(channels: int) -> torch.Tensor:
    """``(3, C, 16, 16)`` uint8: every level 0-255 in every channel, shuffled per image."""
    generator = torch.Generator().manual_seed(2)
    planes = [torch.randperm(256, generator=generator) for _ in range(3 * channels)]
    return torch.stack(planes).to(torch.uint8).view(3, channels, 16, 16)


@pytest.mark.parametrize("lookups", ["compiled", "opencv"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("channels", [1, 3, 4])
def test_cpu_tables_give_the_fused_expression_for_every_level(  # noqa: PLR0917
    monkeypatch: pytest.MonkeyPatch,
    dtype: torch.dtype,
    channels_last: bool,
    interleaved: bool,
    channels: int,
    lookups: str,
) -> None:
    # planar or interleaved uint8 in, contiguous or channels_last out: one table lookup per
    # value (the chunked arithmetic is not run), the bytes of ``bias + x * scale``, by the
    # compiled module and by OpenCV (an install without a C compiler)
    def not_expected(*args: object) -> None:
        raise AssertionError("the chunked arithmetic ran instead of the tables")

    monkeypatch.setattr("fastdata.gpu.normalize._normalize_on_cpu", not_expected)
    compiled = _normalize_tables.compiled_planes
    calls = []
    if lookups == "opencv":
        monkeypatch.setattr(_normalize_tables, "compiled_planes", None)
    elif compiled is not None:  # counted: planar output is written by the compiled module

        def counted(*args: Any) -> None:
            calls.append(args)
            compiled(*args)

        monkeypatch.setattr(_normalize_tables, "compiled_planes", counted)
    bchw = _every_level(channels)
    mean, std = {1: (MEAN[:1], STD[:1]), 3: (MEAN, STD), 4: ([1.5, *MEAN], [0.7, *STD])}[channels]
    given = bchw.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2) if interleaved else bchw
    out = Normalize(mean, std, dtype=dtype, channels_last=channels_last, layout="CHW")(given)
    scale = torch.tensor(std).reciprocal().view(1, -1, 1, 1)
    bias = -torch.tensor(mean).view(1, -1, 1, 1) * scale
    expected = torch.addcmul(bias, bchw.float(), scale).to(dtype)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    assert out.dtype == dtype and out.is_contiguous(memory_format=memory_format)
    assert torch.equal(out, expected)
    if lookups == "compiled" and compiled is not None:
        # one channel: channels_last memory is planar too
        assert len(calls) == (0 if channels_last and channels > 1 else len(bchw))


def test_cpu_memory_the_tables_skip_is_normalized_by_arithmetic() -> None:
    # a strided view (every other column) is neither planar nor interleaved per image
    bchw = _every_level(3)[..., ::2]
    out = Normalize(MEAN, STD, layout="CHW")(bchw)
    scale = torch.tensor(STD).reciprocal().view(1, 3, 1, 1)
    bias = -torch.tensor(MEAN).view(1, 3, 1, 1) * scale
    assert torch.equal(out, torch.addcmul(bias, bchw.float(), scale))
    normalize = Normalize(MEAN, STD, layout="CHW")
    first = normalize(bchw).clone()
    normalize.mean.add_(1.0)  # new statistics: new tables
    assert not torch.equal(normalize(bchw.contiguous()), first)
    torch.testing.assert_close(normalize(bchw.contiguous()), first - scale.expand_as(first))


def test_cpu_output_memory_held_through_its_storage_object_is_never_written() -> None:
    """A caller who keeps only ``out.untyped_storage()`` still holds the memory."""
    normalize = Normalize(MEAN, STD, layout="CHW")
    batches = [torch.full((4, 3, 8, 8), value, dtype=torch.uint8) for value in (10, 20, 30)]
    storage = normalize(batches[0]).untyped_storage()
    expected = bytes(storage)
    for batch in batches[1:] * 2:
        normalize(batch)  # outputs dropped at once
    assert bytes(storage) == expected
