"""Published results as suites: named cells, each a spec with the reference result it should
reproduce and the conventions that reference was measured under (`suite`), the reference
translated to marlctl's metrics or refused with the reason (`conventions`), each cell trained
and judged (`runner`, by `report.reproduction`'s verdict) or its cost estimated (`estimate`)."""

from marlctl.reproduce.conventions import Refused, Translated, translate
from marlctl.reproduce.suite import Cell, Reference, Suite, load_suite

__all__ = [
    "Cell",
    "Reference",
    "Refused",
    "Suite",
    "Translated",
    "load_suite",
    "translate",
]
