"""Containment: nothing a job starts outlives the job, whatever its session, environment or parent.

Every process a job's workers start ends when the job ends (success, failure, a restart, a
signal, or the agent SIGKILLed); ``docs/architecture.md`` ("No process outlives its job") says
how the pieces work together. The modules:

- :mod:`~launcher.containment.containment`: the job's containment, chosen once per agent (a
  cgroup v2, else a child subreaper, else none), and the job's cgroup: created, entered, killed,
  removed.
- :mod:`~launcher.containment.mode`: the mode ``LAUNCHER_CONTAINMENT`` asks for.
- :mod:`~launcher.containment.cgroups`: where this process's cgroup v2 is, and the warm-up for
  the agent's move into the job's cgroup.
- :mod:`~launcher.containment.orphans`: the subreaper fallback's adopted orphans.
- :mod:`~launcher.containment.sweep`: what ended workers left, killed until none is left.
- :mod:`~launcher.containment.watchdog`: the agent's side of the watchdog and the job token.
- ``_watchdog_main.py``: the watchdog process itself (run as a script, imports no launcher
  module), which kills the job's processes when the agent dies without cleaning up.

This package imports nothing: the agent loads each module when its mode or phase needs it.
"""
