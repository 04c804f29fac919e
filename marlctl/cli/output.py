"""What the commands print: text that may come from the user shown as it is (no markup, control
characters escaped, passwords masked), tables, JSON documents, and the project's errors as
messages and exit codes."""

from __future__ import annotations

import json
import re
import sys
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from marlctl.errors import MarlctlError, SpecError
from marlctl.redact import redact

# No emoji codes: `line100.yaml:` must not print as "line💯".
out = Console(emoji=False)
err = Console(stderr=True, emoji=False)
# Control characters (ANSI escapes among them) and line breaks in text from users.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def say(
    console: Console, message: str, label: str = "", style: str = "", lines: bool = False
) -> None:
    """Print text that may come from the user (file names, spec values, exception messages)
    as it is: no markup or emoji, control characters shown escaped, passwords masked; one
    line unless `lines`."""
    control = _CONTROL_BUT_LINES if lines else _CONTROL
    text = Text(control.sub(_escaped, redact(message)))
    if label:
        text = Text.assemble((label, style), " ", text)
    console.print(text, highlight=False, soft_wrap=True)


def print_table(table, whole: tuple[str, ...] = ()) -> None:
    """Tables print whole when piped: a file or pager gets long lines, not wrapped cells. In a
    terminal, the `whole` columns (run ids: what a user copies) are never cut; others wrap."""
    for column in table.columns:
        if column.header in whole:
            column.no_wrap = True
            column.min_width = max([len(str(column.header)), *(len(str(c)) for c in column.cells)])
        else:
            column.overflow = "fold"
    if out.is_terminal:
        out.print(table)
    else:
        Console(width=max(out.width, 200)).print(table)


def print_rows(
    header: list[str], cells: list[list[str]], whole: int | tuple[int, ...] = ()
) -> None:
    """A listing: in a terminal, a table whose `whole` columns (ids, presets: what a user copies)
    are never cut or wrapped while the others wrap; piped, one plain line per row, its cells
    separated by tabs, with no header (`| grep`, `| wc -l`, `| cut -f1` read it)."""
    keep = {whole} if isinstance(whole, int) else set(whole)
    if not out.is_terminal:
        lines = ("\t".join(_CONTROL.sub(_escaped, c) for c in row) for row in cells)
        sys.stdout.write("".join(f"{line}\n" for line in lines))
        return
    table = Table()
    for j, name in enumerate(header):
        if j in keep:
            width = max([len(name), *(len(row[j]) for row in cells)])
            table.add_column(name, no_wrap=True, min_width=width)
        else:
            table.add_column(name, overflow="fold")
    for row in cells:
        table.add_row(*(Text(c) for c in row))  # no markup: `marlctl[sisl]` stays as it is
    out.print(table)


def emit_json(document: dict[str, Any]) -> None:
    sys.stdout.write(redact(json.dumps(document, indent=2, default=str)) + "\n")


# Problems printed one per line: past a screenful, a list is the same mistake repeated (or
# input that is not a spec) and would take seconds to print.
SHOWN_PROBLEMS = 50


def fail(error: MarlctlError, as_json: bool) -> None:
    if as_json:
        problems = [str(p) for p in getattr(error, "problems", [])] or [str(error)]
        emit_json({"ok": False, "exit_code": error.exit_code, "errors": problems})
    elif isinstance(error, SpecError):
        for problem in error.problems[:SHOWN_PROBLEMS]:
            say(err, str(problem))
        count = len(error.problems)
        if count > SHOWN_PROBLEMS:
            err.print(f"... and {count - SHOWN_PROBLEMS:,} more (--json lists them all)")
        err.print(f"[red]{count} problem{'s' if count != 1 else ''}; nothing was run.[/red]")
    else:
        say(err, str(error), "error:", "red")
    raise typer.Exit(error.exit_code)


@contextmanager
def exit_codes(as_json: bool):
    """The project's errors and Ctrl-C become messages and exit codes."""
    try:
        yield
    except MarlctlError as error:
        fail(error, as_json)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/yellow]")
        raise typer.Exit(130) from None


def arg_problem(message: str):
    from marlctl.errors import Problem

    return Problem("<arguments>", None, "", message)


def count(steps: int) -> str:
    """A step count in at most five characters: 950, 12.5k, 1.50M."""
    if steps < 1_000:
        return str(steps)
    if steps < 1_000_000:
        return f"{steps / 1e3:.{1 if steps < 100_000 else 0}f}k"
    return f"{steps / 1e6:.{2 if steps < 10_000_000 else 1}f}M"


def short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def stop_on_sigterm() -> None:
    """A scheduler's SIGTERM stops training the way Ctrl-C does: checkpoint, KILLED, 130."""
    import signal

    def stop(signum, frame):
        from marlctl.launch import Terminated

        raise Terminated

    signal.signal(signal.SIGTERM, stop)
