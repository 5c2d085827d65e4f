"""--kv-events values and cluster.json kv_events keys."""

from __future__ import annotations

import pytest

from proxy.config.config_files import ConfigError
from proxy.config.settings import config_from_args
from proxy.live.kv_sources import KvSourceError, parse_flag


def test_flag_with_and_without_replay_and_wildcard_host() -> None:
    source = parse_flag("http://10.0.0.5:8200/=tcp://*:5557,tcp://10.0.0.5:5558")
    assert (source.url, source.endpoint, source.replay) == (
        "http://10.0.0.5:8200", "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558")
    assert parse_flag("http://h:1=tcp://h:2").replay is None


@pytest.mark.parametrize("value", ["tcp://h:1", "http://h:1=", "http://h:1=h:2",
                                   "http://h:1=tcp://h:x", "http://h:1=tcp://h:1,tcp://h:2,tcp://h:3"])
def test_bad_flags_are_clear_errors(value: str) -> None:
    with pytest.raises(KvSourceError):
        parse_flag(value)


def test_proxy_flag_reaches_the_config() -> None:
    config = config_from_args(["--prefill", "http://p:1", "--decode", "http://d:2",
                               "--kv-events", "http://d:2=tcp://d:3"])
    assert [s.endpoint for s in config.kv_events] == ["tcp://d:3"]
    with pytest.raises(ConfigError, match="--kv-events"):
        config_from_args(["--prefill", "http://p:1", "--decode", "http://d:2",
                          "--kv-events", "nonsense"])
