"""YOLO txt and Pascal VOC XML annotations as datasets: pixel boxes worked out by hand from
the files the tests write, and every kind of bad annotation recorded by name."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fastdata.preprocess import (
    AnnotationError,
    CocoDetection,
    VocDetection,
    YoloDetection,
    open_annotations,
)
from tests.detection_sets import COLOURS, painted_photos, write_coco, write_voc, write_yolo
from tests.preprocess.test_annotations import write_image


@pytest.fixture
def yolo_set(tmp_path: Path) -> tuple[Path, Path]:
    """``images/{a,sub/b,c}.jpg`` with ``labels/{a,sub/b}.txt`` (c: a background image)."""
    images, labels = tmp_path / "images", tmp_path / "labels"
    write_image(images / "a.jpg", 40, 20)
    write_image(images / "sub" / "b.jpg", 10, 10)
    write_image(images / "c.jpg", 8, 8)
    (labels / "sub").mkdir(parents=True)
    (labels / "a.txt").write_text("1 0.5 0.5 0.5 0.5\n\n0 0.125 0.25 0.25 0.5\n")
    (labels / "sub" / "b.txt").write_text("2 0.9 0.5 0.2004 1.0\n")  # x2 1.0002: clipped
    (labels / "classes.txt").write_text("cat\ndog\nbird\n")
    return images, labels


def test_yolo_lines_become_pixel_boxes_of_each_image(yolo_set: tuple[Path, Path]) -> None:
    dataset = YoloDetection(*yolo_set)
    assert dataset.files == ["a.jpg", "c.jpg", "sub/b.jpg"]
    assert dataset.classes == ["cat", "dog", "bird"]
    image, target = dataset[0]
    assert image.size == (40, 20)
    assert set(target) == {"boxes", "labels"}
    # cx 0.5 cy 0.5 w 0.5 h 0.5 of 40x20: x 10..30, y 5..15; cx .125 cy .25 w .25 h .5: 0..10, 0..10
    np.testing.assert_allclose(target["boxes"], [[10, 5, 30, 15], [0, 0, 10, 10]])
    assert target["boxes"].dtype == np.float32
    np.testing.assert_array_equal(target["labels"], [1, 0])
    assert target["labels"].dtype == np.int64
    _, target = dataset[1]
    assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,)
    _, target = dataset[2]  # cx .9 w .2004 of 10: x 7.998..10.002 → clipped at 10
    np.testing.assert_allclose(target["boxes"], [[7.998, 0, 10, 10]], atol=1e-4)
    assert dataset.skipped == []


def test_yolo_labels_beside_the_images_and_given_class_names(tmp_path: Path) -> None:
    write_image(tmp_path / "a.png", 10, 10)
    (tmp_path / "a.txt").write_text("3 0.5 0.5 0.2 0.2\n")
    dataset = open_annotations(tmp_path, tmp_path, class_names=["a", "b", "c", "d"])
    assert isinstance(dataset, YoloDetection)
    assert dataset.classes == ["a", "b", "c", "d"]
    np.testing.assert_allclose(dataset[0][1]["boxes"], [[4, 4, 6, 6]])
    assert YoloDetection(tmp_path).classes == []  # no names: any class taken


def test_yolo_boxes_are_in_the_upright_photo(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 40, 20, orientation=6)  # upright: 20x40
    (tmp_path / "a.txt").write_text("0 0.5 0.25 0.5 0.5\n")
    image, target = YoloDetection(tmp_path)[0]
    assert image.size == (20, 40)
    np.testing.assert_allclose(target["boxes"], [[5, 0, 15, 20]])


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("0 0.5 0.5 0.2", r"line 2 has 4 values \('0 0.5 0.5 0.2'\); a box line is 'class cx cy"),
        ("0 0.5 0.5 0.2 x", r"line 2 \('0 0.5 0.5 0.2 x'\) holds a value that is not a number"),
        ("3 0.5 0.5 0.2 0.2", r"line 2 has class '3', not a known class \(0..2\)"),
        ("-1 0.5 0.5 0.2 0.2", r"line 2 has class '-1', not a known class"),
        ("0.5 0.5 0.5 0.2 0.2", r"line 2 has class '0.5'"),
        ("0 0.95 0.5 0.2 0.2", r"box 'cx cy w h' = '0.95 0.5 0.2 0.2' \(normalised\) lies past"),
        ("0 0.5 0.5 -0.2 0.2", r"line 2: .* has width -0.2 and height 0.2"),
        ("0 nan 0.5 0.2 0.2", r"line 2: .* not a finite number"),
    ],
)  # fmt: skip
def test_a_bad_yolo_line_leaves_its_image_out_and_says_why(
    yolo_set: tuple[Path, Path], line: str, reason: str
) -> None:
    images, labels = yolo_set
    (labels / "a.txt").write_text(f"0 0.5 0.5 0.2 0.2\n{line}\n")
    dataset = YoloDetection(images, labels)
    assert dataset.files == ["c.jpg", "sub/b.jpg"]
    assert dataset.skipped[0]["path"] == str(images / "a.jpg")
    assert dataset.skipped[0]["reason"].startswith(f"{labels / 'a.txt'}: ")
    assert re.search(reason, dataset.skipped[0]["reason"]), dataset.skipped


def test_yolo_orphan_labels_and_twin_stems_are_recorded(yolo_set: tuple[Path, Path]) -> None:
    images, labels = yolo_set
    (labels / "gone.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    write_image(images / "a.png", 4, 4)
    (labels / "bad.txt").write_bytes(b"\xff\xfe\x00")
    dataset = YoloDetection(images, labels)
    reasons = {entry["path"]: entry["reason"] for entry in dataset.skipped}
    assert reasons[str(images / "a.png")].startswith("another image has the same stem (a.jpg)")
    assert reasons[str(labels / "gone.txt")] == (
        f"label file without an image (no gone.* in {images})"
    )
    assert len(dataset) == 3


def test_yolo_refuses_missing_folders_and_bad_class_names(tmp_path: Path) -> None:
    with pytest.raises(AnnotationError, match="YOLO image folder does not exist"):
        YoloDetection(tmp_path / "nowhere")
    with pytest.raises(AnnotationError, match=r"no images \(.jpg"):
        YoloDetection(tmp_path)
    write_image(tmp_path / "a.jpg", 4, 4)
    with pytest.raises(AnnotationError, match="class name 'a' is listed twice"):
        YoloDetection(tmp_path, class_names=["a", "b", "a"])
    with pytest.raises(TypeError, match="class_names must be a sequence of str"):
        YoloDetection(tmp_path, class_names="ab")
    (tmp_path / "classes.txt").write_text("\n\n")
    with pytest.raises(AnnotationError, match=r"classes\.txt: no class names"):
        YoloDetection(tmp_path)


def voc_xml(
    path: Path,
    size: tuple[int, int],
    objects: list[tuple[str, tuple[float, float, float, float], int]],
) -> None:
    parts = [
        f"<object><name>{name}</name><difficult>{difficult}</difficult><bndbox>"
        f"<xmin>{box[0]}</xmin><ymin>{box[1]}</ymin><xmax>{box[2]}</xmax><ymax>{box[3]}</ymax>"
        "</bndbox></object>"
        for name, box, difficult in objects
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"<annotation><filename>{path.stem}.jpg</filename><size><width>{size[0]}</width>"
        f"<height>{size[1]}</height><depth>3</depth></size>{''.join(parts)}</annotation>"
    )


@pytest.fixture
def voc_set(tmp_path: Path) -> tuple[Path, Path]:
    images, xml = tmp_path / "JPEGImages", tmp_path / "Annotations"
    write_image(images / "x1.jpg", 40, 30)
    write_image(images / "x2.jpg", 20, 20)
    write_image(images / "unannotated.jpg", 20, 20)
    voc_xml(xml / "x1.xml", (40, 30), [("person", (1, 1, 40, 30), 0), ("dog", (5, 6, 7, 9), 1)])
    voc_xml(xml / "x2.xml", (20, 20), [])
    return images, xml


def test_voc_objects_become_zero_based_pixel_boxes(voc_set: tuple[Path, Path]) -> None:
    dataset = VocDetection(*voc_set)
    assert dataset.files == ["x1.jpg", "x2.jpg"]
    assert dataset.classes == ["dog", "person"]  # sorted names found
    image, target = dataset[0]
    assert image.size == (40, 30)
    assert set(target) == {"boxes", "labels", "difficult"}
    # 1-based inclusive pixels: xmin=1..xmax=40 is the whole 40-pixel width, [0, 40]
    np.testing.assert_array_equal(target["boxes"], [[0, 0, 40, 30], [4, 5, 7, 9]])
    np.testing.assert_array_equal(target["labels"], [1, 0])
    np.testing.assert_array_equal(target["difficult"], [0, 1])
    _, target = dataset[1]
    assert target["boxes"].shape == (0, 4) and target["difficult"].shape == (0,)
    given = open_annotations(*voc_set, class_names=["person", "cat", "dog"])
    assert isinstance(given, VocDetection)
    np.testing.assert_array_equal(given[0][1]["labels"], [0, 2])


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<annotation><size>", r"not a readable XML file \(ParseError"),
        ("<voc/>", r"the root element is <voc>"),
        ("<annotation><size><width>0</width><height>4</height></size></annotation>",
         r"has no <size> with a positive integer <width> and <height>"),
        ("<annotation><size><width>40</width><height>30</height></size><object><bndbox/>"
         "</object></annotation>", r"object 1 has no <name>"),
        ("<annotation><size><width>40</width><height>30</height></size><object><name>dog"
         "</name><bndbox><xmin>1</xmin></bndbox></object></annotation>",
         r"object 1 \(dog\) has no <bndbox> of four numbers"),
        ("<annotation><size><width>40</width><height>30</height></size><object><name>dog"
         "</name><difficult>2</difficult><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>2</xmax>"
         "<ymax>2</ymax></bndbox></object></annotation>", r"has <difficult> '2'; expected 0 or 1"),
    ],
)  # fmt: skip
def test_a_malformed_voc_file_leaves_its_image_out(
    voc_set: tuple[Path, Path], text: str, reason: str
) -> None:
    images, xml = voc_set
    (xml / "x1.xml").write_text(text)
    dataset = VocDetection(images, xml)
    assert dataset.files == ["x2.jpg"]
    assert dataset.skipped[0]["path"] == str(images / "x1.jpg")
    assert dataset.skipped[0]["reason"].startswith(f"{xml / 'x1.xml'}: ")
    assert re.search(reason, dataset.skipped[0]["reason"]), dataset.skipped


def test_bad_voc_objects_and_files_without_images_are_recorded(voc_set: tuple[Path, Path]) -> None:
    images, xml = voc_set
    voc_xml(xml / "x2.xml", (20, 20), [("dog", (1, 1, 25, 10), 0)])
    voc_xml(xml / "gone.xml", (20, 20), [])
    dataset = VocDetection(images, xml, class_names=["dog"])
    reasons = {entry["path"]: entry["reason"] for entry in dataset.skipped}
    assert (
        reasons[str(images / "x1.jpg")] == f"{xml / 'x1.xml'}: class 'person' is not in class_names"
    )
    assert re.fullmatch(
        r".*x2.xml: object 1 \(dog\): bndbox \(1, 1, 25, 10\) lies past the 20x20 image .*",
        reasons[str(images / "x2.jpg")],
    )
    assert reasons[str(xml / "gone.xml")] == f"no image gone.* in {images}"
    assert len(dataset) == 0


def test_voc_refuses_a_folder_without_xml(tmp_path: Path) -> None:
    with pytest.raises(AnnotationError, match="VOC annotation folder does not exist"):
        VocDetection(tmp_path, tmp_path / "nowhere")
    with pytest.raises(AnnotationError, match=r"no .xml annotation files in"):
        VocDetection(tmp_path, tmp_path)


def test_the_three_formats_give_the_painted_boxes(tmp_path: Path) -> None:
    photos = painted_photos(tmp_path / "images")
    readers = [
        CocoDetection(photos.images, write_coco(photos, tmp_path / "instances.json")),
        YoloDetection(photos.images, write_yolo(photos, tmp_path / "labels")),
        VocDetection(photos.images, write_voc(photos, tmp_path / "xml"), list(COLOURS)),
    ]
    for dataset in readers:
        assert len(dataset) == 12 and dataset.classes == list(COLOURS) and not dataset.skipped
        for index in range(12):
            image, target = dataset[index]
            assert image.size == photos.sizes[index]
            np.testing.assert_allclose(target["boxes"], photos.boxes[index], atol=1e-4)
            np.testing.assert_array_equal(target["labels"], photos.labels[index])
            if len(target["boxes"]):  # the box painted last is whole: its colour fills it
                x1, y1, x2, y2 = target["boxes"][-1].astype(int)
                inside = np.asarray(image.convert("RGB"), np.int16)[
                    y1 + 1 : y2 - 1, x1 + 1 : x2 - 1
                ]
                colour = list(COLOURS.values())[target["labels"][-1]]
                assert (np.abs(inside - colour).max(axis=-1) < 40).mean() > 0.95
