"""Built-in event_handlers plugin (placeholder until implemented)."""
