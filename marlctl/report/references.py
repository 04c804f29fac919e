"""The reference a suite's cell is judged against, as its seed runs carry it: `marlctl
reproduce` tags each seed with its suite, its cell and the cell's reference already translated
to marlctl's conventions (`tracking.REFERENCE_TAG`, JSON), so a report reads a suite's runs
like any other and still knows what each should reproduce."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

# What of a run's evaluations a reference's value is (`reproduction.seed_values`).
STATISTICS = ("final", "maximum", "average")


@dataclass(frozen=True)
class Point:
    """A reference point of a cell: the score of a policy that does not learn, in the
    cell's metric (`marlctl.reproduce.points`)."""

    name: str
    value: float
    player: str  # random, or the scripted policy's package.module:callable

    @property
    def described(self) -> str:
        if self.player == "random":
            return "uniformly random actions"
        return f"scripted policy {self.player}"


@dataclass(frozen=True)
class CellReference:
    suite: str
    cell: str
    metric: str  # marlctl's metric the reference compares to
    low: float  # the reference's interval; a point where low == high
    high: float
    budget: int  # env steps the reference trained, in marlctl's count
    kind: str  # paper | peer | baseline (marlctl's own earlier result)
    source: str  # the citation
    statistic: str = "final"  # final | maximum | average (`reproduction.seed_values`)
    points: tuple[Point, ...] = ()

    @property
    def value(self) -> float:
        return (self.low + self.high) / 2

    @property
    def baseline(self) -> bool:
        return self.kind == "baseline"

    @property
    def interval_text(self) -> str:
        if self.low == self.high:
            return f"{self.low:.2f}"
        return f"[{self.low:.2f}, {self.high:.2f}]"

    def to_tag(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_tag(cls, text: str | None) -> CellReference | None:
        """The reference a tag holds, or None where it holds none a report can use (a run of
        an older version, a tag edited by hand)."""
        if not text:
            return None
        try:
            data = json.loads(text)
            points = [
                Point(str(p["name"]), float(p["value"]), str(p["player"]))
                for p in data.get("points", ())
            ]
            found = cls(
                suite=str(data["suite"]),
                cell=str(data["cell"]),
                metric=str(data["metric"]),
                low=float(data["low"]),
                high=float(data["high"]),
                budget=int(data["budget"]),
                kind=str(data["kind"]),
                source=str(data["source"]),
                statistic=str(data.get("statistic", "final")),
                # A point edited by hand into a number that is not finite: left out.
                points=tuple(p for p in points if math.isfinite(p.value)),
            )
        except (ValueError, KeyError, TypeError):
            return None
        if not (math.isfinite(found.low) and math.isfinite(found.high)) or found.low > found.high:
            return None
        if found.statistic not in STATISTICS:
            return None
        return found
