"""Recovery in place: healthy workers keep their process across a failure (docs/recovery.md).

The agent's control socket is an abstract Unix socket named after the job's token, which every
worker already has in its environment (``LAUNCHER_JOB_TOKEN``): the workers get no variable that
torchrun would not give them but that one, and the agent tells its workers from anything else
by the connecting process's pid (``SO_PEERCRED``), not by what it says.
"""

from collections.abc import Mapping

#: The job's token (``launcher.containment.watchdog.job_env``): ``outer:inner`` under a nested launcher.
TOKEN_ENV = "LAUNCHER_JOB_TOKEN"


def socket_address(token: str) -> str:
    """The abstract socket address (a leading NUL: no file, no path-length limit) of a job's agent."""
    return "\0launcher-recovery-" + token


def own_token(environ: "Mapping[str, str] | None" = None) -> str:
    """The token of the agent that started this process (the innermost one), or ``""``."""
    import os

    value = (environ if environ is not None else os.environ).get(TOKEN_ENV, "")
    return value.rsplit(":", 1)[-1]
