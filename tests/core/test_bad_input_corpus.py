"""The bad-input corpus: every case is one line on stderr, its exit status (2), and no worker started.

Each case is a real ``launcher`` command line (flags, ``PET_*`` and ``LAUNCHER_*`` variables, both
spellings, odd Unicode, empty, huge and control-character values) with the exit status it must end
with and a fragment of its one-line message. The cases run as subprocesses, a few at a time, once
per module (most as forks of one interpreter that imported the CLI once, see ``corpus_forks.py``;
those that need a fresh interpreter as ``python -m launcher``); each parametrized test then
checks one case's outcome. The worker script writes a
marker file named by ``$MARKER_FILE``, so a case that started a worker is caught. The etcd cases
see the ``launcher-etcd`` plugin from this tree through a metadata-only install (its entry point),
which costs no build. The 30 s timeout only guards against hangs (a loaded machine takes seconds
to import a plugin); no test asserts speed.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import launcher_env

HANG_GUARD_S = 30.0
PARALLEL = 4
FORKS = Path(__file__).with_name("corpus_forks.py")
ETCD_PLUGIN = Path(__file__).resolve().parents[2] / "plugins" / "launcher-etcd"


@dataclass(frozen=True)
class Case:
    """A command line (``{script}``, ``{file}``, ``{dir}`` and ``{etcd}`` filled in), its exit status
    and a fragment of its one-line message."""

    args: tuple[str, ...]
    expect: str
    env: dict[str, str] = field(default_factory=dict)
    #: Run under ``sh -c 'ulimit -n N; exec ...'`` when set.
    nofile: int | None = None
    #: The exit status the case must end with.
    code: int = 2
    #: Where stderr goes: ``pipe`` (read and checked), ``full`` (``2>/dev/full``) or ``closed`` (``2>&-``).
    stderr: str = "pipe"

    @property
    def id(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        redirect = {"pipe": "", "full": "2>/dev/full", "closed": "2>&-"}[self.stderr]
        return ascii(" ".join(filter(None, (env, *self.args, redirect))))[1:-1][:70]


def case(*args: str, expect: str, env: dict[str, str] | None = None, script: bool = True,
         nofile: int | None = None, code: int = 2, stderr: str = "pipe") -> Case:
    """A case; the marker script is appended unless ``script=False``."""
    return Case((*args, "{script}") if script else args, expect, env or {}, nofile, code, stderr)


NPROC = "--nproc-per-node must be an integer from 1 to 4096"
NNODES = "--nnodes must be N or MIN:MAX with integers from 1 to 100000"
RESTARTS = "--max-restarts must be an integer from 0 to 100000"
MONITOR = "--monitor-interval must be a number of seconds above 0 and at most 3600"
SHUTDOWN = "--shutdown-timeout must be a number of seconds from 0 to 604800"
BARRIER = "--exit-barrier-timeout must be a number of seconds from 0 to 604800"
PORT = "--master-port must be an integer from 0 to 65535"
JOIN = "--rdzv-conf join_timeout must be a number of seconds above 0 and at most 604800"
TIMEOUT = "--rdzv-conf timeout must be a number of seconds above 0 and at most 604800"
MULTI = ("--nnodes", "2", "--rdzv-backend", "c10d")
#: c10d with an endpoint on this node: the values are checked there as with --standalone.
LOCAL = ("--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:29400")
ETCD = ("--nnodes", "2", "--rdzv-backend", "etcd")
#: Makes the launcher-etcd plugin of this tree installed for the case (see the module's doc).
WITH_ETCD = {"PYTHONPATH": "{etcd}"}
NO_AUTOLOAD = {"LAUNCHER_DISABLE_PLUGIN_AUTOLOAD": "1"}
UNRESOLVABLE = "cannot resolve the host 'no-such-host.invalid' (the .invalid domain never resolves)"
#: The seven bad --rdzv-conf values of issue 11, and issue 32's stray quotes (a value quoted once
#: more than its shell removes), each with a fragment of its message.
BAD_RDZV_CONF = [
    ("join_timeout=abc", JOIN + ", got 'abc'"),
    ("join_timeout=nan", JOIN + ", got 'nan'"),
    ("join_timeout=-5", JOIN + ", got '-5'"),
    ("join_timeout=", "--rdzv-conf 'join_timeout' has no value"),
    ("close_timeout=x", "--rdzv-conf close_timeout must be a number of seconds above 0"),
    ("read_timeout=-1", "--rdzv-conf read_timeout must be a number of seconds above 0"),
    ("last_call_timeout=inf", "--rdzv-conf last_call_timeout must be a number of seconds above 0"),
    ("'join_timeout=5,timeout=5'", "--rdzv-conf \"'join_timeout=5,timeout=5'\" carries quote characters "
     "(a quoting layer passed them on): give it without them, --rdzv-conf join_timeout=5,timeout=5"),
    ('join_timeout="5"', "carries quote characters (a quoting layer passed them on): give it without them, "
     "--rdzv-conf join_timeout=5"),
]

CORPUS = [
    # --nproc-per-node: ASCII decimal only, 1..4096.
    case("--nproc-per-node", "²", expect=NPROC + ", got '²'"),
    case("--nproc-per-node", "٣", expect=NPROC + ", got '٣'"),
    case("--nproc-per-node", "３", expect=NPROC),
    case("--nproc_per_node", "99999999999999999999", expect=NPROC),
    case("--nproc-per-node", "9" * 5000, expect=NPROC),
    case("--nproc-per-node", "0", expect=NPROC),
    case("--nproc-per-node", "-2", expect=NPROC),
    case("--nproc-per-node", "4097", expect=NPROC),
    case("--nproc-per-node", "1.5", expect=NPROC),
    case("--nproc-per-node", "1e3", expect=NPROC),
    case("--nproc-per-node", "", expect=NPROC),
    case("--nproc-per-node", "2 x", expect=NPROC + ", got '2 x'"),
    case("--nproc-per-node", "\u202e3", expect=NPROC + ", got '\\u202e3'"),
    case("--nproc-per-node", "1_0", expect=NPROC + ", got '1_0'"),
    case("--nproc-per-node", "٢_٢", expect=NPROC + ", got '٢_٢'"),
    case("--nproc-per-node", "9_999", expect=NPROC + ", got '9_999'"),
    case("--nproc-per-node", "+2", expect=NPROC + ", got '+2'"),
    case("--nproc-per-node", " 2", expect=NPROC + ", got ' 2'"),
    case("--nproc-per-node", "2\n", expect=NPROC + ", got '2\\n'"),
    case(expect="PET_NPROC_PER_NODE must be an integer from 1 to 4096, got '٢_٢'", env={"PET_NPROC_PER_NODE": "٢_٢"}),
    case(expect="PET_NPROC_PER_NODE must be an integer from 1 to 4096, got '+2'", env={"PET_NPROC_PER_NODE": "+2"}),
    case("--nproc-per-node", "-", expect=NPROC),
    case("--nproc-per-node", "lots", expect="unknown device provider 'lots'"),
    case("--nproc-per-node", "cdua", expect="did you mean cuda"),
    case(expect="PET_NPROC_PER_NODE must be an integer from 1 to 4096, got '٣'", env={"PET_NPROC_PER_NODE": "٣"}),
    case(expect="PET_NPROC_PER_NODE must be", env={"PET_NPROC_PER_NODE": "0"}),
    # --nnodes.
    case("--nnodes", "0", expect=NNODES),
    case("--nnodes", "3:2", expect="need MIN <= MAX"),
    case("--nnodes", "a:b", expect=NNODES),
    case("--nnodes", "1:2:3", expect=NNODES),
    case("--nnodes", "٢", expect=NNODES),
    case("--nnodes", "", expect=NNODES),
    case("--nnodes", ":4", expect=NNODES),
    case("--nnodes", "1:99999999999999999999", expect=NNODES),
    case("--nnodes", " 1", expect=NNODES),
    case("--nnodes", "1_0", expect=NNODES),
    case(expect="PET_NNODES must be N or MIN:MAX", env={"PET_NNODES": "0"}),
    # --max-restarts.
    case("--max-restarts", "many", expect=RESTARTS),
    case("--max-restarts", "-1", expect=RESTARTS),
    case("--max-restarts", "1e9", expect=RESTARTS),
    case("--max_restarts", "١", expect=RESTARTS),
    case("--max-restarts", "100001", expect=RESTARTS),
    case("--max-restarts", "+1", expect=RESTARTS + ", got '+1'"),
    case("--max-restarts", "1\x1b[31m", expect=RESTARTS + ", got '1\\x1b[31m'"),
    case(expect="PET_MAX_RESTARTS must be an integer from 0 to 100000", env={"PET_MAX_RESTARTS": "x"}),
    # --monitor-interval.
    case("--monitor-interval", "0", expect=MONITOR),
    case("--monitor-interval", "inf", expect=MONITOR + ", got 'inf'"),
    case("--monitor-interval", "1e999", expect=MONITOR),
    case("--monitor-interval", "nan", expect=MONITOR),
    case("--monitor-interval", "-1", expect=MONITOR),
    case("--monitor-interval", "3601", expect=MONITOR),
    case("--monitor-interval", "0x10", expect=MONITOR),
    case("--monitor-interval", "١", expect=MONITOR),
    case("--monitor-interval", " 1", expect=MONITOR),
    case("--monitor-interval", "1_0", expect=MONITOR),
    case("--monitor_interval", "", expect=MONITOR),
    case(expect="PET_MONITOR_INTERVAL must be a number of seconds", env={"PET_MONITOR_INTERVAL": "inf"}),
    # --shutdown-timeout and its fallbacks.
    case("--shutdown-timeout", "nan", expect=SHUTDOWN + ", got 'nan'"),
    case("--shutdown-timeout", "inf", expect=SHUTDOWN),
    case("--shutdown-timeout", "-5", expect=SHUTDOWN),
    case("--shutdown-timeout", "soon", expect=SHUTDOWN),
    case("--shutdown-timeout", "1e999", expect=SHUTDOWN),
    case("--shutdown_timeout", "", expect=SHUTDOWN),
    case(expect="TORCH_ELASTIC_SHUTDOWN_TIMEOUT must be a number", env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "nan"}),
    case(expect="PET_SHUTDOWN_TIMEOUT must be a number", env={"PET_SHUTDOWN_TIMEOUT": "-1"}),
    # --exit-barrier-timeout.
    case("--exit-barrier-timeout", "nan", expect=BARRIER),
    case("--exit-barrier-timeout", "inf", expect=BARRIER),
    case("--exit-barrier-timeout", "-1", expect=BARRIER),
    case("--exit-barrier-timeout", "604801", expect=BARRIER),
    case("--exit-barrier-timeout", "1e999", expect=BARRIER + ", got '1e999'"),
    case("--exit-barrier-timeout", "+5", expect=BARRIER),
    case("--exit_barrier_timeout", "x", expect=BARRIER),
    case(expect="PET_EXIT_BARRIER_TIMEOUT must be", env={"PET_EXIT_BARRIER_TIMEOUT": "nan"}),
    # Static rendezvous: --node-rank, --master-port, --master-addr, --local-addr.
    case("--node-rank", "5", expect="--node-rank must be an integer from 0 to 0"),
    case("--node-rank", "-1", expect="--node-rank must be an integer from 0 to 0"),
    case("--node-rank", "٠", expect="--node-rank must be an integer"),
    case("--node_rank", "", expect="--node-rank must be an integer"),
    case("--nnodes", "2", "--node-rank", "2", expect="--node-rank must be an integer from 0 to 1"),
    case(expect="PET_NODE_RANK must be an integer", env={"PET_NODE_RANK": "x"}),
    case("--master-port", "70000", expect=PORT),
    case("--master-port", "-1", expect=PORT),
    case("--master-port", "http", expect=PORT),
    case("--master_port", "６５５３５", expect=PORT),
    case("--master-port", "29_500", expect=PORT),
    case(expect="PET_MASTER_PORT must be an integer from 0 to 65535", env={"PET_MASTER_PORT": "99999"}),
    case("--master-addr", "a b", expect="--master-addr: 'a b' is not a host name"),
    case("--master-addr", "", expect="is not a host name"),
    case("--master-addr", ":::", expect="is not an IPv6 address"),
    case("--master-addr", "h\nx", expect="'h\\nx' is not a host name"),
    case("--master_addr", "bücher.example", expect="xn-- form"),
    case("--local-addr", "a b", expect="--local-addr: 'a b' is not a host name"),
    # --redirects / --tee.
    case("--redirects", "7", expect="--redirects '7' is invalid"),
    case("--redirects", "x:1", expect="--redirects 'x:1' is invalid"),
    case("--redirects", "٠:1", expect="--redirects '٠:1' is invalid"),
    case("--redirects", "0:1,0:2", expect="names local rank 0 twice"),
    case("--redirects", "5:1", expect="--redirects local rank must be an integer from 0 to 0"),
    case("-r", "1,", expect="--redirects '1,' is invalid"),
    case("--tee", "0:9", expect="--tee '0:9' is invalid"),
    case("--tee=-1:3", expect="--tee local rank must be an integer from 0 to 0"),
    case("-t", "4", expect="--tee '4' is invalid"),
    case("--tee", "99999999999999999999:1", expect="--tee local rank must be an integer from 0 to 0"),
    case(expect="PET_TEE '9' is invalid", env={"PET_TEE": "9"}),
    # --local-ranks-filter.
    case("--local-ranks-filter", "-1", expect="--local-ranks-filter '-1' is invalid"),
    case("--local-ranks-filter", "0,,1", expect="--local-ranks-filter '0,,1' is invalid"),
    case("--local-ranks-filter", "a,b", expect="--local-ranks-filter 'a,b' is invalid"),
    case("--local-ranks-filter", "0, 1", expect="--local-ranks-filter '0, 1' is invalid"),
    case("--local_ranks_filter", "١", expect="is invalid: use a comma list of local ranks"),
    case("--local-ranks-filter", "4096", expect="local ranks from 0 to 4095"),
    case("--local-ranks-filter", "3", expect="--local-ranks-filter rank must be an integer from 0 to 0"),
    case(expect="PET_LOCAL_RANKS_FILTER 'x' is invalid", env={"PET_LOCAL_RANKS_FILTER": "x"}),
    # --rdzv-conf, for c10d with --standalone, local c10d, multi-node c10d, etcd and static.
    *(case("--standalone", "--rdzv-conf", conf, expect=words) for conf, words in BAD_RDZV_CONF),
    *(case(*LOCAL, "--rdzv-conf", conf, expect=words) for conf, words in BAD_RDZV_CONF),
    case("--standalone", "--rdzv-conf", "timeout=nan", expect=TIMEOUT + ", got 'nan'"),
    case("--standalone", "--rdzv-conf", "timeout=abc", expect=TIMEOUT + ", got 'abc'"),
    case(*LOCAL, "--rdzv-conf", "timeout=nan", expect=TIMEOUT),
    case(*LOCAL, "--rdzv-conf", "timeout=abc", expect=TIMEOUT),
    case("--standalone", "--rdzv-conf", "join_timeout=abc,join_timeout=1",
         expect="--rdzv-conf gives 'join_timeout' twice: give each key once"),
    case("--rdzv-conf", "timeout=5,timeout=6", expect="--rdzv-conf gives 'timeout' twice"),
    case("--standalone", expect="--rdzv-conf gives 'read_timeout' twice",
         env={"PET_RDZV_CONF": "read_timeout=5, read_timeout=5"}),
    case("--standalone", "--rdzv-conf", "join_timeout=1e999", expect=JOIN),
    case("--standalone", "--rdzv-conf", "join_timeout=1_0", expect=JOIN),
    case("--standalone", "--rdzv-conf", "join_timeout=+5", expect=JOIN),
    case("--standalone", "--rdzv-conf", "join_timeout=١٠", expect=JOIN),
    case("--standalone", "--rdzv-conf", "join_timeout=604801", expect=JOIN),
    case("--standalone", "--rdzv-conf", "keep_alive_interval=0", expect="--rdzv-conf keep_alive_interval must be"),
    case("--standalone", "--rdzv-conf", "keep_alive_max_attempt=0",
         expect="--rdzv-conf keep_alive_max_attempt must be an integer from 1 to 1000"),
    case("--standalone", "--rdzv-conf", "keep_alive_max_attempt=1.5", expect="keep_alive_max_attempt must be"),
    case("--standalone", "--rdzv-conf", "heartbeat_timeout=1", expect="must be longer than keep_alive_interval"),
    case("--standalone", "--rdzv-conf", "heartbeat_timeout=nan", expect="--rdzv-conf heartbeat_timeout must be"),
    case("--standalone", "--rdzv-conf", "store_type=redis", expect="store_type='redis' is not supported"),
    case("--standalone", "--rdzv-conf", "is_host=maybe", expect="is_host='maybe' must be true or false"),
    case("--standalone", "--rdzv-conf", "stable_rank0=2", expect="stable_rank0='2' must be true or false"),
    case("--standalone", "--rdzv-conf", "no_such_key=1",
         expect="'no_such_key' is unknown to the c10d backend; known keys: close_timeout"),
    case("--standalone", "--rdzv-conf", "join_timeout", expect="--rdzv-conf item 'join_timeout' is invalid"),
    case("--standalone", "--rdzv-conf", "=5", expect="--rdzv-conf item '=5' is invalid"),
    case("--standalone", "--rdzv-conf", "join\ntimeout=1", expect="'join\\ntimeout' is unknown"),
    case("--standalone", expect=JOIN, env={"PET_RDZV_CONF": "join_timeout=abc"}),
    case("--rdzv-backend", "c10d", "--rdzv-conf", "join_timeout=nan", expect=JOIN),
    case(*MULTI, "--rdzv-endpoint", "localhost:29400", "--rdzv-conf", "read_timeout=-1",
         expect="--rdzv-conf read_timeout must be"),
    case("--rdzv-conf", "timeout=nan", expect=TIMEOUT),
    case("--rdzv-conf", "join_timeout=5", expect="'join_timeout' is unknown to the static backend"),
    # --rdzv-endpoint: missing or malformed is a usage error, at once.
    case(*MULTI, expect="needs --rdzv-endpoint host[:port]"),
    case(*MULTI, "--rdzv-endpoint", ":::", expect="':::' is not an IPv6 address"),
    case(*MULTI, "--rdzv-endpoint", "a b:1", expect="'a b' is not a host name"),
    case(*MULTI, "--rdzv-endpoint", "host:99999", expect="has an invalid port: use a number from 0 to 65535"),
    case(*MULTI, "--rdzv-endpoint", "host:http", expect="has an invalid port"),
    case(*MULTI, "--rdzv-endpoint", "host:٢٩٤٠٠", expect="has an invalid port"),
    case(*MULTI, "--rdzv-endpoint", "host:", expect="has an invalid port"),
    case(*MULTI, "--rdzv-endpoint", "[::1", expect="IPv6 looks like [::1]:29400"),
    case(*MULTI, "--rdzv-endpoint", "[::1]x", expect="IPv6 looks like [::1]:29400"),
    case(*MULTI, "--rdzv-endpoint", "[127.0.0.1]:1", expect="brackets are for IPv6 addresses"),
    case(*MULTI, "--rdzv-endpoint", ":29400", expect="has no host"),
    case(*MULTI, "--rdzv-endpoint", "bücher.example:1", expect="is not a host name"),
    case(*MULTI, "--rdzv-endpoint", "h\n:1", expect="'h\\n' is not a host name"),
    case(*MULTI, expect="':::' is not an IPv6 address", env={"PET_RDZV_ENDPOINT": ":::"}),
    case("--rdzv-backend", "static", "--rdzv-endpoint", "a b", expect="'a b' is not a host name"),
    # A host that cannot exist is a usage error too (RFC 6761: .invalid never resolves, no DNS asked).
    case(*MULTI, "--rdzv-endpoint", "no-such-host.invalid:29400",
         expect="rendezvous endpoint 'no-such-host.invalid:29400': " + UNRESOLVABLE),
    case("--rdzv-backend", "c10d", "--rdzv-endpoint", "no-such-host.invalid:29400", expect=UNRESOLVABLE),
    # etcd, through the installed plugin: the endpoint and every --rdzv-conf value, before any connection.
    case(*ETCD, expect="the etcd rendezvous needs --rdzv-endpoint host[:port]", env=WITH_ETCD),
    case(*ETCD, "--rdzv-endpoint", ":::", expect="':::' is not an IPv6 address", env=WITH_ETCD),
    case(*ETCD, "--rdzv-endpoint", "a b:1", expect="'a b' is not a host name", env=WITH_ETCD),
    case(*ETCD, "--rdzv-endpoint", "no-such-host.invalid:2379",
         expect="--rdzv-endpoint 'no-such-host.invalid:2379': " + UNRESOLVABLE, env=WITH_ETCD),
    case(*ETCD, "--rdzv-endpoint", "a.invalid,b.invalid:2379",
         expect="cannot resolve any of the hosts 'a.invalid', 'b.invalid'", env=WITH_ETCD),
    case(*ETCD, "--rdzv-endpoint", "127.0.0.1:2379", "--rdzv-conf", "timeout=nan", expect=TIMEOUT + ", got 'nan'",
         env=WITH_ETCD),
    case("--nnodes", "2", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "127.0.0.1:2379", "--rdzv-conf",
         "join_timeout=abc", expect=JOIN + ", got 'abc'", env=WITH_ETCD),
    case(*ETCD, "--rdzv-endpoint", "127.0.0.1:2379", "--rdzv-conf", "store_type=tcp",
         expect="'store_type' is unknown to the etcd backend", env=WITH_ETCD),
    # Logs, the interpreter, the script.
    case("--log-dir", "/proc/x", expect="--log-dir '/proc/x' cannot be created or written"),
    case("--log-dir", "{file}/sub", expect="cannot be created or written: Not a directory"),
    case("--log-dir", "{file}", expect="is a file, not a directory"),
    case(expect="PYTHON_EXEC='/no/such/python' names no executable program", env={"PYTHON_EXEC": "/no/such/python"}),
    case(expect="PYTHON_EXEC='no-such-python-xyz' names no executable", env={"PYTHON_EXEC": "no-such-python-xyz"}),
    case(expect="PYTHON_EXEC='' names no executable program", env={"PYTHON_EXEC": ""}),
    case(expect="names no executable program", env={"PYTHON_EXEC": "{dir}"}),
    case("-m", "", expect="the module name is empty", script=False),
    case("", expect="the script name is empty", script=False),
    case("--no-python", "", expect="the program name is empty", script=False),
    case("-m", "a b", expect="-m 'a b' is not a module name", script=False),
    case("/nonexistent/train.py", expect="script '/nonexistent/train.py' not found", script=False),
    case("--run-path", "/nonexistent/train.py", expect="--run-path needs a Python file", script=False),
    case("--no-python", "/nonexistent/prog", expect="not found or not executable", script=False),
    case("--no-python", "-m", expect="cannot be used together"),
    case("scr\nipt.py", expect="script 'scr\\nipt.py' not found", script=False),
    # Plugin names: the choices, the closest first, and the distribution for names shipped here.
    case("--rdzv-backend", "nosuch", expect="unknown rendezvous backend 'nosuch': choose one of c10d, static"),
    case("--rdzv_backend", "statc", expect="did you mean static? choose one of"),
    case("--rdzv-backend", "etcd", expect="not on PyPI: pip install ./plugins/launcher-etcd from a launcher checkout",
         env=NO_AUTOLOAD),
    case("--rdzv-backend", "etcd-v2", expect="./plugins/launcher-etcd", env=NO_AUTOLOAD),
    case("--rdzv-backend", "c1\n0d", expect="unknown rendezvous backend 'c1\\n0d'"),
    case("--logs-specs", "jsonlogs", expect="pip install ./plugins/launcher-jsonlogs", env=NO_AUTOLOAD),
    case("--logs-specs", "", expect="unknown logs specs ''"),
    case("--event-log-handler", "webhook", expect="pip install ./plugins/launcher-webhook", env=NO_AUTOLOAD),
    case("--event-log-handler", "", expect="--event-log-handler '' names no event handler name"),
    case("--event-log-handler", "null,,console", expect="--event-log-handler 'null,,console' has an empty event"),
    case("--event-log-handler", "null,nosuch", expect="unknown event handler 'nosuch'"),
    case("--numa-binding", "nodes", expect="did you mean node? choose one of"),
    case("--numa_binding", "x" * 500, expect="unknown numa strategy 'xxxx"),
    case("--health-checks", "gpuu", expect="unknown health check 'gpuu': did you mean gpu?"),
    case("--health-checks", "gpu,,disk", expect="--health-checks 'gpu,,disk' has an empty name"),
    case("--health-checks", "mounts", expect="pip install ./plugins/launcher-nodecheck", env=NO_AUTOLOAD),
    case(expect="PET_HEALTH_CHECKS 'none,gpu': 'none' turns every check off", env={"PET_HEALTH_CHECKS": "none,gpu"}),
    case("--health-check-cmd", "/nonexistent/check", expect="--health-check-cmd '/nonexistent/check' does not exist"),
    case("--health-check-cmd", "/", expect="--health-check-cmd '/' is not a file"),
    case("--health-check-cmd", "/bin/true", "--health-checks", "gpu", expect="leaves out the 'command' check"),
    # Everything else.
    case("--start-method", "teleport", expect="--start-method must be spawn, fork or forkserver"),
    case("--signals-to-handle", "SIGNOPE", expect="'SIGNOPE' is not a signal the launcher can forward"),
    case("--signals-to-handle", "SIGKILL", expect="'SIGKILL' is not a signal"),
    case("--signals-to-handle", "", expect="--signals-to-handle '' names no signal"),
    case("--signals-to-handle", "SIGTERM,,SIGINT", expect="--signals-to-handle 'SIGTERM,,SIGINT' has an empty item"),
    case(expect="--signals-to-handle ',' names no signal", env={"PET_SIGNALS_TO_HANDLE": ","}),
    case("--standalone", "--nnodes", "2", expect="--nnodes '2' with --standalone: a standalone job is one node"),
    case("--standalone", "--nnodes", "1:2", expect="--nnodes '1:2' with --standalone"),
    case(expect="PET_NNODES '1:4' with --standalone", env={"PET_STANDALONE": "1", "PET_NNODES": "1:4"}),
    case("--numa-fallback", "maybe", expect="invalid choice: 'maybe'"),
    case("--hang-timeout", "1e999", expect="--hang-timeout must be a number of seconds above 0 and at most 604800"),
    case("--hang-timeout", "+5", expect="--hang-timeout must be a number of seconds above 0"),
    case("--role", "", expect="--role must be a non-empty name"),
    case("--role", "a\nb", expect="--role must be a non-empty name without control characters, got 'a\\nb'"),
    case("--no-such-flag", expect="unrecognized arguments: --no-such-flag"),
    case("--no-such\nflag", expect="unrecognized arguments: --no-such\\nflag"),
    # Abbreviations: torchrun's flags take any unambiguous prefix; launcher's own flags none.
    case("--nproc=2", expect="ambiguous option: --nproc=2 could match --nproc-per-node, --nproc_per_node"),
    case("--numa=node", expect="ambiguous option: --numa=node could match --numa-binding, --numa_binding"),
    case("--exit-barrier=5", expect="launcher's own flags are never abbreviated: did you mean --exit-barrier-timeout?"),
    case("--prel", "torch", expect="unrecognized arguments: --prel (launcher's own flags are never abbreviated"),
    case("--nnodes", expect="expected one argument", script=False),
    case(expect="no script given; usage: launcher [options] SCRIPT", script=False),
    case(expect="PET_STANDALONE='maybe' is not a switch value", env={"PET_STANDALONE": "maybe"}),
    case(expect="PET_VIRTUAL_LOCAL_RANK='2' is not a switch value", env={"PET_VIRTUAL_LOCAL_RANK": "2"}),
    case(expect="LAUNCHER_DISABLE_PLUGIN_AUTOLOAD='maybe' is not a switch value: use 1 or 0",
         env={"LAUNCHER_DISABLE_PLUGIN_AUTOLOAD": "maybe"}),
    case(expect="LOGLEVEL='bogus' is not a log level: use DEBUG, INFO, WARNING, ERROR or CRITICAL",
         env={"LOGLEVEL": "bogus"}),
    case("plugins", expect="LOGLEVEL='x' is not a log level", env={"LOGLEVEL": "x"}, script=False),
    case("plugins", "--bogus", expect="launcher plugins: unknown argument '--bogus'", script=False),
    # Limits of the machine, checked before anything starts.
    case("--nproc-per-node", "64", nofile=100,
         expect="needs at least 208 open files in the launcher, but the limit (ulimit -n) is 100"),
    # A usage error is exit status 2 even when it cannot be said (stderr full or closed).
    case("--nproc-per-node", "0", expect="", stderr="full"),
    case("--nproc-per-node", "0", expect="", stderr="closed"),
    case("--standalone", "--nnodes", "2", expect="", stderr="closed"),
    case(expect="", env={"LOGLEVEL": "bogus"}, stderr="full"),
]


@dataclass
class Outcome:
    returncode: int | None
    stderr: str
    seconds: float
    worker_started: bool


def _fill(text: str, paths: dict[str, str]) -> str:
    for name, value in paths.items():
        text = text.replace("{" + name + "}", value)
    return text


def _forkable(entry: Case) -> bool:
    """Whether the case needs nothing of a fresh interpreter: no PYTHONPATH, limits or redirected stderr."""
    return entry.nofile is None and entry.stderr == "pipe" and "PYTHONPATH" not in entry.env


def _command_line(index: int, entry: Case, root: Path) -> tuple[list[str], dict[str, str], Path]:
    """The case's arguments and environment, placeholders filled in, and its marker file."""
    marker = root / f"started-{index}"
    paths = {"script": str(root / "marker.py"), "file": str(root / "a-file"), "dir": str(root),
             "etcd": f"{root / 'etcd-site'}{os.pathsep}{ETCD_PLUGIN}"}
    args = [_fill(arg, paths) for arg in entry.args]
    env = launcher_env({"MARKER_FILE": str(marker), **{k: _fill(v, paths) for k, v in entry.env.items()}})
    return args, env, marker


