"""A YAML grid file: each key's type checked, every error naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.cli import main as ppd
from profiler.profile.grid import grid_from_mapping, read_grid_file
from proxy.shared.discretize import ContextClass


def grid_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    return path


def test_a_bare_value_is_a_one_point_axis(tmp_path: Path) -> None:
    values = read_grid_file(grid_file(tmp_path, "qps: 1\ncontexts: small\nworkloads: tiny\n"))
    grid = grid_from_mapping(values)
    assert grid.qps == (1.0,)
    assert grid.contexts == (ContextClass.SMALL,)
    assert grid.workloads == ("tiny",)


@pytest.mark.parametrize(("text", "message"), [
    ("qps: fast\n", "`qps` must be a list of numbers (got 'fast')"),
    ("contexts: 5\n", "`contexts` must be a list of context class names (got 5)"),
    ("qps: [1, yes]\n", "`qps` must be a list of numbers (got [1, True])"),
    ("duration_s: abc\n", "`duration_s` must be a number of seconds (got 'abc')"),
    ("warmup_conversations: 1.5\n", "`warmup_conversations` must be a whole number (got 1.5)"),
    ("max_conversations: 0\n", "`max_conversations` must be a whole number >= 1"),
])
def test_a_key_of_the_wrong_type_is_refused_whole(tmp_path: Path, text: str,
                                                 message: str) -> None:
    # a list key is never iterated char by char: no "could not convert 'f'", no "unknown
    # context 's'"
    path = grid_file(tmp_path, text)
    with pytest.raises(ValueError) as error:
        read_grid_file(path)
    assert str(error.value).startswith(f"{path}: {message}")


def test_broken_yaml_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = grid_file(tmp_path, "qps: [1, 2\nduration_s: 3\n")
    with pytest.raises(ValueError) as error:
        read_grid_file(path)
    assert str(error.value).startswith(f"{path}: not valid YAML (")
    assert "line 2" in str(error.value) and "<unicode string>" not in str(error.value)


def test_profile_refuses_a_bad_grid_file_with_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = grid_file(tmp_path, "qps: 1\ncontexts: 5\n")
    assert ppd(["profile", "--backend", "sim", "--layout", "1P1D", "--out",
                str(tmp_path / "t.csv"), "--grid", str(path), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err == (f"ppd profile: error: {path}: `contexts` must be a list of context class "
                   "names (got 5)\n")
