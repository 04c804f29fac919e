"""The code a spec may name: `package.module:callable` outside Python's standard library.

An env factory and a scripted policy are the only code a spec names; both are imported and
called. Nothing in the standard library builds an env or plays a group, while much of it
runs commands, code or the interpreter's exit (`os:system`, `builtins:exec`, `sys:exit`), so
such a name is refused before anything is imported. Pure: the standard library only.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# `__main__` is the running program (marlctl itself); `builtins` is listed by Python too.
_REFUSED = frozenset(sys.stdlib_module_names) | {"__main__", "builtins"}


def standard_library_refusal(path: str, what: str) -> str | None:
    """Why `path` (`package.module:callable`) may not be named as `what`, or None."""
    module = path.partition(":")[0].strip()
    top = module.split(".")[0]
    if top not in _REFUSED:
        return None
    return (
        f"'{path}' is in Python's standard library ('{top}'), which has no {what}: a spec "
        "may name only code outside it (if a module of yours shares that name, rename it)"
    )


class UserCodeError(Exception):
    """Code a spec names raised what is not an Exception (SystemExit, KeyboardInterrupt of
    its own, another BaseException): reported as that code's failure, never as an exit."""

    def __init__(self, original: BaseException):
        self.original = original
        name, text = type(original).__name__, str(original)
        hint = " (it tried to end the process)" if isinstance(original, SystemExit) else ""
        super().__init__(f"{name}: {text}{hint}" if text else f"{name}{hint}")


@contextmanager
def calling_user_code() -> Iterator[None]:
    """Run code a spec names (importing a factory's module, building an env): whatever it
    raises that is not an Exception becomes a UserCodeError, so that `sys.exit(0)` in a
    factory cannot end validation with a false success.

    KeyboardInterrupt is the user's Ctrl-C, and propagates as one (exit 130), when SIGINT
    reached this process while the code ran; one the code raised itself is its failure. Off
    the main thread no signal arrives, so every KeyboardInterrupt there is the code's."""
    sigint = {"seen": False}
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if on_main else None
    watch = previous is not None  # None: a handler not set from Python, left alone
    if watch:

        def interrupt(signum, frame):
            sigint["seen"] = True
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt

        signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    except Exception:
        raise
    except KeyboardInterrupt as err:
        # A subclass is marlctl's own stop (SIGTERM's `Terminated`): never the code's.
        if sigint["seen"] or (on_main and not watch) or type(err) is not KeyboardInterrupt:
            raise
        raise UserCodeError(err) from None
    except BaseException as err:
        raise UserCodeError(err) from None
    finally:
        if watch:
            signal.signal(signal.SIGINT, previous)
