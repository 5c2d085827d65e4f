"""ppd's benchmarks (`make bench`): speed and overhead, printed as tables, never asserted."""
