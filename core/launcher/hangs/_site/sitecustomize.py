"""launcher's worker bootstrap for stack dumps on demand and collective timing (``--hang-timeout``,
``--straggler-detection``).

The agent puts this directory first on the worker's ``PYTHONPATH``; Python's ``site`` module
imports it at start-up, before the training script. It:

1. records this process's pid in ``LAUNCHER_HEARTBEAT_PID``: only this process (the worker)
   beats for its rank, never a child of it (``launcher.hangs.heartbeat``);
2. arms :func:`faulthandler.register` on the signal in ``LAUNCHER_STACKS_SIGNAL``, writing every
   thread's Python stack to ``LAUNCHER_STACKS_FILE``, and records this process's pid in that file
   so the agent signals only a process that is ready (the signal's default action would kill it);
3. starts the flight-recorder dump thread of ``launcher/hangs/flightrec_worker.py`` (when the
   agent made its request pipe, ``LAUNCHER_FR_REQUEST``): the collectives this rank entered,
   read at a hang;
4. with ``--straggler-detection`` or ``--hang-timeout``, loads ``launcher/stragglers/timing.py``
   (named in ``LAUNCHER_STRAGGLER_HOOK``, or found beside this directory), which times the
   collectives once the user imports them and, under ``--hang-timeout``, counts completed
   collectives and optimizer steps as the rank's progress (no code change in the job);
5. removes itself from ``sys.path`` and ``PYTHONPATH``, so the worker sees the paths torchrun
   would give it and its own children do not load it;
6. runs the ``sitecustomize`` it shadows, if there is one.

Standard library only, and nothing newer than Python 3.8: the worker's interpreter may not be
the agent's, and may not have launcher installed.
"""

import os
import sys


def _claim_heartbeat():
    # Same as launcher.hangs.heartbeat.claim(), which this file cannot import (see above).
    if os.environ.get("LAUNCHER_HEARTBEAT_FILE") and not os.environ.get("LAUNCHER_HEARTBEAT_PID"):
        os.environ["LAUNCHER_HEARTBEAT_PID"] = str(os.getpid())


def _arm():
    _claim_heartbeat()
    path = os.environ.get("LAUNCHER_STACKS_FILE")
    signum = os.environ.get("LAUNCHER_STACKS_SIGNAL", "")
    # One process per worker: descendants (data-loader workers, a wrapper's child) inherit the
    # mark and leave the file to the first one.
    if not path or not signum.isdigit() or os.environ.get("LAUNCHER_STACKS_ARMED"):
        return
    import faulthandler

    handle = open(path, "a")  # noqa: SIM115 - faulthandler writes to it until the process ends
    handle.write(f"# launcher: stacks armed pid={os.getpid()} signal={signum}\n")
    handle.flush()
    faulthandler.register(int(signum), file=handle, all_threads=True, chain=False)
    os.environ["LAUNCHER_STACKS_ARMED"] = str(os.getpid())
    # faulthandler keeps the descriptor, not the object: keep the object alive too.
    sys.__dict__.setdefault("_launcher_stacks_file", handle)
    # Progress from collectives and optimizer steps: here too, for launcher's preloaded workers,
    # which run this function alone (the start-up hook's own call finds the module loaded).
    try:
        _time_collectives()
    except Exception as exc:  # never stop a worker from starting; the stacks still work
        sys.stderr.write(f"launcher: cannot watch collectives and optimizer steps for progress: {exc}\n")
    if os.environ.get("LAUNCHER_FR_REQUEST"):
        try:
            _serve_flight_recorder()
        except Exception as exc:  # never stop a worker from starting; the stacks still work
            sys.stderr.write(f"launcher: cannot serve flight-recorder dumps: {exc}\n")


def _serve_flight_recorder():
    # The armed process only (as the stacks): its thread dumps torch's flight record on request.
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "flightrec_worker.py")
    module = _load_file("_launcher_flightrec_worker", path)
    if module is not None:
        module.serve()


def _time_collectives():
    # --straggler-detection: the agent names the timing module (launcher/stragglers/timing.py,
    # standard library only), which waits for the user's import of torch.distributed.
    # --hang-timeout (a heartbeat file): the same module, found beside this directory (no
    # variable added to the worker's environment), beats for the rank at its progress.
    timing = os.environ.get("LAUNCHER_STRAGGLER_HOOK") and os.environ.get("LAUNCHER_STRAGGLER_FILE")
    if not timing and not os.environ.get("LAUNCHER_HEARTBEAT_FILE"):
        return
    if timing and not os.environ.get("LAUNCHER_STRAGGLER_PID"):
        os.environ["LAUNCHER_STRAGGLER_PID"] = str(os.getpid())
    path = os.environ.get("LAUNCHER_STRAGGLER_HOOK") if timing else os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "stragglers", "timing.py")
    module = _load_file("_launcher_straggler_timing", path)
    if module is not None:
        module.install()


def _load_file(name, path):
    # A module of launcher's loaded by its path under ``name`` (this file cannot import launcher);
    # ``None`` when it cannot be loaded. Loaded once: a second call gets the same module.
    if name in sys.modules:
        return sys.modules[name]
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _unshadow():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != here]
    if entries:
        os.environ["PYTHONPATH"] = os.pathsep.join(entries)
    else:
        os.environ.pop("PYTHONPATH", None)
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


# Run when ``site`` imports this file at start-up. launcher's preload template loads it under
# another name for :func:`_arm` alone (its workers are forked, not started by ``site``).
if __name__ == "sitecustomize":
    try:
        _arm()
    except Exception as exc:  # never stop a worker from starting
        sys.stderr.write(f"launcher: cannot arm stack dumps: {exc}\n")
    try:
        _time_collectives()
    except Exception as exc:  # never stop a worker from starting
        sys.stderr.write(f"launcher: cannot time the collectives for straggler detection: {exc}\n")
    _unshadow()
