"""`ppd`: one console script, one subcommand per tool, each imported only when it runs.

Each subcommand module exposes `main(argv: list[str]) -> int` and builds its own argparse
parser (prog "ppd NAME"), so `ppd proxy` never pays for pandas or vLLM imports.
Errors reach the user as one line on stderr and a non-zero exit; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib import metadata

from proxy.shared.vocabulary import PRODUCT

# name -> ("module:function", one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "proxy": ("proxy.cli:main", "run the PPD routing proxy in front of vLLM P/D servers"),
    "model": ("profiler.models.prepare:main",
              "prepare a local model (tiny | smollm2) without a hub"),
    "cluster": ("profiler.cluster.cli:main",
                "start, inspect or stop a local vLLM P/D cluster"),
    "replay": ("profiler.replay.cli:main", "replay multi-turn traces against a proxy"),
    "profile": ("profiler.profile.cli:main", "measure x=0 vs x=1 per workload cell into a table"),
    "table": ("profiler.tables.cli:main", "show or plot a decision table"),
    "report": ("profiler.replay.report:main", "compare replay runs (tables and plots)"),
    "register": ("proxy.upstream.register:main",
                 "send node heartbeats to a proxy's discovery socket"),
    "demo": ("profiler.profile.demo:main", "end-to-end demo on a local CPU cluster"),
    "sim": ("profiler.planning.cli:main",
            "cluster simulator (run, grid, paper) and its engine model"),
}


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                    argparse.RawDescriptionHelpFormatter):
    """Every command's help: flag defaults shown, description and examples kept as written.

    A default of None or False says nothing ("not set"), so it is left out; a help text that
    already says what its default means (`default:` in it) is left as it is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action) or text


def base_url(text: str) -> str:
    """An argparse type for --target: an http(s) base URL without /v1 (ppd adds the paths)."""
    url = text.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL")
    if url.endswith("/v1"):
        raise argparse.ArgumentTypeError(
            f"{text!r} ends in /v1: give the base URL without it (e.g. {url[:-3]})")
    return url


def version() -> str:
    """`ppd X.Y.Z` of the installed distribution (`unknown` when run from a bare checkout)."""
    try:
        return f"ppd {metadata.version(PRODUCT)}"
    except metadata.PackageNotFoundError:
        return "ppd unknown (not installed; run `make install`)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PRODUCT,
        description="PPD: per-request routing of multi-turn LLM traffic on P/D vLLM clusters.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n"
        + "\n".join(f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items())
        + "\n\nRun `ppd COMMAND --help` for a command's options.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=version())
    parser.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if debug:
        argv.remove("--debug")
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(version())
        return 0
    args = parser.parse_args(argv[:1])
    target, _ = COMMANDS[args.command]
    module_name, function_name = target.split(":")
    try:
        command = getattr(importlib.import_module(module_name), function_name)
        return int(command(argv[1:]) or 0)
    except KeyboardInterrupt:
        print("ppd: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the CLI boundary: one clear line, traceback only on --debug
        if debug:
            raise
        print(f"ppd {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
