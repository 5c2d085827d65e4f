"""proxy.shared."""
