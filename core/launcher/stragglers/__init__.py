"""Straggler detection: name the rank that makes every other rank wait, while the job runs.

The worker side (:mod:`launcher.stragglers.timing`, standard library only) times each rank's
collectives and writes running totals into a shared-memory slot; the agent side
(:mod:`launcher.stragglers.monitor`) reads the slots, exchanges one summary per node through the
store (:mod:`launcher.stragglers.cluster`) and reaches the same verdict on every node
(:mod:`launcher.stragglers.verdict`). See ``docs/stragglers.md``. This package imports nothing,
so a job that does not ask for it pays nothing.
"""
