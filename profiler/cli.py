"""`ppd`: one console script, one subcommand per tool, each imported only when it runs.

Each subcommand module exposes `main(argv: list[str]) -> int` and builds its own argparse
parser (prog "ppd NAME"), so `ppd proxy` never pays for pandas or vLLM imports.
Errors reach the user as one line on stderr and a non-zero exit; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> ("module:function", one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "proxy": ("proxy.cli:main", "run the PPD routing proxy in front of vLLM P/D servers"),
    "model": ("profiler.models.prepare:main",
              "prepare a local model (tiny | smollm2) without a hub"),
    "cluster": ("profiler.cluster.launcher:main",
                "start, inspect or stop a local vLLM P/D cluster"),
    "replay": ("profiler.replay.cli:main", "replay multi-turn traces against a proxy"),
    "profile": ("profiler.profile.cli:main", "measure x=0 vs x=1 per workload cell into a table"),
    "table": ("profiler.tables.cli:main", "show or plot a decision table"),
    "report": ("profiler.report:main", "compare replay runs (tables and plots)"),
    "register": ("proxy.register:main", "send node heartbeats to a proxy's discovery socket"),
    "demo": ("profiler.demo:main", "end-to-end demo on a local CPU cluster"),
    "sim": ("profiler.sim.cli:main", "engine model: cost presets, step times, fit a CPU preset"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppd",
        description="PPD: per-request routing of multi-turn LLM traffic on P/D vLLM clusters.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n"
        + "\n".join(f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items())
        + "\n\nRun `ppd COMMAND --help` for a command's options.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
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
