"""Run many ``launcher`` command lines cheaply: one interpreter imports the CLI once, then forks
a child per command line that runs :func:`launcher.cli.main` exactly as ``python -m launcher``
would (its own environment, working directory, argv, stdin/stdout on /dev/null and stderr to a
file), and reports each child's exit status.

Used by ``test_bad_input_corpus.py`` for the cases that need nothing of a fresh interpreter
(``PYTHONPATH``, limits or a redirected stderr still go through a real subprocess there). A fork
costs a few milliseconds where a new interpreter costs a tenth of a second.

Input on stdin, JSON: ``{"parallel": N, "timeout": S, "cases": [{"args", "env", "cwd", "stderr"}]}``.
Output on stdout, JSON: one ``{"code": int | null, "seconds": float}`` per case (null: killed
after ``timeout`` seconds).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback


def _child(case: dict) -> None:
    """In the forked child: become the launcher for ``case``; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # the parent kills the whole group on a hang
        os.chdir(case["cwd"])
        os.environ.clear()
        os.environ.update(case["env"])
        err = os.open(case["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(err, 2)
        os.close(null)
        os.close(err)
        sys.argv = ["launcher", *case["args"]]
        from launcher.cli import main

        main(case["args"])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def main() -> None:
    request = json.load(sys.stdin)
    # What every command line imports anyway, imported once here (no module reads the
    # environment when imported, so the children see theirs).
    import launcher.cli
    import launcher.command_line
    import launcher.options
    import launcher.plan
    import launcher.plugins.manager  # noqa: F401

    cases = request["cases"]
    results: list[dict | None] = [None] * len(cases)
    running: dict[int, tuple[int, float]] = {}
    next_case = 0
    while next_case < len(cases) or running:
        while next_case < len(cases) and len(running) < request["parallel"]:
            pid = os.fork()
            if pid == 0:
                _child(cases[next_case])
            running[pid] = (next_case, time.monotonic())
            next_case += 1
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid in running:
            index, started = running.pop(pid)
            results[index] = {"code": os.waitstatus_to_exitcode(status), "seconds": time.monotonic() - started}
            continue
        now = time.monotonic()
        for pid, (index, started) in list(running.items()):
            if now - started > request["timeout"]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                running.pop(pid)
                results[index] = {"code": None, "seconds": now - started}
        time.sleep(0.002)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
