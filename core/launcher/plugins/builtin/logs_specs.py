"""Built-in logs_specs plugin (placeholder until implemented)."""
