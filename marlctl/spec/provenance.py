"""Where each value of a composed spec came from, and the problems placed there."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marlctl.errors import Problem
from marlctl.spec.models import Spec
from marlctl.spec.source import SourceFile

PRESET_GROUPS = ("algos", "envs", "models", "sweeps")
OVERRIDES = "<overrides>"


@dataclass
class Provenance:
    """Where each value came from, to place an error on the right file and line."""

    spec: SourceFile
    presets: list[SourceFile] = field(default_factory=list)
    overrides: list[tuple[str, str, int]] = field(default_factory=list)  # key, text, position
    failed: list[Problem] = field(default_factory=list)  # overrides that could not apply

    def locate(self, dotted: str) -> tuple[str, int | None]:
        for key, _, position in reversed(self.overrides):
            if dotted == key or dotted.startswith(key + ".") or key.startswith(dotted + "."):
                return OVERRIDES, position
        if self.spec.defines(dotted):
            return str(self.spec.path), self.spec.line_of(dotted)
        for preset in self.presets:
            if preset.defines(dotted):
                return str(preset.path), preset.line_of(dotted)
        return str(self.spec.path), self.spec.line_of(dotted) or 1

    def problem(self, dotted: str, message: str) -> Problem:
        file, line = self.locate(dotted)
        return Problem(file, line, dotted, message)


@dataclass
class LoadedSpec:
    spec: Spec
    resolved: dict[str, Any]  # the composed, validated spec as plain data (defaults filled in)
    provenance: Provenance
    notes: list[str] = field(default_factory=list)  # what composition changed, one line each

    @property
    def experiment(self) -> str:
        return self.spec.name or self.provenance.spec.path.stem


def preset_roots() -> list[Path]:
    """Folders holding `algos/`, `envs/`, `models/`, `sweeps/`: the working dir and the installed
    presets."""
    here = Path(__file__).resolve().parent.parent
    candidates = [Path.cwd(), here / "presets", here.parent]
    roots: list[Path] = []
    for root in candidates:
        if any((root / g).is_dir() for g in PRESET_GROUPS) and root.resolve() not in roots:
            roots.append(root.resolve())
    return roots


def sort_problems(problems: list[Problem]) -> list[Problem]:
    """The spec file's problems first, by line; then presets; command-line overrides last."""
    return sorted(problems, key=lambda p: (p.file == OVERRIDES, p.file, p.line or 0))
