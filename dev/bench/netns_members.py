"""Fleet members reached over real SSH: one network namespace and one sshd per member (issue #30).

``dev/bench/fleet.py --members ssh`` puts each staged host behind its own address: a network
namespace ``gpf-mNNNN`` whose ``eth0`` is one end of a veth pair, the other end (``gpf-hNNNN``)
on one bridge (``gpf-br0``, 10.213.0.1/16) in the controller's namespace, and an ``sshd -D``
started inside the namespace on the member's address (10.213.0.2, .3, ...). The bench generates a
throwaway host key and client key in a temp dir; sshd takes only that key, for root (the bench
runs as root to make namespaces). Ansible reaches each member as a remote host (ssh, pipelining,
``/usr/bin/python3``: the system's Python, as a real Debian host has, not the bench's venv);
the module reads the member's staged root (``gpuprov_root``), which the namespace shares with
the controller's filesystem.

Why namespaces, not containers: a member costs one idle sshd (10 MB resident, mostly shared; no CPU) and six
``ip`` batch lines, so 200 members start in seconds on 2 cores and the connection is real TCP + SSH
to a separate sshd per host; 200 containers would each carry a runtime shim and an init, and
their start-up and memory would compete with the plays being timed. What namespaces leave out
against real hosts: the members share the controller's CPUs (a member's module time is on the
same 2 cores, as with the local connection) and the network is a bridge, not a wire.

Everything is torn down by :meth:`SshMembers.close` (the bench calls it in ``finally``, and
turns SIGTERM/SIGHUP into an exit so that runs): the ssh masters a play left (the bench is their
subreaper: it ends and reaps them after each play, so their CPU counts) and each sshd ended, each
by its own pid; the veth pairs, namespaces and the bridge deleted; the keys removed. Needs root,
``ip`` (iproute2), ``/usr/sbin/sshd`` (openssh-server), ``ssh`` and ``ssh-keygen``
(openssh-client).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SSHD = "/usr/sbin/sshd"
MEMBER_PYTHON = "/usr/bin/python3"  # the system's Python on the member, as on a real host
NETWORK = ipaddress.ip_network("10.213.0.0/16")
BRIDGE = "gpf-br0"
NS_PREFIX, VETH_PREFIX = "gpf-m", "gpf-h"  # interface names: 15 characters at most
# What --members ssh runs, and the Debian package that has it.
NEEDS = {"ip": "iproute2", SSHD: "openssh-server", "ssh": "openssh-client", "ssh-keygen": "openssh-client"}
READY_SECONDS = 60.0
PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


class MembersRefused(Exception):
    """The machine cannot host SSH members (not root, a tool missing, a previous run's leftovers)."""


def names(i: int) -> tuple[str, str]:
    """Member ``i``'s (1-based) namespace and the host end of its veth pair."""
    return f"{NS_PREFIX}{i:04d}", f"{VETH_PREFIX}{i:04d}"


def address(i: int) -> str:
    """Member ``i``'s address: the bridge has the network's first, member 1 the second."""
    if not 1 <= i < NETWORK.num_addresses - 2:
        raise ValueError(f"member {i}: {NETWORK} holds {NETWORK.num_addresses - 3} members")
    return str(NETWORK.network_address + 1 + i)


def network_up(count: int) -> str:
    """``ip -batch`` lines, in the controller's namespace: the bridge, then each member's namespace
    and veth pair (its ``eth0`` moved into the namespace, the host end on the bridge)."""
    gateway = f"{NETWORK.network_address + 1}/{NETWORK.prefixlen}"
    lines = [f"link add {BRIDGE} type bridge", f"addr add {gateway} dev {BRIDGE}", f"link set {BRIDGE} up"]
    for i in range(1, count + 1):
        ns, veth = names(i)
        lines += [
            f"netns add {ns}",
            f"link add {veth} type veth peer name eth0 netns {ns}",
            f"link set {veth} master {BRIDGE} up",
        ]
    return "\n".join(lines) + "\n"


def member_link(i: int) -> str:
    """``ip -n NS -batch`` lines inside member ``i``'s namespace: loopback and its address up."""
    return f"link set lo up\naddr add {address(i)}/{NETWORK.prefixlen} dev eth0\nlink set eth0 up\n"


def network_down(count: int) -> str:
    """``ip -force -batch`` lines undoing :func:`network_up` (each line may fail: a partial start)."""
    lines = [f"link del {names(i)[1]}" for i in range(1, count + 1)]
    lines += [f"netns del {names(i)[0]}" for i in range(1, count + 1)]
    return "\n".join([*lines, f"link del {BRIDGE}"]) + "\n"


def sshd_config(keys: Path) -> str:
    """One sshd_config for every member (each adds its ListenAddress): the bench's keys only."""
    return (
        "Port 22\n"
        f"HostKey {keys / 'host_key'}\n"
        f"AuthorizedKeysFile {keys / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        # The keys live below /tmp, which is world-writable: StrictModes would refuse the path.
        "StrictModes no\n"
        "PidFile none\nUseDNS no\nPrintMotd no\nPrintLastLog no\nLogLevel ERROR\n"
        # A fork run opens one connection a host; room for a --forks larger than sshd's default 10.
        "MaxStartups 200\n"
        "Subsystem sftp internal-sftp\n"
    )


def sshd_command(i: int, config: Path) -> list[str]:
    """Member ``i``'s sshd, in the foreground (its pid is ours to end), inside its namespace."""
    ns, _veth = names(i)
    return ["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(config), "-o", f"ListenAddress={address(i)}"]


def connection(i: int, key: Path) -> dict[str, str]:
    """Member ``i``'s inventory variables: ssh as root with the bench's key, the system Python."""
    return {
        "ansible_connection": "ssh",
        "ansible_host": address(i),
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(key),
        # Throwaway host keys: nothing to check, and nothing written to ~/.ssh/known_hosts.
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        "-o IdentitiesOnly=yes -o LogLevel=ERROR",
        "ansible_python_interpreter": MEMBER_PYTHON,
    }


def missing() -> list[str]:
    """What this machine lacks for SSH members, as the fix to run; empty when it has it all."""
    problems = []
    if os.geteuid() != 0:
        problems.append("run as root (network namespaces and a bridge are made)")
    packages = sorted({pkg for tool, pkg in NEEDS.items() if shutil.which(tool) is None})
    if packages:
        problems.append(f"apt-get install {' '.join(packages)}")
    return problems


def _ip(args: list[str], batch: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args, "-batch", "-"], input=batch, capture_output=True, text=True, check=False)


def children(pid: int) -> list[int]:
    """The live children of single-threaded process ``pid``."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def leftovers() -> list[str]:
    """A previous run's bridge or namespaces (one killed with SIGKILL could not tear them down)."""
    found = [BRIDGE] if Path(f"/sys/class/net/{BRIDGE}").exists() else []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return found + [line.split()[0] for line in listed.splitlines() if line.startswith(NS_PREFIX)]


class SshMembers:
    """``count`` members, each a network namespace with its own sshd; :meth:`close` undoes it all."""

    def __init__(self, work: Path, count: int) -> None:
        self.count = count
        self.keys = Path(tempfile.mkdtemp(prefix="ssh-", dir=work))  # mode 0700
        self.key = self.keys / "client_key"
        self.sshd: list[subprocess.Popen[bytes]] = []
        self._up = False
        self._reaper = False

    def start(self) -> None:
        problems = missing()
        if problems:
            raise MembersRefused("--members ssh needs: " + "; ".join(problems))
        stale = leftovers()
        if stale:
            raise MembersRefused(
                f"--members ssh: a previous run left {', '.join(stale[:3])}{' ...' if len(stale) > 3 else ''}: end "
                f"their sshd (ip netns pids NS), then `ip link del {BRIDGE}` and `ip netns del NS` for each"
            )
        for name in ("host_key", "client_key"):
            subprocess.run(
                [
                    "ssh-keygen",
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    "gpuprov-fleet-bench",
                    "-f",
                    str(self.keys / name),
                ],
                check=True,
            )
        shutil.copyfile(self.keys / "client_key.pub", self.keys / "authorized_keys")
        config = self.keys / "sshd_config"
        config.write_text(sshd_config(self.keys))
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        # ssh's ControlPersist masters detach from ansible-playbook: as their subreaper this process
        # ends and reaps them after each play, so their CPU (the client side of every connection)
        # is in its RUSAGE_CHILDREN, as a local run's is.
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise MembersRefused(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")
        self._reaper = True
        self._up = True  # from here on, close() has something to undo
        made = _ip(["-force"], network_up(self.count))
        if made.returncode != 0:
            raise MembersRefused(f"ip -batch could not make the members' network: {made.stderr.strip()[-500:]}")
        log = (self.keys / "sshd.log").open("ab")
        for i in range(1, self.count + 1):
            linked = _ip(["-n", names(i)[0]], member_link(i))
            if linked.returncode != 0:
                raise MembersRefused(f"member {i}'s namespace: {linked.stderr.strip()[-500:]}")
            self.sshd.append(subprocess.Popen(sshd_command(i, config), stdout=log, stderr=log))
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Every sshd accepting on its address (a TCP connect through the bridge)."""
        waiting = set(range(1, self.count + 1))
        deadline = time.monotonic() + READY_SECONDS
        while waiting:
            for i in sorted(waiting):
                if self.sshd[i - 1].poll() is not None:
                    said = (self.keys / "sshd.log").read_text(errors="replace")[-500:]
                    raise MembersRefused(f"member {i}'s sshd exited ({self.sshd[i - 1].returncode}): {said}")
                with contextlib.suppress(OSError), socket.create_connection((address(i), 22), timeout=1):
                    waiting.discard(i)
            if waiting and time.monotonic() > deadline:
                raise MembersRefused(f"{len(waiting)} members' sshd not accepting after {READY_SECONDS:.0f} s")
            if waiting:
                time.sleep(0.1)

    def connection(self, i: int) -> dict[str, str]:
        return connection(i, self.key)

    def cpu(self) -> float:
        """CPU seconds so far of the members' side: each sshd and what it reaped (its sessions, their
        shells and module runs). The bench's own RUSAGE_CHILDREN has none of it until sshd exits."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for proc in self.sshd:
            with contextlib.suppress(OSError):
                # /proc/PID/stat: utime, stime, cutime, cstime are fields 14-17 (after "(comm)").
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += sum(int(f) for f in fields[11:15])
        return total / tick

    @contextlib.contextmanager
    def session(self, env: dict[str, str]) -> Iterator[dict[str, str]]:
        """One play's environment: its own ssh ControlPath dir, so each play opens its connections
        afresh (else a play would reuse the masters the previous play left for 60 s, or another
        user's). After it, outside its timing, its masters are ended and reaped, and the sshds have
        reaped their side."""
        control = Path(tempfile.mkdtemp(prefix="cp-", dir=self.keys))
        try:
            yield {**env, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control)}
        finally:
            self._end_orphans()
            shutil.rmtree(control, ignore_errors=True)
            self._settle()

    def _end_orphans(self) -> None:
        """End this process's children other than the sshds, by their pids, and reap them: once
        ansible-playbook has exited, the ssh masters it left us; once the sshds have exited, the
        connections they served (sshd leaves them running)."""
        if not self._reaper:
            return
        ours = {proc.pid for proc in self.sshd}
        began = time.monotonic()
        while time.monotonic() - began < 10:
            left = [pid for pid in children(os.getpid()) if pid not in ours]
            if not left:
                return
            # SIGTERM first (a master closes its connection cleanly), SIGKILL after 5 s.
            sig = signal.SIGTERM if time.monotonic() - began < 5 else signal.SIGKILL
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            time.sleep(0.02)

    def _settle(self) -> None:
        """Wait until every sshd has reaped its connections: a module run's CPU reaches the sshd's
        own counters (:meth:`cpu`) only once the connection that ran it has closed."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(children(proc.pid) for proc in self.sshd):
            time.sleep(0.05)

    def close(self) -> None:
        """End each sshd by its pid, delete the veths, namespaces and bridge, remove the keys."""
        self._end_orphans()  # an interrupted play's ssh masters
        for proc in self.sshd:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.sshd:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # Connections still open (an interrupted play's) outlive their sshd, and once the network is
        # gone no FIN would ever end them.
        self._end_orphans()
        if self._up:
            _ip(["-force"], network_down(self.count))
        shutil.rmtree(self.keys, ignore_errors=True)
