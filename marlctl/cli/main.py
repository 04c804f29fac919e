"""`marlctl`'s entry point: the commands run with the project's errors as messages and exit
codes, and a defect as one line with its traceback kept in a file."""

from __future__ import annotations

import sys

import typer

from marlctl.cli import output
from marlctl.cli.app import app
from marlctl.cli.output import emit_json, fail, say
from marlctl.errors import MarlctlError, one_line
from marlctl.redact import redact


def main() -> None:
    import faulthandler
    import signal

    from typer.exceptions import TyperException

    # `kill -USR1 PID` prints every thread's stack: where a stuck run is stuck.
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (OSError, ValueError):  # stderr without a file descriptor (embedded, captured)
        pass

    as_json = "--json" in sys.argv[1:]
    try:
        code = app(standalone_mode=False)
    except (KeyboardInterrupt, typer.Abort):
        output.err.print("[yellow]interrupted[/yellow]")
        code = 130
    except TyperException as error:  # usage errors: bad option, missing argument
        if hasattr(error, "show"):
            error.show()
        else:
            say(output.err, error.format_message(), "error:", "red")
        code = 2
    except typer.Exit as done:
        code = done.exit_code
    except MarlctlError as error:  # raised outside a command's own handler
        try:
            fail(error, as_json)
        except typer.Exit as done:
            code = done.exit_code
    except Exception as error:  # a defect: one line and where the traceback went
        code = _internal_error(error, as_json)
    raise SystemExit(code or 0)


def _internal_error(error: BaseException, as_json: bool) -> int:
    """Write the traceback to a file in the temp dir; say what failed and where it is."""
    import tempfile
    import time
    import traceback

    summary = f"{type(error).__name__}: {one_line(str(error))}"
    text = redact("".join(traceback.format_exception(error)))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        with tempfile.NamedTemporaryFile(
            "w", prefix=f"marlctl-{stamp}-", suffix=".traceback", delete=False
        ) as file:
            file.write(redact(f"marlctl {' '.join(sys.argv[1:])}\n\n{text}"))
        where = file.name
    except OSError:  # nowhere to write: the traceback itself, so nothing is lost
        where = None
    if as_json:
        emit_json({"ok": False, "exit_code": 1, "errors": [summary], "traceback": where})
    else:
        say(output.err, summary, "internal error:", "red")
        say(output.err, f"the traceback is in {where}" if where else text, lines=not where)
    return 1
