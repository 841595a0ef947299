"""launcher-etcd: a rendezvous backend for launcher over etcd's v3 API.

``--rdzv-backend etcd`` (or ``etcd-v2``, torchrun's name) runs the core's elastic rendezvous over
:class:`~launcher_etcd.store.EtcdStore`. Importing this package imports neither ``etcd3gw`` nor
``requests``: :mod:`launcher_etcd.plugin` only registers names, and the client loads when the
backend is chosen.
"""

__version__ = "0.1.0"
