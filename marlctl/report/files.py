"""Report files are written whole or not at all: a temporary file, then a rename; figure files
go to a fresh folder that replaces the old one only once every figure is drawn."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from marlctl.atomic import replacing
from marlctl.report import figures
from marlctl.report.document import Block, Figure, blocks
from marlctl.report.model import Report

_DRAW = {
    "curves": figures.curves_file,
    "history": figures.history_file,
    "importances": figures.importances_file,
    "profile": figures.profile_file,
    "schedules": figures.schedules_file,
}


def write_atomic(path: Path, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


Compose = Callable[[list[Block], dict[str, str]], str]


def draw(document: list[Block], folder: Path, kind: str) -> dict[str, Path]:
    """Every figure of the document drawn into `folder` as `kind` files, by key."""
    found = [b for b in document if isinstance(b, Figure)]
    return {f.key: _DRAW[f.plot](f.source, folder / f"{f.key}.{kind}") for f in found}


def with_figures(
    report: Report, out: Path, folder: Path, kind: str, compose: Compose
) -> list[Path]:
    """Draw the report's figures, then write `out` as `compose(document, links)`: the
    report's blocks, built once, and each figure's path relative to `out`. The figures go to
    a fresh folder that replaces `folder` only once all are drawn, so a failed report leaves
    the previous one whole."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{folder.name}."))
    try:
        document = blocks(report)
        drawn = draw(document, staging, kind)
        links = {key: f"{folder.name}/{path.name}" for key, path in drawn.items()}
        text = compose(document, links)
        if folder.exists():
            shutil.rmtree(folder)
        if drawn:
            staging.chmod(0o755)
            staging.rename(folder)
        write_atomic(out, text)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [out, *(folder / path.name for path in drawn.values())]
