"""proxy.observability."""
