"""Configuration: flags, config files, cluster files, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.config.config_files import ConfigError
from proxy.config.policy_config import Policy
from proxy.config.settings import config_from_args
from proxy.policies import registry
from proxy.shared.vocabulary import Role

NODES = ["--prefill", "http://127.0.0.1:8100", "--decode", "http://127.0.0.1:8200"]


def test_defaults_and_flags() -> None:
    config = config_from_args(NODES)
    assert (config.host, config.port, config.policy.kind) == ("127.0.0.1", 8000, Policy.PD)
    assert [(n.role, n.url) for n in config.nodes] == [
        (Role.PREFILL, "http://127.0.0.1:8100"), (Role.DECODE, "http://127.0.0.1:8200")]
    config = config_from_args([*NODES, "--policy", "fixed", "--x", "0.25", "--port", "9000",
                               "--session-ttl", "60", "--max-sessions", "5"])
    assert (config.policy.kind, config.policy.x, config.port) == (Policy.FIXED, 0.25, 9000)
    assert (config.session_ttl, config.max_sessions) == (60, 5)


def test_yaml_config_file_then_flags_override(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text("policy: threshold\nnon-cached-tokens: 128\nport: 9100\n"
                    "prefill: [http://p:1]\ndecode: http://d:1\ntokenizer: tok\n")
    config = config_from_args(["--config", str(path), "--port", "9200"])
    assert config.policy.kind is Policy.THRESHOLD and config.policy.non_cached_tokens == 128
    assert config.port == 9200
    assert config.tokenizer == tmp_path / "tok"  # relative to the config file
    assert {n.url for n in config.nodes} == {"http://p:1", "http://d:1"}


def test_toml_config_file(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text('policy = "replica"\nreplica = ["http://r:1", "http://r:2"]\n')
    config = config_from_args(["--config", str(path)])
    assert config.policy.kind is Policy.REPLICA and len(config.nodes) == 2


def test_cluster_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"model": "m", "layout": "1P1D", "nodes": [
        {"role": "prefill", "url": "http://127.0.0.1:8100", "pid": 1, "log": "x"},
        {"role": "decode", "url": "http://127.0.0.1:8200", "pid": 2, "log": "y"}]}))
    config = config_from_args(["--cluster", str(path), "--decode", "http://127.0.0.1:8200"])
    assert [n.role for n in config.nodes] == [Role.PREFILL, Role.DECODE]  # duplicates merged


def test_cluster_file_readback_ttl_unless_a_flag_says_otherwise(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    nodes = [{"role": "prefill", "url": "http://p:1"}, {"role": "decode", "url": "http://d:1"}]
    path.write_text(json.dumps({"kv_readback_ttl_s": 480, "nodes": nodes}))
    assert config_from_args(["--cluster", str(path)]).kv_readback_ttl == 480.0
    assert config_from_args(["--cluster", str(path), "--kv-readback-ttl", "30"]
                            ).kv_readback_ttl == 30.0
    path.write_text(json.dumps({"kv_readback_ttl_s": None, "nodes": nodes}))
    assert config_from_args(["--cluster", str(path)]).kv_readback_ttl is None
    path.write_text(json.dumps({"kv_readback_ttl_s": "soon", "nodes": nodes}))
    with pytest.raises(ConfigError, match="kv_readback_ttl_s"):
        config_from_args(["--cluster", str(path)])


@pytest.mark.parametrize(("argv", "fragment"), [
    ([], "no route can be served"),
    (["--decode", "http://d:1"], "no route can be served"),
    ([*NODES, "--policy", "replica"], "--replica"),
    ([*NODES, "--policy", "fixed"], "needs --x"),
    ([*NODES, "--policy", "fixed", "--x", "1.5"], r"\[0, 1\]"),
    ([*NODES, "--policy", "ppd"], "needs --table"),
    ([*NODES, "--policy", "threshold"], "--non-cached-tokens"),
    ([*NODES, "--w-ttft", "-1"], "w-ttft"),
    (["--prefill", "p:1", "--decode", "http://d:1"], "http://"),
    (["--prefill", "http://x:1", "--decode", "http://x:1"], "two roles"),
    ([*NODES, "--discovery", "127.0.0.1:5555"], "tcp://"),
    ([*NODES, "--max-sessions", "0"], "max-sessions"),
    ([*NODES, "--kv-readback-ttl", "0"], "kv-readback-ttl"),
])
def test_invalid_configurations(argv: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        config_from_args(argv)


def test_discovery_alone_is_enough() -> None:
    assert config_from_args(["--discovery", "tcp://127.0.0.1:0", "--discovery-token", "T"]
                            ).discovery == "tcp://127.0.0.1:0"


def test_unknown_config_keys_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("polcy: pd\n")
    with pytest.raises(ConfigError, match="unknown key 'polcy'"):
        config_from_args(["--config", str(path), *NODES])


@pytest.mark.parametrize(("name", "text", "fragment"), [
    ("c.yaml", "port: [1", "not valid"),
    ("c.toml", "port = ", "not valid"),
    ("c.yaml", "- a\n- b\n", "mapping"),
    ("c.yaml", "port: abc\n", "bad value"),
    ("c.yaml", "policy: fastest\n", r"unknown policy 'fastest'.*policy names: .*local.*pd"),
    ("c.yaml", "policy: lcoal\n", "did you mean local"),
])
def test_bad_config_files(tmp_path: Path, name: str, text: str, fragment: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=fragment):
        config_from_args(["--config", str(path), *NODES])


def test_missing_files_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        config_from_args(["--config", str(tmp_path / "none.yaml"), *NODES])
    with pytest.raises(ConfigError, match="cannot read cluster file"):
        config_from_args(["--cluster", str(tmp_path / "none.json")])
    (tmp_path / "bad.json").write_text('{"nodes": [{"role": "boss", "url": "http://x"}]}')
    with pytest.raises(ConfigError, match="bad node"):
        config_from_args(["--cluster", str(tmp_path / "bad.json")])


def test_breaker_flags_reach_the_pool() -> None:
    from proxy import create_app

    config = config_from_args(["--prefill", "http://p:1", "--decode", "http://d:1",
                               "--breaker-failures", "5", "--breaker-cooldown", "2.5"])
    pool = create_app(config).extensions["ppd"].pool
    assert (pool.breaker.failures, pool.breaker.cooldown_s) == (5, 2.5)
    with pytest.raises(ConfigError, match="breaker-failures"):
        config_from_args(["--prefill", "http://p:1", "--decode", "http://d:1",
                          "--breaker-failures", "0"])


def test_a_misspelt_policy_flag_names_the_likely_one_and_every_valid_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config_from_args([*NODES, "--policy", "lcoal"])
    err = capsys.readouterr().err
    assert "unknown policy 'lcoal': did you mean local" in err
    assert f"policy names: {', '.join(registry.names())})" in err
    with pytest.raises(ConfigError, match="did you mean local"):  # a caller's check raises
        config_from_args([*NODES, "--policy", "lcoal"], exit_on_error=False)


def _cluster_file(tmp_path: Path, **doc: object) -> Path:
    path = tmp_path / "cluster.json"
    nodes = [{"role": "prefill", "url": "http://127.0.0.1:8100"},
             {"role": "decode", "url": "http://127.0.0.1:8101"}]
    path.write_text(json.dumps({"nodes": nodes, **doc}))
    return path


def test_live_without_a_cost_file_names_the_command_for_its_cluster(tmp_path: Path) -> None:
    emulated = _cluster_file(tmp_path, model="llama-3.1-8b", emulated={
        "preset": "h100:llama-3.1-8b", "cost": "h100:llama-3.1-8b", "link": "rdma-400g"})
    with pytest.raises(ConfigError, match=r"`ppd sim live-costs --cost h100:llama-3.1-8b "
                       r"--model llama-3.1-8b --link rdma-400g --out live-costs.json`"):
        config_from_args(["--cluster", str(emulated), "--policy", "live"])
    tiny = _cluster_file(tmp_path, model="tiny")
    with pytest.raises(ConfigError, match="shipped tables/tiny-cpu-1p1d.costs.json"):
        config_from_args(["--cluster", str(tiny), "--policy", "live"])
    with pytest.raises(ConfigError, match="ppd sim calibrate"):  # nodes of unknown make
        config_from_args([*NODES, "--policy", "live"])
