"""Questions answered with the simulator: `ppd sim plan` (which layout and policy for N GPUs, a
model and a traffic; plan_*.py) and `ppd sim compare` (every routing policy on a timed
production trace against the SLO; compare*.py).

A layer above the simulator and the profiler: both build decision tables by profiling on the
simulator (`profiler.profile.on_simulator`), so they import the two, and neither imports
them. Their commands join `ppd sim`'s through `profiler.planning.cli`.
"""
