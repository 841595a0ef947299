"""Plugins that ship with the core; each registers through the core distribution's entry points."""
