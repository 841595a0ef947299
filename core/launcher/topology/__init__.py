"""Ranks placed by network topology (``--topology``): where each node sits, and the order it gives.

:mod:`launcher.topology.api` holds what a topology source plugin uses (the query it answers, the
location it gives, the error it raises), :mod:`~launcher.topology.sources` the built-in sources,
:mod:`~launcher.topology.order` the ordering the rendezvous's closer applies, and
:mod:`~launcher.topology.settings` the flag. Nothing here is imported by a launch without
``--topology`` but the flag's declaration (see docs/topology.md).
"""
