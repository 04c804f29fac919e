"""The CPU cores a run may use: this process's CPU affinity and cgroup CPU quota, less the
cores other processes keep busy right now. Reads /proc and /sys only (no torch).

How busy the machine is comes from /proc/stat sampled over a quarter of a second: the time
the CPUs this process may run on spent busy, less this process's own CPU time. The load
average was the other candidate and is only the fallback where /proc/stat cannot be read:
its one-minute figure is an exponential average that takes a minute to show most of a
process that has just started and as long to forget one that has ended, so a run started
right after another would still take every core, and a run started after it ended would
still see it; it also counts the runnable tasks of the whole machine, not of the CPUs this
process may use. A short sample sees what runs now. It can miss a neighbour that happens
to pause during it; a run whose threads `auto` chose keeps sampling while it trains
(`CoreWatch`), so it gives the cores back within seconds when it is wrong.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SAMPLE_S = 0.25  # the plan's sample: 25 ticks of a 100 Hz clock per CPU
# Other processes' use of a core from which it counts as busy: an editor, a shell or a
# monitor stays well below it; a second training, a test worker or a busy loop is above it.
BUSY_AT = 0.4
# OpenMP settings a user may have chosen for the wait of idle threads; marlctl sets none of
# them where any is set.
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


@dataclass(frozen=True)
class Limits:
    """What this process may use whatever else runs: the CPUs of its affinity mask and its
    cgroup's CPU quota in cores (None: no quota), with the cgroup folder that holds it."""

    cpus: tuple[int, ...]
    quota: float | None = None
    quota_dir: Path | None = None

    @property
    def usable(self) -> int:
        """Cores: the affinity mask's, at most the quota's whole cores (a quota of 1.5
        cores throttles two busy threads for a third of every period)."""
        count = len(self.cpus)
        if self.quota is not None:
            count = min(count, max(1, math.floor(self.quota + 1e-9)))
        return max(1, count)


@dataclass(frozen=True)
class Sample:
    """CPU seconds used until `wall` (monotonic seconds): by anything on the CPUs of
    `Limits.cpus` (None: unreadable), by the quota's cgroup (None: no quota or unreadable),
    and by this process."""

    wall: float
    busy: float | None
    cgroup: float | None
    own: float


@dataclass(frozen=True)
class Reading:
    """The cores free for this process's runs and why: `usable` cores, of which other
    processes keep `busy` (in cores, as measured by `source`) busy."""

    usable: int
    busy: float
    free: int
    source: str

    def describe(self) -> str:
        return (
            f"{self.free} of {plural(self.usable, 'core')} free (other processes use "
            f"{self.busy:.1f}, {self.source})"
        )


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' * (count != 1)}"


def limits(root: Path = Path("/")) -> Limits:
    try:
        cpus = tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = tuple(range(os.cpu_count() or 1))
    quota, where = cpu_quota(root)
    return Limits(cpus, quota, where)


def cpu_quota(root: Path = Path("/")) -> tuple[float | None, Path | None]:
    """This process's cgroup CPU quota in cores and the cgroup folder that sets it: the
    tightest along the cgroup's path (a parent's quota binds its children), from cgroup v2
    `cpu.max` or v1 `cpu.cfs_quota_us / cpu.cfs_period_us`; (None, None) where none is set
    or nothing can be read."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    mount = root / "sys/fs/cgroup"
    found: list[tuple[float, Path]] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2
            for folder in _ancestors(mount, path):
                quota = _v2_quota(folder / "cpu.max")
                if quota is not None:
                    found.append((quota, folder))
        elif "cpu" in controllers.split(","):  # v1
            for name in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
                if not (mount / name).is_dir():
                    continue
                for folder in _ancestors(mount / name, path):
                    quota = _v1_quota(folder)
                    if quota is not None:
                        found.append((quota, folder))
                break
    if not found:
        return None, None
    return min(found, key=lambda item: item[0])


def _ancestors(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder and its parents up to the mount; folders that a container does
    not show (its cgroup mounted as the root) are left out."""
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    folders = [mount.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [f for f in folders if f.is_dir()]


def _v2_quota(path: Path) -> float | None:
    try:
        quota, _, period = path.read_text().strip().partition(" ")
        if quota == "max":
            return None
        return int(quota) / int(period or 100_000)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def sample(found: Limits, root: Path = Path("/")) -> Sample:
    return Sample(
        time.monotonic(),
        _cpu_busy(found.cpus, root),
        _cgroup_usage(found.quota_dir),
        time.process_time(),
    )


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_busy(cpus: tuple[int, ...], root: Path) -> float | None:
    """Seconds the CPUs `cpus` have been busy since boot (/proc/stat: user, nice, system,
    irq, softirq and steal, time the hypervisor gave the core to someone else)."""
    try:
        text = (root / "proc/stat").read_text()
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cpus}
    ticks, seen = 0, 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if name in wanted:
            fields = [int(v) for v in rest.split()]
            ticks += sum(fields[i] for i in (0, 1, 2, 5, 6, 7) if i < len(fields))
            seen += 1
    return ticks / _TICK if seen else None


