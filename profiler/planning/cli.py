"""`ppd sim plan` and `ppd sim compare` join `ppd sim`'s commands: `ppd sim` starts here, and
hands every other command to the simulator's command line (`profiler.simulator.cli`)."""

from __future__ import annotations

from profiler.simulator import cli as simulator_cli


def plan_main(argv: list[str]) -> int:
    from profiler.planning.plan_cli import main

    return main(argv)


def compare_main(argv: list[str]) -> int:
    from profiler.planning.compare import main

    return main(argv)


PLANNING_COMMANDS: simulator_cli.Commands = {
    "plan": ("a layout and policy for N GPUs and a traffic", plan_main),
    "compare": ("every policy on a timed trace, SLO verdict", compare_main),
}


def main(argv: list[str]) -> int:
    """`ppd sim COMMAND`, every command included."""
    return simulator_cli.main(argv, PLANNING_COMMANDS)
