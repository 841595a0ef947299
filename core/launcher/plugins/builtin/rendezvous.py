"""Built-in rendezvous plugin (placeholder until implemented)."""
