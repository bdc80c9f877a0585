"""``fastdata inspect`` names each field's kind and role."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastdata.cli import main
from tests.shards.test_ragged import write_detection_set


def test_inspect_shows_ragged_fields_and_roles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_detection_set(tmp_path)
    assert main(["inspect", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    fields = [line.split(maxsplit=2)[1:] for line in lines if line.startswith("field ")]
    assert fields == [
        ["image", "uint8 (8, 6, 3) HWC  (image)"],
        ["boxes", "ragged float32 (N, 4)  (boxes)"],
        ["labels", "ragged int64 (N)  (box_labels)"],
        ["label", "int64 ()  (label)"],
    ]
    assert "(format v2)" in lines[0]
