"""Which process trains a run, and whether that process still lives.

A run whose process is killed outright (SIGKILL, the out-of-memory killer, a machine that
restarts) cannot end its MLflow run: the store keeps it RUNNING. Each seed run records the
process that trains it (`PROCESS_TAG`: host, boot, pid and the process's start time), so
that a later command on the same machine can tell such a run from one still training and
resume it from its last checkpoint. A run recorded on another machine cannot be told apart
from one still training there: it is left alone.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

PROCESS_TAG = "marlctl.process"  # host/boot/pid/start of the process training the run


def _boot() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return ""


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux); "" where /proc cannot
    tell; None where no such process exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, after the command's name


def identity(pid: int | None = None) -> str:
    """`host/boot/pid/start` of process `pid` (this one by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}/{_boot()}/{pid}/{_started(pid) or ''}"


def ended(recorded: str | None) -> bool:
    """The process `recorded` (an `identity`) is known to have ended: it ran on this machine
    and no process of its pid and start time lives now (or the machine has restarted since).
    False where it may live, or where nothing says (another machine, no record)."""
    if not recorded or recorded.count("/") != 3:
        return False
    host, boot, pid, start = recorded.split("/")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if boot and _boot() and boot != _boot():
        return True
    now = _started(int(pid))
    if now is None:
        return _gone(int(pid))
    return bool(start) and bool(now) and now != start


def _gone(pid: int) -> bool:
    """No process `pid` exists (where /proc lists none, asked of the system)."""
    if Path("/proc/self/stat").exists():
        return True  # /proc answers for every process: none of that pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False
