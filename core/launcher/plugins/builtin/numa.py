"""Built-in numa plugin (placeholder until implemented)."""