def _run_forked(cases: dict[int, Case], root: Path) -> dict[int, Outcome]:
    """The cases run by corpus_forks.py: each a fork of one interpreter that imported the CLI once."""
    lines = {i: _command_line(i, entry, root) for i, entry in cases.items()}
    request = {
        "parallel": PARALLEL,
        "timeout": HANG_GUARD_S,
        "cases": [{"args": args, "env": env, "cwd": str(root), "stderr": str(root / f"stderr-{i}")}
                  for i, (args, env, _) in lines.items()],
    }  # fmt: skip
    result = subprocess.run([sys.executable, str(FORKS)], input=json.dumps(request), capture_output=True,
                            text=True, env=launcher_env(), cwd=root, timeout=HANG_GUARD_S * len(cases))  # fmt: skip
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)
    return {
        i: Outcome(answer["code"], (root / f"stderr-{i}").read_text(errors="replace"), answer["seconds"],
                   marker.exists())
        for (i, (_, _, marker)), answer in zip(lines.items(), answers, strict=True)
    }  # fmt: skip


def _run(index: int, entry: Case, root: Path) -> Outcome:
    """One case as a new ``python -m launcher`` process."""
    args, env, marker = _command_line(index, entry, root)
    command = [sys.executable, "-m", "launcher", *args]
    if entry.nofile is not None:
        command = ["sh", "-c", f'ulimit -n {entry.nofile} && exec "$@"', "sh", *command]
    if entry.stderr != "pipe":
        redirect = {"full": "2>/dev/full", "closed": "2>&-"}[entry.stderr]
        command = ["sh", "-c", f'exec "$@" {redirect}', "sh", *command]
    started = time.monotonic()
    try:
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S,
                                cwd=root)
        code, stderr = result.returncode, result.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    return Outcome(code, stderr, time.monotonic() - started, marker.exists())


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Outcome]]:
    root = tmp_path_factory.mktemp("corpus")
    (root / "marker.py").write_text("import os\nopen(os.environ['MARKER_FILE'], 'a').write('x')\n")
    (root / "a-file").write_text("not a directory\n")
    script = root / "marker.py"
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    _install_etcd_metadata(root / "etcd-site")
    forked = {i: entry for i, entry in enumerate(CORPUS) if _forkable(entry)}
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        futures = {i: pool.submit(_run, i, entry, root) for i, entry in enumerate(CORPUS) if i not in forked}
        results = _run_forked(forked, root)
        results.update({i: future.result() for i, future in futures.items()})
    yield results


