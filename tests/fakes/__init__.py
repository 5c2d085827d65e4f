"""In-process fakes that stand in for external servers in tests (never imported by product code)."""
