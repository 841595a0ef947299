"""The preload template: imports modules once, then forks a worker from itself on each request.

Run by the agent (``launcher.preload.preload``) as ``PYTHON -u _preload_main.py FD PATH0 MODULES
[-- DISPLAY...]``, with the interpreter and flags a worker would get and the environment every
worker shares. ``FD`` is this end of a ``SOCK_SEQPACKET`` socket pair; ``PATH0`` is what a worker's
``sys.path[0]`` would be (the script's directory, or the working directory for ``-m``); ``MODULES``
is a comma list; what follows ``--`` only makes ``ps`` show which job the template belongs to.

Protocol (one :mod:`marshal` dict per packet, format version 4, so that the agent's and the
workers' interpreters may differ):

- the template says ``{"ready": True, "pid": N}`` once the imports are done and it is safe to
  fork, or ``{"ready": False, "reason": "..."}`` and exits (after an import that left native
  threads, it forks once a child that exits at once, so that only threads a fork loses count:
  OpenBLAS's pool stops itself for a fork);
- ``{"op": "check"}`` asks whether a file of a loaded module changed on disk since it was
  imported: ``{"stale": PATH or None}``;
- ``{"op": "spawn", ...}`` with the worker's stdout and stderr descriptors attached (SCM_RIGHTS)
  starts a worker: ``{"pid": N}``, or ``{"errno": E, "error": "..."}``.

A worker is forked twice (the middle process exits at once), so that it re-parents to the agent,
which marks itself a child subreaper for the moment of the request: the worker is the agent's own
child, exactly as one started with ``subprocess`` is (see ``launcher.preload.preload``). The worker
then becomes what ``python -u SCRIPT ARGS`` would have been: its own session, the worker's
environment, argv, working directory, CPU affinity, stdin ``/dev/null`` and the given stdout and
stderr, and the script (or ``-m`` module) run as a fresh ``__main__``.

Only what the interpreter loads at start-up (``os``, ``sys``, ``marshal``), the C ``_socket``
module (after the preloaded imports) and, where a normal worker would load them too, ``runpy``
(``-m``), ``faulthandler`` (``--hang-timeout``) and the collective timing's modules
(``--straggler-detection``): a forked worker's ``sys.modules`` is what a
normal worker's would be, plus the preloaded modules and ``_socket`` (and, only after an import
that left native threads, ``time`` and, on Python 3.12+, ``warnings``, which ``import torch`` loads
anyway). No launcher import: the
workers' interpreter (``PYTHON_EXEC``) may not have launcher installed. The end of the socket (the
agent closed it, or died) ends the template.
"""

import marshal
import os
import sys

#: Largest request (a worker's environment is most of it).
_MAX_PACKET = 4 << 20
_INT = 4  # sizeof(int): SCM_RIGHTS carries an array of C ints
_HERE = os.path.abspath(__file__)


def _send(sock, message, fds=()):
    import _socket

    data = marshal.dumps(message, 4)
    if fds:
        packed = b"".join(fd.to_bytes(_INT, sys.byteorder) for fd in fds)
        sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, packed)])
    else:
        sock.send(data)


def _receive(sock):
    """(message, descriptors) of the next packet; (None, []) at the end of the socket."""
    import _socket

    data, ancillary, _flags, _addr = sock.recvmsg(_MAX_PACKET, _socket.CMSG_SPACE(16 * _INT))
    fds = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [int.from_bytes(payload[i:i + _INT], sys.byteorder, signed=True)
                    for i in range(0, len(payload) - _INT + 1, _INT)]
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return marshal.loads(data), fds


# -- start-up: import, then make sure a fork keeps everything -------------------------------------


def _native_threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _children():
    found = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as handle:
                found.extend(handle.read().split())
    except OSError:
        pass
    return found


def _sockets(ours):
    found = 0
    try:
        for entry in os.listdir("/proc/self/fd"):
            if int(entry) in (0, 1, 2, ours):  # stdio may be sockets (a journal): not the imports'
                continue
            try:
                if os.readlink(f"/proc/self/fd/{entry}").startswith("socket:"):
                    found += 1
            except OSError:
                continue
    except OSError:
        pass
    return found


