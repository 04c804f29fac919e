"""Files written whole or not at all (reports, videos, a sweep's best spec), and staging
folders for files on their way to the tracking store that a killed process cannot leak."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside `path`, with its suffix, to write to. It replaces `path` when
    the block ends without an error and is removed otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes it private; these files are for sharing
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


STAGING_PREFIX = "marlctl-staging-"


@contextmanager
def staging() -> Iterator[Path]:
    """A private temp folder, removed when the block ends. Its name carries this process's
    id, so that `remove_stale_staging` can clear it if the process is killed meanwhile."""
    folder = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def remove_stale_staging() -> int:
    """Remove the staging folders of processes that no longer run (a `kill -9` during a
    checkpoint upload leaves one as large as the checkpoint); the number removed."""
    removed = 0
    for folder in Path(tempfile.gettempdir()).glob(f"{STAGING_PREFIX}*"):
        pid = folder.name.removeprefix(STAGING_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
