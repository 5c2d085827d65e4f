"""Issue #45, failure 15 (operator files): a YAML alias bomb in --config and a CR/LF in a
cluster.json URL are refused at once, in words that name the file."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from proxy.config.config_files import MAX_CONFIG_FILE_BYTES, ConfigError
from proxy.config.settings import config_from_args

BOMB = """\
a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
prefill: [*f,*f,*f,*f,*f,*f,*f,*f,*f]
"""


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    started = time.perf_counter()
    with pytest.raises(ConfigError, match="anchors or aliases") as refused:
        config_from_args(["--config", str(path)])
    assert time.perf_counter() - started < 1.0
    assert str(path) in str(refused.value)


def test_a_huge_config_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * MAX_CONFIG_FILE_BYTES + "\n")
    with pytest.raises(ConfigError, match="over"):
        config_from_args(["--config", str(path)])


@pytest.mark.parametrize("url", ["http://a:1\r\nX-Evil: y", "http://a:1/\x00", "http://a b:1"])
def test_a_control_character_in_a_cluster_url_is_named(tmp_path: Path, url: str) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"nodes": [{"role": "prefill", "url": url},
                                          {"role": "decode", "url": "http://b:2"}]}))
    with pytest.raises(ConfigError, match="control character") as refused:
        config_from_args(["--cluster", str(path)])
    assert str(path) in str(refused.value)


def test_a_bad_limit_flag_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--max-messages"):
        config_from_args(["--prefill", "http://a:1", "--decode", "http://b:2",
                          "--max-messages", "0"])
