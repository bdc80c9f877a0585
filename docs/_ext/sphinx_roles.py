"""Griffe extension for the documentation site: Sphinx roles in docstrings become links.

The docstrings use Sphinx cross-reference roles (``:class:`ShardDataset```,
``:func:`~fastdata.decode.create_decoder```), which Markdown would show as literal text.
This rewrites each role to an *optional* autorefs link: a link where the name resolves to a
documented object, plain code otherwise (never a broken-reference warning).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")


def _resolve(obj: griffe.Object, target: str) -> str | None:
    """The full path ``target`` names from ``obj``'s scope, or None."""
    if target.startswith("fastdata."):
        return target
    head, _, rest = target.partition(".")
    for scope in (obj, obj.parent):
        if scope is None:
            continue
        try:
            path = scope.resolve(head)
        except (griffe.NameResolutionError, AttributeError, KeyError):
            continue
        return f"{path}.{rest}" if rest else path
    return None


def _rewrite(obj: griffe.Object) -> None:
    docstring = obj.docstring
    if docstring is None or ":" not in docstring.value:
        return

    def link(match: re.Match[str]) -> str:
        target = match["target"]
        title = target.rsplit(".", 1)[-1] if match["tilde"] else target
        path = _resolve(obj, target)
        if path is None:
            return f"`{title}`"
        return f'<autoref identifier="{path}" optional><code>{title}</code></autoref>'

    docstring.value = _ROLE.sub(link, docstring.value)


def _walk(obj: griffe.Object, seen: set[int]) -> None:
    if id(obj) in seen:
        return
    seen.add(id(obj))
    _rewrite(obj)
    for member in obj.members.values():
        if not member.is_alias:
            _walk(member, seen)  # type: ignore[arg-type]


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles once the whole package is loaded (names resolve then)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _walk(pkg, set())
