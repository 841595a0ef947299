"""Test support for launcher and its plugins (shipped so plugin distributions can use it)."""
