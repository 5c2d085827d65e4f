"""The proxy under test, in its own process: `ppd proxy` exactly, or with another stack.

    python -m benchmarks.proxy_overhead.proxy_process --stack default -- --prefill URL ...

`default` runs `proxy.cli.main` (what `ppd proxy` runs); the other stacks serve the same app
with a chosen upstream transport and ASGI server, so the parts can be compared in one run.
"""

from __future__ import annotations

import argparse
import sys

STACKS = ("default",)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stack", choices=STACKS, default="default")
    parser.add_argument("proxy_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    proxy_args = [a for a in args.proxy_args if a != "--"]
    from proxy.cli import main as proxy_main

    return proxy_main(proxy_args)


if __name__ == "__main__":
    sys.exit(main())
