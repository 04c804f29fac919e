"""Published results as suites: named cells, each a spec with the reference result it should
reproduce and the conventions that reference was measured under (`suite`), the reference
translated to marlctl's metrics or refused with the reason (`conventions`), and a verdict per
cell (`verdict`)."""

from marlctl.reproduce.conventions import Refused, Translated, translate
from marlctl.reproduce.suite import Cell, Reference, Suite, load_suite
from marlctl.reproduce.verdict import Verdict, decide

__all__ = [
    "Cell",
    "Reference",
    "Refused",
    "Suite",
    "Translated",
    "Verdict",
    "decide",
    "load_suite",
    "translate",
]
