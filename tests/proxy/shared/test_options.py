"""The option table: every config field declared once yields a flag, a config key and a help
default that matches the dataclass default."""

from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.config.policy_config import PolicyConfig
from proxy.config.settings import ProxyConfig, build_parser, config_from_args
from proxy.shared.options import add_flags, option, option_fields


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Sample:
    size: int = option(3, "how many", metavar="N")
    ratio: float | None = option(None, "a share")
    color: Color = option(Color.RED, "which colour", flag="colour")
    path: Path | None = option(None, "a file")
    loud: bool = option(False, "shout")
    internal: str = "not an option"


def test_option_fields_convert_by_annotation() -> None:
    opts = {o.name: o for o in option_fields(Sample)}
    assert set(opts) == {"size", "ratio", "color", "path", "loud"}
    assert opts["size"].convert("7") == 7
    assert opts["ratio"].convert("0.5") == 0.5
    assert opts["color"].key == "colour" and opts["color"].choices == ("red", "blue")
    assert opts["path"].convert("a/b") == Path("a/b")


def test_flags_show_the_real_default_and_parse() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser, Sample)
    text = parser.format_help()
    assert "how many (default: 3)" in text and "which colour (default: red)" in text
    args = parser.parse_args(["--size", "5", "--colour", "blue", "--loud"])
    assert (args.size, args.colour, args.loud, args.ratio) == (5, Color.BLUE, True, None)


@pytest.mark.parametrize("cls", [PolicyConfig, ProxyConfig])
def test_every_proxy_option_is_a_flag_with_its_default_in_the_help(cls: type) -> None:
    help_text = " ".join(build_parser().format_help().split())
    for opt in option_fields(cls):
        assert opt.flag in help_text
        shown = "none" if opt.default is None else getattr(opt.default, "value", opt.default)
        if opt.convert is bool:  # --x/--no-x flags say on or off
            shown = "on" if opt.default else "off"
        assert f"(default: {shown})" in help_text


def test_every_option_is_a_config_file_key(tmp_path: Path) -> None:
    # One file setting every scalar option: each key must be accepted and land in the config.
    lines = ["prefill: http://p:1", "decode: http://d:1", "policy: fixed", "x: 0.25",
             "w_tpot: 2.5", "max-sessions: 7", "session_ttl: 9", "api_key: k"]
    path = tmp_path / "proxy.yaml"
    path.write_text("\n".join(lines))
    config = config_from_args(["--config", str(path), "--w-tpot", "3"])
    assert config.policy.x == 0.25 and config.policy.w_tpot == 3.0  # the flag wins
    assert (config.max_sessions, config.session_ttl, config.api_key) == (7, 9.0, "k")
