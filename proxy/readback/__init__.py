"""proxy.readback.protocol."""
