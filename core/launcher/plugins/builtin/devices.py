"""Built-in devices plugin (placeholder until implemented)."""
