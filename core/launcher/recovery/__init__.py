"""Recovery in place: healthy workers keep their process across a failure (docs/recovery.md).

The names the agent gives each worker live here, so that neither side imports the other's module.
"""

#: Path of the agent's control socket.
SOCKET_ENV = "LAUNCHER_RECOVERY_SOCKET"
#: This worker's slot (its local rank).
SLOT_ENV = "LAUNCHER_RECOVERY_SLOT"
#: The pid of the worker process (recorded at its first call; children inherit it and stay out).
PID_ENV = "LAUNCHER_RECOVERY_PID"
