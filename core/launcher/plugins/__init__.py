"""launcher's plugin interface.

Plugins implement hooks from :mod:`launcher.plugins.hookspec` with :data:`hookimpl` and return
registrations from :mod:`launcher.plugins.types`. See ``docs/plugins.md`` for a guide.
"""

from launcher.plugins.hookspec import hookimpl

__all__ = ["hookimpl"]
