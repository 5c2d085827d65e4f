"""`ppd profile`: measure both turn-2 routes per workload cell and write a decision table."""