def _install_etcd_metadata(site: Path) -> None:
    """launcher-etcd "installed" from this tree: its entry point's metadata, the code on PYTHONPATH.

    What ``pip install`` would leave for the plugin manager to find, without a build (seconds).
    """
    entry_point = 'etcd = "launcher_etcd.plugin"'
    assert entry_point in (ETCD_PLUGIN / "pyproject.toml").read_text(), "launcher-etcd's entry point changed"
    info = site / "launcher_etcd-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: launcher-etcd\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[launcher]\netcd = launcher_etcd.plugin\n")


def test_the_corpus_is_large_and_distinct() -> None:
    assert len(CORPUS) >= 120
    assert len({(c.args, tuple(c.env.items()), c.stderr) for c in CORPUS}) == len(CORPUS)
    assert all(c.stderr in ("pipe", "full", "closed") for c in CORPUS)


@pytest.mark.parametrize("index", range(len(CORPUS)), ids=[c.id for c in CORPUS])
def test_bad_input_is_one_line_its_exit_status_and_starts_nothing(index: int, outcomes: dict[int, Outcome]) -> None:
    entry, outcome = CORPUS[index], outcomes[index]
    assert outcome.returncode is not None, f"no answer within {HANG_GUARD_S} s: {outcome.stderr!r}"
    assert "Traceback" not in outcome.stderr, outcome.stderr
    if entry.stderr == "pipe":
        lines = outcome.stderr.splitlines()
        assert len(lines) == 1 and outcome.stderr.endswith("\n"), outcome.stderr
        assert lines[0].startswith("launcher: error: "), lines[0]
        assert entry.expect in lines[0], lines[0]
    assert outcome.returncode == entry.code, outcome.stderr
    assert not outcome.worker_started, "a worker started despite the error"


