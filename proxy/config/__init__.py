"""proxy.config.settings."""
