"""proxy.shared.redact: no secret of a command line or a URL survives, nothing else is touched."""

from __future__ import annotations

import shlex

import pytest

from proxy.shared.redact import MASK, SECRET_FLAGS, redacted_argv, redacted_command, redacted_url


@pytest.mark.parametrize("flag", sorted(SECRET_FLAGS))
def test_every_secret_flag_is_masked_in_both_spellings(flag: str) -> None:
    assert redacted_argv([flag, "s3cret", "--port", "8"]) == [flag, MASK, "--port", "8"]
    assert redacted_argv([f"{flag}=s3cret"]) == [f"{flag}={MASK}"]


def test_an_abbreviated_flag_is_caught_by_the_parsed_value() -> None:
    # argparse accepts `--admin K` for `--admin-key K`: the caller passes what it parsed.
    assert redacted_argv(["--admin", "s3cret", "--out", "x"], secrets=["s3cret"]) == [
        "--admin", MASK, "--out", "x"]
    assert redacted_argv(["--admin=s3cret"], secrets=["s3cret", None]) == [f"--admin={MASK}"]


def test_url_passwords_are_masked_under_any_flag() -> None:
    argv = ["--session-store", "redis://:pw@127.0.0.1:6379/0",
            "--target=http://user:pw@127.0.0.1:8000"]
    assert redacted_argv(argv) == ["--session-store", f"redis://:{MASK}@127.0.0.1:6379/0",
                                   f"--target=http://user:{MASK}@127.0.0.1:8000"]
    assert redacted_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redacted_url("http://[::1") == "http://[::1"  # not a URL: left alone, no crash


def test_a_quoted_command_line_inside_an_argument_is_redacted_too() -> None:
    argv = ["--proxy-args", "--admin-key s3cret --port 9000"]
    assert redacted_argv(argv) == ["--proxy-args", f"--admin-key '{MASK}' --port 9000"]


def test_nothing_else_changes_and_a_short_key_masks_no_other_text() -> None:
    argv = ["ppd", "replay", "--api", "chat", "--dataset", "synthetic:mixed", "--seed", "1"]
    assert redacted_argv(argv, secrets=["1", "a"]) == [*argv[:-1], MASK]
    assert redacted_argv(argv[:-2]) == argv[:-2]


def test_the_command_is_shell_quoted() -> None:
    command = redacted_command(["ppd", "profile", "--admin-key", "k", "--out", "a b.csv"])
    assert shlex.split(command) == ["ppd", "profile", "--admin-key", MASK, "--out", "a b.csv"]
    assert "k" not in shlex.split(command)


def test_a_bad_session_store_url_is_refused_without_its_password() -> None:
    from proxy.config.config_files import ConfigError
    from proxy.config.settings import ProxyConfig

    with pytest.raises(ConfigError) as refused:
        ProxyConfig(session_store="http://:pw0rd@127.0.0.1:6379/0")
    assert "--session-store" in str(refused.value) and "pw0rd" not in str(refused.value)
