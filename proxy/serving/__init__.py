"""proxy.serving."""