def _fork_hazard(name, ours):
    """Why a fork of this process would not carry what importing ``name`` set up, or None."""
    threading = sys.modules.get("threading")  # not imported here: a worker would see it loaded
    python_threads = []
    if threading is not None and threading.active_count() > 1:
        python_threads = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
    cuda = _cuda_initialized()
    native = _native_threads() - 1 - len(python_threads)
    if native > 0 and not cuda and not python_threads:
        # Native threads that their library stops before a fork are no hazard: OpenBLAS (which
        # numpy, and so `import torch`, loads) registers pthread_atfork to stop its pool, and starts
        # it again, as large, on its first use after. A fork that ends at once shows what is left.
        native = _native_threads_after_fork() - 1
    return _hazard_reason(name, cuda, native, python_threads, bool(_children()), _sockets(ours))


def _cuda_initialized():
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    if cuda is None:
        return False
    try:
        return bool(cuda.is_initialized())
    except Exception:  # an unusual torch build: be safe
        return True


def _native_threads_after_fork():
    """This process's threads once a fork has run the libraries' fork handlers (the child exits at once)."""
    try:
        if sys.version_info >= (3, 12):  # os.fork() warns in a multi-threaded process: here it is meant
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        else:
            pid = os.fork()
    except OSError:  # no process to be had: count every thread, as before a fork
        return _native_threads()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    # A joined thread leaves /proc/self/task a moment after pthread_join returns.
    for _ in range(50):
        count = _native_threads()
        if count == 1:
            break
        import time  # only here, after a native library was loaded: it has loaded time long since

        time.sleep(0.002)
    return count


def _hazard_reason(name, cuda_initialized, threads, python_threads, children, sockets):
    """The line saying why not to fork after importing ``name``, from what the import left; None if safe.

    CUDA comes first: initializing it starts threads of its own, which the line must not blame on
    an OpenMP or BLAS pool.
    """
    if cuda_initialized:
        return (f"importing {name} initialized CUDA, whose context and threads do not survive a fork; "
                "preload only modules that do not initialize CUDA when imported")
    if python_threads:
        return (f"importing {name} started {len(python_threads)} thread(s) ({', '.join(python_threads)}), which "
                "a forked worker would not have; preload only modules that start no thread when imported")
    if threads > 0:
        return (f"importing {name} started {threads} native thread(s) that do not stop for a fork (an OpenMP "
                "pool, or a library's own threads), which a forked worker would not have; set "
                "OMP_NUM_THREADS=1 (launcher does so for 2 or more workers per node) or preload fewer modules")
    if children:
        return f"importing {name} started a child process, which forked workers would share"
    if sockets:
        return f"importing {name} opened a socket, which forked workers would share"
    return None


def _stamp(path):
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size)


def _module_files():
    """{file: (mtime_ns, size)} of every loaded module with a file (None when it cannot be read)."""
    files = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path not in files:
            files[path] = _stamp(path)
    return files


def _first_stale(files):
    for path, stamp in files.items():
        if stamp is not None and _stamp(path) != stamp:
            return path
    return None


def _import_all(path0, modules, ours):
    """Import ``modules``; the reason not to fork from here, or None."""
    # This file's directory is not the workers' sys.path[0]; theirs is (unless PYTHONSAFEPATH).
    if sys.path and not getattr(sys.flags, "safe_path", False):
        sys.path[0] = path0
    for name in modules:
        try:
            __import__(name)
        except BaseException as exc:  # SystemExit from a module is a failure too
            return f"cannot import {name} ({type(exc).__name__}: {exc})"
        hazard = _fork_hazard(name, ours)
        if hazard is not None:
            return hazard
    return None


# -- the worker: what runs in the forked grandchild -----------------------------------------------


def _die_with_parent(agent):
    import ctypes  # only without a watchdog, where a normal worker's start would load it in the agent
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != agent:
        os._exit(1)


