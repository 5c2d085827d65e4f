"""One declaration per option: a dataclass field carries its default, help and flag.

The config dataclasses (proxy/config/settings.py) declare each setting once with `option(...)`. From
those fields come the command-line flags (`add_flags`), the keys a config file may hold
(`option_fields`) and the converters for both - the way vLLM builds its CLI from
`EngineArgs`. A flag's help always shows the field's real default, so help and behaviour
cannot drift apart.
"""

from __future__ import annotations

import argparse
import enum
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from proxy.shared.suggest import unknown_name

# Field metadata keys.
_HELP = "ppd_help"
_FLAG = "ppd_flag"
_METAVAR = "ppd_metavar"
_PARSE = "ppd_parse"


def option(default: Any, help: str, *, flag: str | None = None,  # noqa: A002 - argparse's name
           metavar: str | None = None, parse: Callable[[str], Any] | None = None) -> Any:
    """A config field that is also a flag (`--NAME`, or `--FLAG`) and a config-file key.

    parse: how a flag or config value becomes the field's type (default: from its type hint;
    an enum's unknown names get "did you mean" and the valid list)."""
    return field(default=default, metadata={_HELP: help, _FLAG: flag, _METAVAR: metavar,
                                            _PARSE: parse})


@dataclass(frozen=True, slots=True)
class OptionField:
    """One option as the CLI and config file see it."""

    name: str  # the dataclass field
    key: str  # the flag / config key, underscored (`policy` for PolicyConfig.kind)
    convert: Callable[[Any], Any]
    help: str
    metavar: str | None
    default: Any
    choices: tuple[str, ...] | None

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")


def option_fields(cls: type) -> Iterator[OptionField]:
    """The options a config dataclass declares with `option(...)`."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if _HELP not in f.metadata:
            continue
        hint = _converter(hints[f.name])
        enum_cls = hint if isinstance(hint, type) and issubclass(hint, enum.Enum) else None
        choices = tuple(m.value for m in enum_cls) if enum_cls is not None else None
        convert = f.metadata.get(_PARSE) or (_enum_parser(enum_cls, f.metadata[_FLAG] or f.name)
                                             if enum_cls is not None else hint)
        yield OptionField(f.name, f.metadata[_FLAG] or f.name, convert, f.metadata[_HELP],
                          f.metadata[_METAVAR], _default(f), choices)


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add one flag per option of `cls`; flags default to None so a config file can fill in."""
    for opt in option_fields(cls):
        shown = "none" if opt.default is None else getattr(opt.default, "value", opt.default)
        if opt.convert is bool:
            parser.add_argument(opt.flag, dest=opt.key, action=argparse.BooleanOptionalAction,
                                help=f"{opt.help} (default: {'on' if opt.default else 'off'})")
            continue
        parser.add_argument(opt.flag, dest=opt.key, type=_flag_type(opt.convert),
                            choices=opt.choices,
                            metavar=None if opt.choices else opt.metavar,
                            help=f"{opt.help} (default: {shown})")


def _flag_type(convert: Callable[[Any], Any]) -> Callable[[str], Any]:
    """convert as an argparse type: its ValueError's message becomes the usage error (argparse
    would otherwise say only "invalid value")."""
    if isinstance(convert, type):
        return convert  # int, float, Path: argparse's own message names the type

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def _enum_parser(cls: type[enum.Enum], what: str) -> Callable[[Any], Any]:
    """An enum from its value; an unknown one is a ValueError naming the close and valid ones."""
    def parse(value: Any) -> Any:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(unknown_name(what.replace("_", "-"), str(value),
                                          [str(m.value) for m in cls])) from None

    parse.__name__ = what
    return parse


def _default(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def _converter(hint: Any) -> Callable[[Any], Any]:
    """`float | None` -> float; enums and Path convert from their string form.

    bool converts with `bool()`: config files hold real booleans (YAML/TOML), flags are
    `--x/--no-x`.
    """
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"an option must have one type besides None, not {hint}")
        hint = args[0]
    if hint in (str, int, float, bool, Path) or (
            isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return typing.cast(Callable[[Any], Any], hint)
    raise TypeError(f"no converter for option type {hint}")
