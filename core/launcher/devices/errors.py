"""The exception a device provider raises when its kind cannot be counted on this host."""

from __future__ import annotations


class DeviceUnavailableError(RuntimeError):
    """This kind of device cannot exist here (its library is missing, torch lacks the backend).

    ``auto`` skips a provider that raises it without a warning, since that is the common case
    (no NVIDIA driver on an Intel GPU host); ``--nproc-per-node NAME`` shows the message to the
    user. Raise anything else for a real failure.
    """
