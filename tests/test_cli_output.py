"""What the commands print keeps what a user copies whole: env ids, presets and run ids, at
any terminal width; piped, a listing is one plain line per row."""

from __future__ import annotations

import io
import subprocess
import sys

from rich.console import Console
from typer.testing import CliRunner

from marlctl.cli import app, output
from marlctl.envs.registry import preset_name, registered_ids

runner = CliRunner()


def test_piped_list_of_envs_is_one_plain_line_per_env():
    done = subprocess.run(
        [sys.executable, "-m", "marlctl", "list", "envs"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    ids = registered_ids()
    assert [line.split("\t")[0] for line in lines] == ids
    assert [line.split("\t")[3] for line in lines] == [preset_name(i) for i in ids]
    assert "mpe/simple_spread" in [line.split("\t")[0] for line in lines if "spread" in line]
    assert not any(c in done.stdout for c in "│┃━…")


def _terminal(monkeypatch, width: int) -> io.StringIO:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=True, color_system=None)
    monkeypatch.setattr(output, "out", console)
    return buffer


def test_an_80_column_terminal_shows_every_env_id_and_preset_whole(monkeypatch):
    buffer = _terminal(monkeypatch, 80)
    result = runner.invoke(app, ["list", "envs"])
    assert result.exit_code == 0, result.output
    text = buffer.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    words = set(text.split())
    for env_id in registered_ids():
        assert env_id in words, env_id
        assert f"envs={preset_name(env_id)}" in words, env_id
    assert "…" not in text


def test_a_wide_terminal_shows_one_row_per_env(monkeypatch):
    buffer = _terminal(monkeypatch, 330)  # wider than the longest row (Melting Pot ids)
    result = runner.invoke(app, ["list", "envs"])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in buffer.getvalue().splitlines()
            if line.startswith("│")}  # fmt: skip
    assert set(registered_ids()) <= set(rows)
    assert "simple_spread" in rows["mpe/simple_spread"]


def test_a_table_keeps_its_run_ids_whole_in_a_narrow_terminal(monkeypatch):
    from rich.table import Table

    buffer = _terminal(monkeypatch, 60)
    table = Table("seed", "backend", "episodes", "eval return", "groups", "run")
    run_id = "0123456789abcdef0123456789abcdef"
    table.add_row("0", "pettingzoo", "32", "-14.20", "agent -14.20, adversary 3.10", run_id)
    output.print_table(table, whole=("run",))
    assert run_id in buffer.getvalue()
