"""Passwords out of everything shown or stored: `scheme://user:secret@host` -> `user:***@`."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# scheme://user:secret@host: the secret runs to the last `@` before the host, so a password
# holding an `@` is masked whole.
_CREDENTIALS = re.compile(
    r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*):(?P<secret>[^\s/]*?)@(?=[^\s@/]*(?:[/?#\s]|$))"
)


def redact(text: str) -> str:
    """`text` with the password of every URL in it replaced by `***`."""
    return _CREDENTIALS.sub(r"\g<head>:***@", text)


def redact_all(value: Any) -> Any:
    """A copy of plain data (dicts, lists, strings) with every URL password masked."""
    return map_strings(value, redact)


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """A copy of plain data (dicts, lists, tuples as lists) with `fn` applied to each string."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [map_strings(v, fn) for v in value]
    return value


def shown_url(url: str) -> str:
    """A storage URL fit to print or store: without its password at all."""
    return _CREDENTIALS.sub(r"\g<head>@", url)
