"""Every `ppd` command: --version, and --help with defaults and an example."""

from __future__ import annotations

import re

import pytest

from profiler.cli import COMMANDS, main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert re.fullmatch(r"ppd \S+\n", capsys.readouterr().out)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_help_has_an_example_and_defaults(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    # An example: a command line of its own (indented), not the usage line.
    assert re.search(rf"^\s+ppd {command}\b", text, flags=re.MULTILINE), \
        f"`ppd {command} --help` has no example"


@pytest.mark.parametrize("argv", [["cluster", "up", "--help"], ["replay", "--help"],
                                  ["proxy", "--help"], ["table", "plot", "--help"]])
def test_flags_show_their_defaults(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    text = capsys.readouterr().out
    assert text.count("(default:") >= 2, text


@pytest.mark.parametrize("command", ["replay", "profile"])
def test_a_target_ending_in_v1_is_refused_with_the_fix(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--target", "http://127.0.0.1:8000/v1", "--out", "x.csv",
              "--dataset", "synthetic:mixed", "--conversation-rate", "1", "--duration", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "ends in /v1" in err and "http://127.0.0.1:8000)" in err


def test_sim_help_lists_every_subcommand_with_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from profiler.simulator.cli import build_parser

    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["sim", "--help"])
    lines = capsys.readouterr().out.splitlines()
    [actions] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in actions._choices_actions}
    assert {"run", "grid", "paper"} <= set(helps)
    for name, text in helps.items():
        # The whole help on the name's own line: not wrapped onto a second one.
        assert any(re.fullmatch(rf"\s+{name}\s+{re.escape(str(text))}", line)
                   for line in lines), f"`ppd sim --help` has no one-line entry for {name}"
    main(["--help"])
    assert re.search(r"^\s+sim\s+cluster simulator", capsys.readouterr().out, flags=re.M)
