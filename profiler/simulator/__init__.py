"""The cluster simulator: a whole P/D cluster and the proxy's own routing on a virtual clock.

virtual_cluster.py (the event loop over engine models and links), sim_proxy.py (the proxy's
turn decision, session ledger, pool and load meter driven by that clock), layout.py and workload.py
(what is simulated), run.py (a run and its outputs), grid.py (many runs), paper.py,
paper_figures.py and paper_report.py (the PPD paper's tables), flags.py and cli.py (`ppd sim`).
See docs/simulator.md.
"""
