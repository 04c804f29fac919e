"""The project's error types and the wording of their messages. The CLI maps each type to one
exit code; nothing else exits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec, located as `FILE:LINE: key.path: message`."""

    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        path, message = printable(self.path), printable(self.message)
        if path != path.strip():  # a key with blanks at its ends, quoted: the location reads
            path = repr(path)
        return f"{where}: {path}: {message}" if path else f"{where}: {message}"


def printable(text: str) -> str:
    """`text` with every character a terminal would not show as itself (a newline, a carriage
    return, C1 controls, private-use code points) written as its escape, so that a message
    quoting hostile input stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def one_line(text: str, limit: int = 300) -> str:
    """An exception's message as one line of at most `limit` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class MarlctlError(Exception):
    """Base class; `exit_code` is what the CLI returns for it."""

    exit_code = 1


class SpecError(MarlctlError):
    """The spec, an override or an argument is invalid (exit 2). Carries every problem found."""

    exit_code = 2

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))

    @classmethod
    def at(cls, where: str, message: str) -> SpecError:
        """One problem with a command-line argument or a named thing, not a spec line."""
        return cls([Problem(where, None, "", message)])