def _cgroup_usage(folder: Path | None) -> float | None:
    """CPU seconds used by the cgroup of the quota (v2 `cpu.stat`, v1 `cpuacct.usage`)."""
    if folder is None:
        return None
    try:
        for line in (folder / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        pass
    try:
        return int((folder / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None


def busy_count(cores: float) -> int:
    """Whole cores taken by other processes that use `cores` of CPU time (`BUSY_AT`)."""
    return max(0, math.floor(cores + 1 - BUSY_AT))


def between(found: Limits, before: Sample, after: Sample) -> Reading | None:
    """The cores free between two samples, or None where the CPUs' use was not readable."""
    span = after.wall - before.wall
    if span <= 0 or before.busy is None or after.busy is None:
        return None
    own = after.own - before.own
    busy = max(0.0, (after.busy - before.busy - own) / span)
    free = len(found.cpus) - busy_count(busy)
    if found.quota is not None:
        quota_free = found.usable
        if before.cgroup is not None and after.cgroup is not None:
            in_group = max(0.0, (after.cgroup - before.cgroup - own) / span)
            quota_free -= busy_count(in_group)
            busy = max(busy, in_group)
        free = min(free, quota_free)
    return Reading(found.usable, busy, max(0, min(free, found.usable)), "from /proc/stat")


def measure(seconds: float = SAMPLE_S, root: Path = Path("/")) -> Reading:
    """The cores free now: a sample of `seconds`, or the one-minute load average where
    /proc/stat cannot be read."""
    found = limits(root)
    before = sample(found, root)
    time.sleep(seconds)
    reading = between(found, before, sample(found, root))
    if reading is not None:
        return reading
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - no load average either
        return Reading(found.usable, 0.0, found.usable, "not measured")
    free = max(0, found.usable - busy_count(load))
    return Reading(found.usable, load, free, "1-minute load average")


_recent: tuple[float, Reading] | None = None
RECENT_S = 2.0  # a reading that commands checking many plans at once (a grid) share


def free_cores() -> Reading:
    """`measure()`, shared by the plans a command compiles within `RECENT_S`."""
    global _recent
    now = time.monotonic()
    if _recent is None or now - _recent[0] > RECENT_S:
        _recent = (now, measure())
    return _recent[1]


class CoreWatch:
    """Keeps the torch threads of a run whose `threads_per_run` is auto within the cores
    other processes leave free, between 1 and `most`, while it trains: a run that started
    on an idle machine gives cores back within `every` to 2 × `every` seconds of another
    process starting (its threads would otherwise spin-wait against it, which slows both
    by several times), and takes them again once they have been free for two samples in a
    row (so that a neighbour that pauses for a moment does not make it flip)."""

    def __init__(
        self,
        threads: int,
        most: int,
        every: float = 2.0,
        found: Limits | None = None,
        read: Callable[[Limits], Sample] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.threads, self.most, self.every, self.clock = threads, most, every, clock
        self.found = found or limits()
        self.read = read or sample
        self.last = self.read(self.found)
        self.allowed_before = threads

    def poll(self) -> int | None:
        """The number of threads to use from now on where it changes, else None."""
        if self.clock() - self.last.wall < self.every:
            return None
        now = self.read(self.found)
        reading = between(self.found, self.last, now)
        self.last = now
        if reading is None:
            return None
        allowed = max(1, min(self.most, reading.free))
        wanted = self.threads
        if allowed < self.threads:
            wanted = allowed
        elif allowed > self.threads and self.allowed_before > self.threads:
            wanted = min(allowed, self.allowed_before)
        self.allowed_before = allowed
        if wanted == self.threads:
            return None
        self.threads = wanted
        return wanted


@contextmanager
def passive_wait(enabled: bool = True) -> Iterator[None]:
    """OMP_WAIT_POLICY=PASSIVE for the processes started meanwhile (and this one, where it
    has not loaded torch yet: OpenMP reads it once, as torch loads it), unless the user set
    how OpenMP waits (`WAIT_VARS`).

    After each parallel region torch's OpenMP threads (GNU libgomp in the Linux wheels)
    spin for about 3 ms before they sleep. Beside a busy process that spinning holds the core
    the other process needs, and the run's threads wait for each other. Measured on 2 cores
    beside a busy loop (bench/results/threads.md), MAPPO with 2 threads kept 6% of its speed
    alone spinning and 67% waiting passively. Not the default: alone, waking sleeping threads
    for every parallel region cost the same run half its speed (52%).
    """
    if not enabled or any(var in os.environ for var in WAIT_VARS):
        yield
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        yield
    finally:
        os.environ.pop("OMP_WAIT_POLICY", None)