def _arm_hooks():
    """What ``launcher/hangs/_site/sitecustomize.py`` does at a worker's start-up: arm stack dumps
    (``--hang-timeout``) and time the collectives (``--straggler-detection``).

    The template started without the per-worker variables, so that hook did nothing there (and
    the template holds no rank's state: it is loaded here, in the forked worker). Same file
    format and environment as there (``launcher.hangs.stacks``, ``launcher.stragglers.timing``).
    The template imported ``torch.distributed`` already: the timing module wraps it at once.
    """
    site = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "hangs", "_site")
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
               if p and os.path.abspath(p) != site]
    if "PYTHONPATH" in os.environ:
        if entries:
            os.environ["PYTHONPATH"] = os.pathsep.join(entries)
        else:
            del os.environ["PYTHONPATH"]
    stacks = os.environ.get("LAUNCHER_STACKS_FILE")
    timing = os.environ.get("LAUNCHER_STRAGGLER_FILE") and os.environ.get("LAUNCHER_STRAGGLER_HOOK")
    if not stacks and not timing:
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location("_launcher_stacks_site", os.path.join(site, "sitecustomize.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"no start-up hook in {site}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if stacks:
        try:
            module._arm()
        except Exception as exc:  # never stop a worker from starting (as the start-up hook)
            sys.stderr.write(f"launcher: cannot arm stack dumps: {exc}\n")
    if timing:
        try:
            module._time_collectives()
        except Exception as exc:  # never stop a worker from starting (as the start-up hook)
            sys.stderr.write(f"launcher: cannot time the collectives for straggler detection: {exc}\n")


def _reseed():
    """A fresh process seeds numpy's global generator from the OS; a fork would share the template's.

    (``random`` reseeds itself after a fork; torch's default generator has a fixed seed anyway.)
    """
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:  # noqa: SIM105 - contextlib would be one more module in every worker
            numpy_random.seed()
        except Exception:  # an unusual numpy: keep its state
            pass


def _become_worker(request, out_fd, err_fd, go_fd):
    """Turn this forked process into the worker ``request`` describes; (``-m`` or not, its args)."""
    os.setsid()
    os.read(go_fd, 1)  # the template reaped the middle process: this one is the agent's child now
    os.close(go_fd)
    if request.get("pdeathsig"):
        _die_with_parent(request["agent"])
    if request.get("cpus"):
        os.sched_setaffinity(0, request["cpus"])
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (out_fd, 1), (err_fd, 2)):
        if source != target:
            os.dup2(source, target)
    for fd in {null, out_fd, err_fd} - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    try:
        _arm_hooks()
    except Exception as exc:  # never stop a worker from starting (as the start-up hook)
        sys.stderr.write(f"launcher: cannot load the start-up hook: {exc}\n")
    _reseed()
    argv = request["argv"]
    if hasattr(sys, "orig_argv"):
        sys.orig_argv = list(argv)
    module_mode = argv[2] == "-m"
    return module_mode, argv[3:] if module_mode else argv[2:]


def _fresh_main():
    """A ``__main__`` as the interpreter creates it at start-up."""
    import builtins

    main = type(sys)("__main__")
    main.__dict__.update(__annotations__={}, __builtins__=builtins)
    sys.modules["__main__"] = main
    return main


def _prepare(job):
    """Set up ``__main__`` and ``sys.argv`` for the worker's job; (its globals, the ``-m`` module or None)."""
    module_mode, args = job
    main = _fresh_main()
    if module_mode:  # python -u -m MODULE ARGS: argv[0] is "-m" until runpy finds the module
        sys.argv = ["-m", *args[1:]]
        return main.__dict__, args[0]
    path = os.path.abspath(args[0])  # __main__.__file__ is absolute since Python 3.9
    sys.argv = list(args)
    loader = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path)
    main.__dict__.update(__file__=path, __cached__=None, __loader__=loader)
    return main.__dict__, None


def _compile(main_globals):
    """The script's code; a missing script ends the worker as the interpreter would (status 2)."""
    path = main_globals["__file__"]
    try:
        with open(path, "rb") as handle:
            source = handle.read()
    except OSError as exc:
        sys.stderr.write(f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}\n")
        sys.exit(2)
    return compile(source, path, "exec", dont_inherit=True)


