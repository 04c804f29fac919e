"""Passwords out of everything shown or stored: `scheme://user:secret@host` -> `user:***@`."""

from __future__ import annotations

import re
from typing import Any

_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*):(?P<secret>[^\s@/]+)@")


def redact(text: str) -> str:
    """`text` with the password of every URL in it replaced by `***`."""
    return _CREDENTIALS.sub(r"\g<head>:***@", text)


def redact_all(value: Any) -> Any:
    """A copy of plain data (dicts, lists, strings) with every URL password masked."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_all(v) for v in value]
    return value


def shown_url(url: str) -> str:
    """A storage URL fit to print or store: without its password."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        credentials, host = rest.rsplit("@", 1)
        return f"{scheme}://{credentials.split(':', 1)[0]}@{host}"
    return url
