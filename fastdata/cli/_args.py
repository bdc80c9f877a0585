"""Argument types and the parser class the subcommands share.

A bad value is refused while parsing, naming the option, the value and what is allowed;
:class:`Parser` reports it on one line (``fastdata <cmd>: error: ...``) and exits with 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn

from fastdata.errors import OnError

QUIET_HELP = "no progress bars"


class Parser(argparse.ArgumentParser):
    """``ArgumentParser`` whose usage errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: error: <message>`` (no usage block) and exit with 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, e.g. ``(default: 90)``."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # No "(default: None)" / "(default: False)" noise on options without a real default,
        # and none where the help already states it.
        help_text = action.help or ""
        if action.default is None or action.default is False or "default" in help_text:
            return action.help
        return super()._get_help_string(action)


def _number(text: str, convert: Callable[[str], float], what: str) -> float:
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An int >= 1."""
    value = int(_number(text, int, "a positive integer"))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An int >= 0."""
    value = int(_number(text, int, "an integer >= 0"))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _number(text, float, "a number > 0")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    value = _number(text, float, "a number >= 0")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def on_error_policy(text: str) -> OnError:
    """``--on-error``: an :class:`~fastdata.errors.OnError` spelling; a former one is
    refused naming the spelling to use."""
    try:
        return OnError.parse(text, name="--on-error")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--on-error ")) from None


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An int in ``low..high`` (both included)."""

    def parse(text: str) -> int:
        value = int(_number(text, int, f"an integer in {low}..{high}"))
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer in {low}..{high}, got {text}")
        return value

    parse.__name__ = f"int in {low}..{high}"
    return parse