def test_good_input_next_to_the_corpus_runs(tmp_path: Path) -> None:
    """The marker script does start when the input is fine (so the corpus' check can fail)."""
    (tmp_path / "marker.py").write_text("import os\nopen(os.environ['MARKER_FILE'], 'a').write('x')\n")
    marker = tmp_path / "started"
    result = subprocess.run(
        [sys.executable, "-m", "launcher", "--nproc-per-node", "1", "--monitor-interval", "0.5",
         "--rdzv-conf", "join_timeout=30", "--standalone", str(tmp_path / "marker.py")],
        env=launcher_env({"MARKER_FILE": str(marker)}), capture_output=True, text=True, timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert marker.exists()
    assert os.path.getsize(marker) == 1


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"nproc_per_node": 0}, "--nproc-per-node must be an integer from 1 to 4096, got '0'"),
        ({"nproc_per_node": "٣"}, "--nproc-per-node must be an integer from 1 to 4096, got '٣'"),
        ({"nproc_per_node": True}, "--nproc-per-node must be an integer"),
        ({"min_nodes": 2, "max_nodes": 1}, "LaunchConfig.max_nodes must be an integer from 2 to 100000"),
        ({"max_restarts": -1}, "--max-restarts must be an integer from 0 to 100000"),
        ({"monitor_interval": float("inf")}, "--monitor-interval must be a number of seconds above 0"),
        ({"shutdown_timeout": float("nan")}, "--shutdown-timeout must be a number of seconds from 0 to 604800"),
        ({"exit_barrier_timeout": -1.0}, "--exit-barrier-timeout must be"),
        ({"local_ranks_filter": {1}}, "--local-ranks-filter rank must be an integer from 0 to 0"),
        ({"redirects": {3: 1}}, "--redirects local rank must be an integer from 0 to 0"),
        ({"role": "a\nb"}, "--role must be a non-empty name"),
    ],
)
def test_the_python_api_checks_numbers_as_the_command_line_does(fields: dict, words: str) -> None:
    from launcher import LaunchConfig
    from launcher.errors import UsageError

    with pytest.raises(UsageError, match=words.replace("(", r"\(")):
        LaunchConfig(**fields)


def test_the_python_api_checks_rdzv_conf_and_log_dir_before_starting(tmp_path: Path) -> None:
    from launcher import LaunchConfig, launch
    from launcher.errors import UsageError

    with pytest.raises(UsageError, match="join_timeout must be a number of seconds above 0"):
        launch(LaunchConfig(rdzv_configs={"join_timeout": "nan"}), "/no/such/program")()
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="--log-dir .* cannot be created or written"):
        launch(LaunchConfig(log_dir=str(tmp_path / "f" / "sub")), "/no/such/program")()
