"""Hang detection: heartbeats from the workers, a watch in the agent, every rank's stack on a hang.

Training code needs only ``launcher.heartbeat()`` (and ``launcher.quiet(...)`` for phases
expected to be silent), from :mod:`launcher.hangs.heartbeat`, importable without torch. The
agent side is :mod:`launcher.hangs.monitor`; see ``docs/hangs.md``. This package imports
nothing, so workers that never ask for it pay nothing.
"""
