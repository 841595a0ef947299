"""launcher-nodecheck: health checks a site configures with two variables (see README.md)."""

__version__ = "0.1.0"
