"""The `sluice` CLI: help works for the program and for every command that is built."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.ctl import main as cli
from tests.support.procs import REPO, sluice_argv


def built(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def test_sluice_help_lists_every_command() -> None:
    script = Path(sys.executable).parent / "sluice"
    for argv in ([str(script), "--help"], sluice_argv("--help")):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
        assert r.returncode == 0, r.stderr
        for name in cli.COMMANDS:
            assert name in r.stdout


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_command_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`sluice <cmd> --help` exits 0 for a built command; an unbuilt one says so and exits 2."""
    module, help_text = cli.COMMANDS[command]
    if built(module):
        with pytest.raises(SystemExit) as e:
            cli.main([command, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert f"sluice {command}" in out and help_text in out
    else:
        assert cli.main([command]) == 2
        assert "not part of this build yet" in capsys.readouterr().err


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["no-such-command"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
