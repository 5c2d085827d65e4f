"""proxy.live.predict."""
