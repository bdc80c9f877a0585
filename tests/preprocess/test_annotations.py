"""COCO annotations as a dataset, the box rules every format shares, format detection and the
job's policy for bad annotations. References are worked out by hand from the files the
tests write."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fastdata.errors import DecodeError, PreprocessError
from fastdata.preprocess import AnnotationError, CocoDetection, open_annotations
from fastdata.preprocess._detection import detect_annotation_format, source_skipped
from fastdata.preprocess._detection._common import box_problems


def write_image(path: Path, width: int, height: int, orientation: int = 1) -> Path:
    """A solid JPEG ``width x height`` as stored, with an EXIF orientation tag."""
    path.parent.mkdir(parents=True, exist_ok=True)
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    Image.new("RGB", (width, height), (200, 30, 30)).save(path, exif=exif.tobytes())
    return path


def coco_file(path: Path, images: list[dict[str, Any]], annotations: list[dict[str, Any]]) -> Path:
    categories = [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}]
    data = {"images": images, "annotations": annotations, "categories": categories}
    path.write_text(json.dumps(data))
    return path


def annotation(
    ident: int, image_id: int, bbox: list[float], category: int = 3, **more: Any
) -> dict[str, Any]:
    return {"id": ident, "image_id": image_id, "bbox": bbox, "category_id": category, **more}


@pytest.fixture
def coco_set(tmp_path: Path) -> tuple[Path, Path]:
    """Three images (ids 5, 2, 9: listed out of order; 9 has no boxes) and four boxes."""
    images = tmp_path / "images"
    write_image(images / "a.jpg", 40, 30)
    write_image(images / "sub" / "b.jpg", 20, 10)
    write_image(images / "c.jpg", 8, 8)
    entries = [
        {"id": 5, "file_name": "a.jpg", "width": 40, "height": 30},
        {"id": 2, "file_name": "sub/b.jpg", "width": 20, "height": 10},
        {"id": 9, "file_name": "c.jpg", "width": 8, "height": 8},
    ]
    boxes = [
        annotation(1, 5, [1, 2, 10, 20], 7),
        annotation(2, 5, [30.5, 0, 10, 30], 3, iscrowd=1),  # x2 40.5: within 1 px, clipped
        annotation(3, 2, [0, 0, 20, 10], 3),
        annotation(4, 2, [2.5, 3.5, 1.5, 2], 7),
    ]
    return images, coco_file(tmp_path / "instances.json", entries, boxes)


def test_coco_items_are_images_sorted_by_id_with_xyxy_pixel_boxes(
    coco_set: tuple[Path, Path],
) -> None:
    dataset = CocoDetection(*coco_set)
    assert len(dataset) == 3
    assert dataset.image_ids == [2, 5, 9]
    assert dataset.files == ["sub/b.jpg", "a.jpg", "c.jpg"]
    # categories sorted by id (3 cat, 7 dog) become labels 0, 1
    assert dataset.category_ids == [3, 7]
    assert dataset.classes == ["cat", "dog"]
    image, target = dataset[1]
    assert isinstance(image, Image.Image) and image.size == (40, 30)
    assert set(target) == {"boxes", "labels", "iscrowd"}
    assert target["boxes"].dtype == np.float32 and target["boxes"].shape == (2, 4)
    np.testing.assert_array_equal(target["boxes"], [[1, 2, 11, 22], [30.5, 0, 40, 30]])
    np.testing.assert_array_equal(target["labels"], [1, 0])
    assert target["labels"].dtype == np.int64
    np.testing.assert_array_equal(target["iscrowd"], [0, 1])
    image, target = dataset[0]
    assert image.size == (20, 10)
    np.testing.assert_array_equal(target["boxes"], [[0, 0, 20, 10], [2.5, 3.5, 4, 5.5]])
    np.testing.assert_array_equal(target["labels"], [0, 1])
    image, target = dataset[-1]  # no annotations: N = 0
    assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,)
    assert target["iscrowd"].shape == (0,)
    assert dataset.skipped == []


def test_coco_dataset_pickles_for_spawned_workers(coco_set: tuple[Path, Path]) -> None:
    dataset = pickle.loads(pickle.dumps(CocoDetection(*coco_set)))
    np.testing.assert_array_equal(dataset[1][1]["boxes"], [[1, 2, 11, 22], [30.5, 0, 40, 30]])


@pytest.mark.parametrize(
    ("bbox", "category", "reason"),
    [
        ([30, 0, 12, 5], 3, r"annotation id 1 .*: bbox \[30, 0, 12, 5\] lies past the 40x30 image"),
        ([5, 5, -3, 4], 3, r"annotation id 1 .*width -3 and height 4; a box needs a positive size"),
        ([5, 5, 0, 4], 3, r"width 0 and height 4"),
        (
            [float("nan"), 5, 3, 4],
            3,
            r"bbox \[nan, 5, 3, 4\] has a coordinate that is not a finite",
        ),
        ([5, 5, 3], 3, r"has bbox \[5, 5, 3\]; expected \[x, y, width, height\] numbers"),
        ([5, 5, 3, 4], 4, r"has category_id 4, which is not in 'categories'"),
    ],
)
def test_a_bad_coco_annotation_leaves_its_image_out_and_says_why(
    tmp_path: Path, bbox: list[float], category: int, reason: str
) -> None:
    write_image(tmp_path / "a.jpg", 40, 30)
    write_image(tmp_path / "b.jpg", 40, 30)
    entries = [
        {"id": 1, "file_name": "a.jpg", "width": 40, "height": 30},
        {"id": 2, "file_name": "b.jpg", "width": 40, "height": 30},
    ]
    boxes = [annotation(1, 1, bbox, category), annotation(2, 2, [0, 0, 4, 4])]
    dataset = CocoDetection(tmp_path, coco_file(tmp_path / "i.json", entries, boxes))
    assert dataset.files == ["b.jpg"] and dataset.image_ids == [2]
    assert len(dataset.skipped) == 1
    assert dataset.skipped[0]["path"] == str(tmp_path / "a.jpg")
    assert "i.json image id 1 (a.jpg)" in dataset.skipped[0]["reason"]
    assert __import__("re").search(reason, dataset.skipped[0]["reason"]), dataset.skipped


def test_coco_annotations_of_an_unknown_image_id_are_recorded(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 40, 30)
    entries = [{"id": 1, "file_name": "a.jpg", "width": 40, "height": 30}]
    boxes = [annotation(1, 1, [0, 0, 4, 4]), annotation(8, 99, [0, 0, 4, 4]),
             annotation(9, 99, [0, 0, 2, 2])]  # fmt: skip
    path = coco_file(tmp_path / "i.json", entries, boxes)
    dataset = CocoDetection(tmp_path, path)
    assert len(dataset) == 1
    assert dataset.skipped == [
        {
            "path": str(path),
            "reason": "annotation id 8 (annotations[1]) and 1 more refer to image_id 99, "
            "not in 'images'",
        }
    ]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", r"i.json is not valid JSON"),
        ("[1, 2]", r"holds a JSON list; a COCO file is an object"),
        ('{"images": [], "categories": []}', r"has no 'annotations'"),
        ('{"images": [{"id": 1}], "annotations": [], "categories": []}',
         r"images\[0\] = .* needs an integer 'id' and a 'file_name'"),
        ('{"images": [{"id": 1, "file_name": "a"}, {"id": 1, "file_name": "b"}], '
         '"annotations": [], "categories": []}', r"image id 1 is listed twice"),
        ('{"images": [], "annotations": [], "categories": [{"name": "x"}]}',
         r"categories\[0\] = .* has no integer 'id'"),
    ],
)  # fmt: skip
def test_a_malformed_coco_file_is_one_error_naming_it(
    tmp_path: Path, text: str, match: str
) -> None:
    path = tmp_path / "i.json"
    path.write_text(text)
    with pytest.raises(AnnotationError, match=match):
        CocoDetection(tmp_path, path)
    with pytest.raises(AnnotationError, match="does not exist"):
        CocoDetection(tmp_path, tmp_path / "missing.json")


def test_coco_ignore_flags_are_kept_when_the_file_has_them(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 40, 30)
    entries = [{"id": 1, "file_name": "a.jpg", "width": 40, "height": 30}]
    boxes = [annotation(1, 1, [0, 0, 4, 4], ignore=1), annotation(2, 1, [1, 1, 4, 4])]
    _, target = CocoDetection(tmp_path, coco_file(tmp_path / "i.json", entries, boxes))[0]
    np.testing.assert_array_equal(target["ignore"], [1, 0])
    np.testing.assert_array_equal(target["iscrowd"], [0, 0])


def test_coco_sizes_follow_the_stored_or_upright_photo_and_refuse_a_mismatch(
    tmp_path: Path,
) -> None:
    # both stored 40x30 with orientation 6 (upright 30x40); annotated upright, as stored,
    # and wrongly
    for name in ("upright.jpg", "stored.jpg", "wrong.jpg"):
        write_image(tmp_path / name, 40, 30, orientation=6)
    entries = [
        {"id": 1, "file_name": "upright.jpg", "width": 30, "height": 40},
        {"id": 2, "file_name": "stored.jpg", "width": 40, "height": 30},
        {"id": 3, "file_name": "wrong.jpg", "width": 50, "height": 30},
    ]
    dataset = CocoDetection(tmp_path, coco_file(tmp_path / "i.json", entries, []))
    assert dataset[0][0].size == (30, 40)
    assert dataset[1][0].size == (40, 30)
    with pytest.raises(
        DecodeError, match=r"the image is 40x30, but its annotation says 50x30"
    ) as info:
        dataset[2]
    assert info.value.reason == "mismatch"


def test_a_missing_coco_image_file_fails_its_item_as_an_unreadable_input(tmp_path: Path) -> None:
    entries = [{"id": 1, "file_name": "gone.jpg", "width": 4, "height": 4}]
    dataset = CocoDetection(tmp_path, coco_file(tmp_path / "i.json", entries, []))
    with pytest.raises(FileNotFoundError):
        dataset[0]


def test_box_rules_clip_within_the_tolerance_and_name_each_problem() -> None:
    boxes = np.asarray(
        [[-0.5, 0, 10, 10.9], [0, 0, 11.5, 5], [3, 3, 3, 5], [np.inf, 0, 1, 1], [10.5, 0, 10.9, 1]]
    )
    side = np.full(5, 10.0)
    clipped, problems = box_problems(boxes, side, side)
    np.testing.assert_array_equal(clipped[0], [0, 0, 10, 10])
    assert problems[0] is None
    assert problems[1] is not None and "lies past the 10x10 image by more than 1" in problems[1]
    assert problems[2] is not None and "width 0 and height 2" in problems[2]
    assert problems[3] == "has a coordinate that is not a finite number"
    # within the tolerance, but nothing of it inside the image
    assert problems[4] is not None and "lies past" in problems[4]


def test_the_format_is_detected_from_the_path(tmp_path: Path) -> None:
    (tmp_path / "i.json").write_text("{}")
    (tmp_path / "yolo" / "sub").mkdir(parents=True)
    (tmp_path / "yolo" / "sub" / "a.txt").write_text("")
    (tmp_path / "yolo" / "classes.txt").write_text("x\n")
    (tmp_path / "voc").mkdir()
    (tmp_path / "voc" / "a.xml").write_text("<annotation/>")
    assert detect_annotation_format(tmp_path / "i.json") == "coco"
    assert detect_annotation_format(tmp_path / "yolo") == "yolo"
    assert detect_annotation_format(tmp_path / "voc") == "voc"
    (tmp_path / "voc" / "b.txt").write_text("")
    with pytest.raises(AnnotationError, match=r"holds 1 .txt and 1 .xml files: say which format"):
        detect_annotation_format(tmp_path / "voc")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "classes.txt").write_text("x\n")
    with pytest.raises(AnnotationError, match=r"holds no .txt \(YOLO\) or .xml \(VOC\) files"):
        detect_annotation_format(tmp_path / "empty")
    with pytest.raises(AnnotationError, match=r"must end in .json"):
        detect_annotation_format(tmp_path / "voc" / "a.xml")
    with pytest.raises(AnnotationError, match=r"annotations do not exist"):
        detect_annotation_format(tmp_path / "nowhere")


def test_open_annotations_reads_the_detected_format(coco_set: tuple[Path, Path]) -> None:
    assert isinstance(open_annotations(*coco_set), CocoDetection)
    with pytest.raises(
        ValueError, match=r"format must be one of \('auto', 'coco', 'yolo', 'voc'\)"
    ):
        open_annotations(*coco_set, format="kitti")
    with pytest.raises(ValueError, match="class_names is for YOLO and VOC"):
        open_annotations(*coco_set, class_names=["a"])


def test_the_job_policy_raises_on_or_records_what_a_source_left_out(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 40, 30)
    write_image(tmp_path / "b.jpg", 40, 30)
    entries = [
        {"id": 1, "file_name": "a.jpg", "width": 40, "height": 30},
        {"id": 2, "file_name": "b.jpg", "width": 40, "height": 30},
    ]
    path = coco_file(tmp_path / "i.json", entries, [annotation(1, 1, [0, 0, 50, 4])])
    dataset = CocoDetection(tmp_path, path)
    with pytest.raises(
        PreprocessError, match=r"bad annotation: .*a.jpg: i.json image id 1 .*lies past"
    ):
        source_skipped(dataset, "raise")
    assert source_skipped(dataset, "skip") == dataset.skipped and len(dataset.skipped) == 1
    assert source_skipped([1, 2], "raise") == []
    only_bad = CocoDetection(
        tmp_path, coco_file(tmp_path / "j.json", entries[:1], [annotation(1, 1, [0, 0, 50, 4])])
    )
    with pytest.raises(
        PreprocessError, match=r"every image was left out for bad annotations \(1\)"
    ):
        source_skipped(only_bad, "skip")


def test_the_digest_covers_every_box_not_only_the_probed_items(tmp_path: Path) -> None:
    entries = [{"id": i, "file_name": f"{i}.jpg", "width": 40, "height": 30} for i in range(3)]
    boxes = [annotation(i, i, [1, 1, 4, 4]) for i in range(3)]
    first = CocoDetection(tmp_path, coco_file(tmp_path / "a.json", entries, boxes))
    assert first.digest() == CocoDetection(tmp_path, tmp_path / "a.json").digest()
    boxes[1]["bbox"] = [1, 1, 4, 5]  # the middle image's box, 1 px taller
    second = CocoDetection(tmp_path, coco_file(tmp_path / "b.json", entries, boxes))
    assert first.digest() != second.digest()
    boxes[1]["bbox"], boxes[1]["iscrowd"] = [1, 1, 4, 4], 1
    third = CocoDetection(tmp_path, coco_file(tmp_path / "c.json", entries, boxes))
    assert first.digest() != third.digest()


def test_warn_logs_each_image_a_source_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_image(tmp_path / "a.jpg", 40, 30)
    entries = [{"id": 1, "file_name": "a.jpg", "width": 40, "height": 30},
               {"id": 2, "file_name": "a.jpg", "width": 40, "height": 30}]  # fmt: skip
    path = coco_file(tmp_path / "i.json", entries, [annotation(1, 1, [0, 0, 4, float("inf")])])
    dataset = CocoDetection(tmp_path, path)
    with caplog.at_level("DEBUG", logger="fastdata.preprocess.annotations"):
        source_skipped(dataset, "skip")
        assert [r.levelname for r in caplog.records if "skipped" in r.getMessage()] == ["DEBUG"]
        caplog.clear()
        source_skipped(dataset, "warn")
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "i.json image id 1 (a.jpg)" in warned[0].getMessage()
    assert "not a finite number" in warned[0].getMessage()
