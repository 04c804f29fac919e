"""The README and the docs site: generated pages current, links whole, commands valid."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marlctl.cli import app
from marlctl.envs.registry import lookup

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_the_generated_pages_are_current():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_the_spec_reference_names_every_algorithm_and_section():
    from marlctl.algos import registered_algos

    page = (DOCS / "reference" / "spec.md").read_text()
    for name in registered_algos():
        assert f"### `{name}`" in page
    for section in ("env", "model", "train", "hardware", "tracking", "sweep", "groups"):
        assert f"## `{section}`" in page
    assert "| `hardware.threads_per_run` |" in page


def test_the_readme_is_an_introduction():
    assert len(README.read_text().splitlines()) < 250


def test_every_relative_link_of_the_readme_resolves():
    targets = [t for t in LINK.findall(README.read_text()) if "://" not in t]
    assert len(targets) >= 10
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert missing == []


def test_every_run_command_in_the_docs_validates():
    commands = [
        shlex.split(line.split("#")[0])[2:]
        for page in _pages()
        for line in page.read_text().splitlines()
        if line.startswith(("marlctl run specs/", ".venv/bin/marlctl run specs/"))
    ]
    assert len(commands) >= 5
    runner = CliRunner()
    for command in commands:
        spec, *overrides = command
        result = runner.invoke(app, ["validate", str(ROOT / spec), *overrides])
        assert "Traceback" not in result.output, result.output
        if result.exit_code == 2 and "pip install 'marlctl[meltingpot]'" in result.output:
            assert not lookup("meltingpot/commons_harvest__open").installed, result.output
            continue  # Melting Pot, which CI does not install (docs/environments.md)
        assert result.exit_code == 0, (command, result.output)


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="mkdocs is not installed (the dev extra installs it)")  # fmt: skip
def test_the_site_builds_strictly(tmp_path: Path):
    """Broken links and anchors fail a strict build."""
    mkdocs = Path(sys.executable).parent / "mkdocs"
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "spec" / "index.html").exists()
