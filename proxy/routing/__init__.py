"""proxy.routing."""
