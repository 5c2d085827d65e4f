"""ppd's online router (filled in by the proxy issue)."""
