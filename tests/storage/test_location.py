"""Locations: a local path stays a path; a URL resolves by scheme or is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastdata._storage import RemoteLocation, is_url, parse_location
from fastdata.preprocess import preprocess


def test_a_path_stays_a_path(tmp_path: Path) -> None:
    assert parse_location(tmp_path) == tmp_path
    assert parse_location(str(tmp_path)) == tmp_path
    assert parse_location("relative/dir") == Path("relative/dir")
    assert not is_url("relative/dir") and is_url("s3://b/p")


@pytest.mark.parametrize("url", ["az://bucket/set", "ftp://host/x", "file:///tmp/x"])
def test_an_unsupported_scheme_is_refused_in_one_line(url: str) -> None:
    with pytest.raises(ValueError, match=r"^out '.*' has the scheme \w+://, which is not") as info:
        parse_location(url, "out")
    assert "\n" not in str(info.value)


def test_a_wrong_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="path must be a path or a URL, got int"):
        parse_location(3)  # type: ignore[arg-type]


def test_preprocess_refuses_an_unsupported_url_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    with pytest.raises(ValueError, match="out 'ftp://host/set/' has the scheme ftp://"):
        preprocess(tmp_path / "src", "ftp://host/set/", show_progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["src"]


def test_remote_location_keys() -> None:
    location = RemoteLocation("s3", "bucket", "set/a")
    assert location.url == "s3://bucket/set/a/"
    assert location.key("index.json") == "set/a/index.json"
    assert RemoteLocation("s3", "bucket", "").key("x") == "x"
