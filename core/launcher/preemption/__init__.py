"""Preemption: the notice every rank sees, the grace to save in, and the outcome "preempted".

Worker side: :mod:`launcher.preemption.notice` (standard library only). Agent side:
:mod:`launcher.preemption.watch`. Settings: :mod:`launcher.preemption.settings`. See
``docs/preemption.md``.
"""