def _report(exc, main_globals):
    """Print an uncaught exception as the interpreter would for ``python SCRIPT``: from the script's
    own frames (none of this file's; none at all for a SyntaxError), through ``sys.excepthook``;
    then silence the hook, so that re-raising ends the process as usual (status 1, or death by
    SIGINT for KeyboardInterrupt) without printing it twice."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals is not main_globals:
        tb = tb.tb_next
    exc.__traceback__ = tb  # the default hook prints the exception's own traceback
    try:  # noqa: SIM105 - contextlib would be one more module in every worker
        sys.excepthook(type(exc), exc, tb)
    except Exception:  # as the interpreter does, go on to exit
        pass
    sys.excepthook = lambda *_: None


def _arm_group_teardown():
    """Tear down a gloo group the script leaves alive, after its exit handlers, as a ``--run-path``
    worker does: ``exit_teardown.py`` beside this file, run from its source (no launcher import
    here). Only where torch was preloaded: then ``atexit`` is loaded already and the worker's
    ``sys.modules`` stays what it would be; otherwise the script imports torch itself, later."""
    if "torch.distributed" not in sys.modules or "atexit" not in sys.modules:
        return
    path = os.path.join(os.path.dirname(_HERE), "exit_teardown.py")
    teardown: dict = {"__name__": "_launcher_exit_teardown"}
    try:
        with open(path, "rb") as handle:
            exec(compile(handle.read(), path, "exec", dont_inherit=True), teardown)
        teardown["arm"]()
    except (OSError, SyntaxError):  # no teardown is the plain worker's behaviour: never fail the job for it
        pass


# -- the template's loop --------------------------------------------------------------------------


def _spawn(sock, request, fds):
    """Fork a worker for ``request``; None in the template, the worker's job in the worker."""
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        _send(sock, {"errno": 0, "error": "expected the worker's stdout and stderr descriptors"})
        return None
    out_fd, err_fd = fds
    pid_r, pid_w = os.pipe()
    go_r, go_w = os.pipe()
    try:
        middle = os.fork()
    except OSError as exc:
        for fd in (pid_r, pid_w, go_r, go_w, out_fd, err_fd):
            os.close(fd)
        _send(sock, {"errno": exc.errno, "error": str(exc)})
        return None
    if middle == 0:
        try:
            worker = os.fork()
        except OSError as exc:
            os.write(pid_w, f"-{exc.errno}".encode())
            os._exit(0)
        if worker == 0:
            try:
                sock.close()
                for fd in (pid_r, pid_w, go_w):
                    os.close(fd)
                return _become_worker(request, out_fd, err_fd, go_r)
            except BaseException as exc:  # the worker must never return to the loop
                try:
                    os.write(2, f"launcher: preloaded worker set-up failed: {exc!r}\n".encode())
                finally:
                    os._exit(1)
        os.write(pid_w, str(worker).encode())
        os._exit(0)
    os.close(pid_w)
    os.close(go_r)
    os.close(out_fd)
    os.close(err_fd)
    with os.fdopen(pid_r, "rb") as handle:
        answer = handle.read().decode() or "-0"
    os.waitpid(middle, 0)  # from here on the worker is the agent's child (a subreaper)
    try:  # noqa: SIM105 - contextlib would be one more module in every worker
        os.write(go_w, b"1")
    except OSError:  # the worker is gone already: its exit tells the agent
        pass
    os.close(go_w)
    if answer.startswith("-"):
        errno = int(answer[1:])
        _send(sock, {"errno": errno, "error": os.strerror(errno) if errno else "fork failed"})
    else:
        _send(sock, {"pid": int(answer)})
    return None


def _serve():
    """The template's life; returns only in a forked worker, with what it must run."""
    fd, path0, modules = int(sys.argv[1]), sys.argv[2], [m for m in sys.argv[3].split(",") if m]
    reason = _import_all(path0, modules, fd)
    import _socket  # after the imports: a socket of the imports' own would be a fork hazard

    sock = _socket.socket(fileno=fd)
    if reason is not None:
        _send(sock, {"ready": False, "reason": reason})
        os._exit(0)
    files = _module_files()
    _send(sock, {"ready": True, "pid": os.getpid(), "modules": len(files)})
    while True:
        try:
            request, fds = _receive(sock)
        except OSError:
            os._exit(0)
        if request is None:
            os._exit(0)  # the agent closed the socket (or died)
        if request.get("op") == "check":
            _send(sock, {"stale": _first_stale(files)})
        elif request.get("op") == "spawn":
            job = _spawn(sock, request, fds)
            if job is not None:
                return job


if __name__ == "__main__":
    # The worker's code runs right here, at this module's top level, so that its stacks (tracebacks
    # aside, which _report trims) show one frame of this file above the script's, as few as can be.
    _globals, _module = _prepare(_serve())
    _arm_group_teardown()  # before the script: its own exit handlers run first
    try:
        if _module is None:
            exec(_compile(_globals), _globals)
        else:
            import runpy

            runpy._run_module_as_main(_module, alter_argv=True)  # type: ignore[attr-defined]  # as `python -m`
    except SystemExit:
        raise
    except BaseException as _exc:
        _report(_exc, _globals)
        raise
