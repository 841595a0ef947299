"""Key-value stores: the interface the rendezvous runs over, and launcher's own TCPStore.

:mod:`launcher.store.api` defines :class:`~launcher.store.api.KeyValueStore`. The agent serves a
TCPStore-compatible store written in pure Python (:mod:`launcher.store.server`) so that a
single-node launch never imports torch; workers connect to it with torch's own TCPStore client.
The docstring of :mod:`launcher.store.api` lists the modules and the one job of each.
"""
