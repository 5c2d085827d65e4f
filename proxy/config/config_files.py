"""Reading the operator's files (--config YAML/TOML, --cluster JSON) within bounds.

An operator's file is trusted to say what the operator means, not to be well-formed: a
hand-edited or generated file may be huge, not UTF-8, or a YAML "alias bomb" (anchors that
expand a small file to gigabytes: one ran 17 s and ended in an empty `error:`). Each is
refused with a message that names the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# A config file is a few dozen lines, a cluster.json a few hundred.
MAX_CONFIG_FILE_BYTES = 1024 * 1024


class ConfigError(ValueError):
    """The configuration is invalid; the message says what to fix."""


def read_bounded(path: Path, what: str) -> str:
    """A config or cluster file's text, refused past MAX_CONFIG_FILE_BYTES or not UTF-8."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} file {path}: {exc.strerror or exc}") from exc
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise ConfigError(f"{what} file {path} is over {MAX_CONFIG_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} file {path} is not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start})") from None


def load_yaml(text: str, path: Path) -> Any:
    """safe_load, refusing anchors and aliases before anything is built from them."""
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise ConfigError(f"config file {path} uses YAML anchors or aliases (&name, "
                              "*name), which no setting needs; write the values out")
    return yaml.safe_load(text)
