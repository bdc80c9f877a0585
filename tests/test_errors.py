"""The on_error policy (:class:`OnError`) and :class:`DecodeError`'s fields."""

from __future__ import annotations

import logging
import pickle
import warnings

import pytest

from fastdata.errors import DECODE_REASONS, DecodeError, OnError


@pytest.mark.parametrize(
    ("value", "policy"),
    [
        ("raise", OnError.RAISE),
        ("warn", OnError.WARN),
        ("skip", OnError.SKIP),
        (OnError.SKIP, OnError.SKIP),
    ],
)
def test_parse_accepts_every_spelling(value: OnError | str, policy: OnError) -> None:
    assert OnError.parse(value) is policy
    assert OnError.parse(value) == policy.value and str(policy) == policy.value


def test_spellings_are_what_parse_accepts() -> None:
    assert OnError.spellings() == ("raise", "warn", "skip")
    for spelling in OnError.spellings():
        OnError.parse(spelling)


@pytest.mark.parametrize("value", ["ignore", "Raise", "", "SKIP"])
def test_parse_refuses_other_values(value: str) -> None:
    with pytest.raises(
        ValueError,
        match=rf"on_error must be one of \('raise', 'warn', 'skip'\), got '{value}'$",
    ):
        OnError.parse(value)


def test_the_former_spelling_fail_is_refused_naming_raise() -> None:
    with pytest.raises(
        ValueError,
        match=r"^policy must be one of \('raise', 'warn', 'skip'\), got 'fail' "
        r"\(now spelled 'raise'\)$",
    ):
        OnError.parse("fail", name="policy")


def test_parse_refuses_other_types_naming_the_argument() -> None:
    with pytest.raises(TypeError, match="policy must be a str, got NoneType"):
        OnError.parse(None, "policy")  # type: ignore[arg-type]


def test_handle_raise_raises_the_error_itself() -> None:
    error = DecodeError("bad", "a.jpg")
    with pytest.raises(DecodeError) as caught:
        OnError.RAISE.handle(error)
    assert caught.value is error


def test_handle_warn_warns_from_the_caller() -> None:
    with pytest.warns(RuntimeWarning, match=r"^skipped a sample: bad: a\.jpg$") as record:
        OnError.WARN.handle(DecodeError("bad", "a.jpg"))
    assert record[0].filename == __file__


def test_handle_warn_with_a_log_writes_a_warning_record(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("fastdata.test")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.DEBUG, logger="fastdata.test"):
            OnError.WARN.handle(DecodeError("bad", "a.jpg"), log=log)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "skipped a sample: bad: a.jpg")
    ]


def test_handle_skip_is_quiet_but_logs_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.DEBUG, logger="fastdata"):
            OnError.SKIP.handle(DecodeError("bad", "a.jpg"))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "skipped a sample: bad: a.jpg")
    ]


def test_decode_error_fields_and_pickling() -> None:
    error = DecodeError("corrupt or truncated JPEG (x)", "shard-00000.h5:5", "truncated")
    assert str(error) == "corrupt or truncated JPEG (x): shard-00000.h5:5"
    copy = pickle.loads(pickle.dumps(error))  # errors cross DataLoader worker processes
    assert (copy.message, copy.source, copy.reason) == (error.message, error.source, "truncated")
    assert DecodeError("bad", "x").reason == "corrupt"
    assert set(DECODE_REASONS) == {
        "empty", "truncated", "corrupt", "too_large", "not_an_image", "mismatch",
        "bad_annotation",
    }  # fmt: skip


def test_decode_error_with_source_keeps_message_and_reason() -> None:
    error = DecodeError("empty image data", "image", "empty")
    moved = error.with_source("shard-00001.h5:7")
    assert str(moved) == "empty image data: shard-00001.h5:7"
    assert moved.reason == "empty" and moved.__cause__ is error


def test_decode_error_refuses_an_unknown_reason() -> None:
    with pytest.raises(ValueError, match=r"reason must be one of .*, got 'broken'"):
        DecodeError("bad", "x", "broken")  # type: ignore[arg-type]


def test_a_kept_damaged_sample_is_reported_as_kept_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    note = DecodeError("corrupt or truncated JPEG (Corrupt JPEG data: ...)", "x.jpg", kept=True)
    copy = pickle.loads(pickle.dumps(note.with_source("dataset[3]")))
    assert (copy.kept, copy.source, copy.reason) == (True, "dataset[3]", "corrupt")
    with pytest.warns(RuntimeWarning, match=r"^kept a damaged sample: corrupt .*: x\.jpg$"):
        OnError.WARN.handle(note)
    with caplog.at_level(logging.DEBUG):
        OnError.RAISE.handle(note)
        OnError.SKIP.handle(note)
        OnError.WARN.handle(note, log=logging.getLogger("fastdata.test"))
    assert [r.getMessage() for r in caplog.records] == [f"kept a damaged sample: {note}"]
