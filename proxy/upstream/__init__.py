"""proxy.upstream."""
