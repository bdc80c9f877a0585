"""``--help`` of every subcommand: defaults shown, options and commands described."""

from __future__ import annotations

import pytest

from fastdata.cli import _SUBCOMMANDS, main


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_preprocess_help_shows_defaults_and_describes_storage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _help(["preprocess"], capsys)
    for default in (
        "in one pass (default: 224)",
        "for training-time crops (default: shorter; pad with --coco, --yolo, --voc or",
        "JPEG quality 1-100 of --storage jpeg (default: 90)",
        "target shard size in MiB (default: 64)",
        "(default: raw)",
        "(default: skip)",
    ):
        assert default in text
    assert "raw: fixed-size uint8 pixel arrays, memory-mapped" in text
    assert "jpeg: images re-encoded as JPEG" in text
    assert "(default: None)" not in text and "(default: False)" not in text


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_inspect_and_verify_have_descriptions(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help([command], capsys)
    description = text.split("positional arguments:")[0].split(" out ", 1)[1]
    assert len(description) > 80 and "index.json" in description


def test_tune_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(["tune"], capsys)
    assert "seconds the search may take (default: 60.0)" in text
    assert "(default: 0.5)" in text and "--crop SIZE" in text


def test_one_spelling_of_the_quiet_flag(capsys: pytest.CaptureFixture[str]) -> None:
    quiet = {}
    for command in _SUBCOMMANDS:
        text = _help([command], capsys)
        quiet[command] = "-q, --quiet no progress bars" in text
        assert "--no-progress" not in text
    # Every subcommand that shows progress bars takes -q/--quiet, and only that spelling.
    assert quiet == {"preprocess": True, "inspect": False, "verify": True, "tune": True}
