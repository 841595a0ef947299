"""Tests of launcher.devices: device-count providers and --virtual-local-rank."""
