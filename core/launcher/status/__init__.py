"""Seeing a running job: ``launcher status``.

The agent side is :mod:`launcher.status.publisher` (loaded once the first workers run); the
command is :mod:`launcher.status.command`; what they share (file names, keys, the document's
layout) is in :mod:`launcher.status.settings`. See ``docs/status.md``. This package imports
nothing, so a job that is never looked at pays nothing at start-up.
"""
