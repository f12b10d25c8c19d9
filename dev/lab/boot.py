"""The running lab host: QEMU's command line, up (boot, wait for SSH), the boot watchdog, down."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

from . import debpkg
from .common import (
    DEFAULT_PORT,
    HOSTNAME,
    OVMF_CODE,
    OVMF_VARS,
    PORT_ENV,
    RUN_TOOLS,
    LabError,
    default_port,
    ensure_tools,
    inventory_overrides,
    overrides_option,
    say,
)
from .image import DEFAULT_LOADER, ensure_image

# ---------------------------------------------------------------- the running lab host

QMP_EVENTS = "qmp-events.sock"  # the QMP monitor `watchdog` listens on for QEMU's events


def run_dir(lab: Path) -> Path:
    return lab / "run"


def read_state(lab: Path) -> dict:
    try:
        return json.loads((run_dir(lab) / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def qemu_pid(lab: Path) -> int | None:
    """The lab's QEMU process, if it runs."""
    try:
        pid = int((run_dir(lab) / "qemu.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"qemu-system" in cmdline and str(run_dir(lab)).encode() in cmdline else None


def esp_drive(lab: Path, image: Path, loader: str) -> str:
    """The ESP: GRUB's read-only (the cached image: nothing writes it); systemd-boot's on a
    copy-on-write overlay (run/esp.qcow2): bootctl and kernel-install write it."""
    if loader == "grub":
        return f"if=none,id=esp,format=raw,readonly=on,file={image / 'esp.img'}"
    return f"if=none,id=esp,format=qcow2,file={run_dir(lab) / 'esp.qcow2'}"


# Two NUMA nodes (issue #29): node N has CPUs 2N and 2N+1 and half the memory, and a
# pcie-expander-bus (pxb-pcie, numa_node=N: the kernel reads its _PXM) with one root port and one
# pci-testdev (1b36:0005, class 0x00ff) whose 64-bit prefetchable BAR 2 is LARGE_BAR_GIB GiB
# (`membar`: an empty region, no memory behind it), an H100's or H200's BAR1. Together the two
# BARs (256 GiB) exceed the 64-bit MMIO window OVMF gives a guest by default: 32 GiB, or since
# edk2 2022.11 an eighth of the guest's physical address space (128 GiB at QEMU's 40 bits; seen
# on the lab: two 32 GiB BARs fit it). A VM given both boots only with its window sized (gpuprov's
# domain builder: X-PciMmio64Mb). The lab host's own OVMF is told its window here.
# (Not ivshmem: a memory controller by class, which gpuprov rightly keeps on the host.)
NODE_MEMORY_MIB = (1536, 1536)
LARGE_BAR_GIB = 128
LARGE_BAR_BUS = (0x20, 0x30)  # the expander buses: the devices are 0000:21:00.0 and 0000:31:00.0
HOST_MMIO64_MIB = 512 * 1024


# `up --one-node`: the lab host as before issue #29 (molecule/lab_boot's boot trials need neither
# the second node nor the large BARs, and keep their timings).
ONE_NODE_ARGV = ["-smp", "2", "-m", "2048"]


def two_node_argv() -> list[str]:
    """Memory, vCPUs, each node and the devices on it, and the lab's OVMF window."""
    argv = ["-m", str(sum(NODE_MEMORY_MIB)), "-smp", str(2 * len(NODE_MEMORY_MIB))]
    argv += ["-fw_cfg", f"name=opt/ovmf/X-PciMmio64Mb,string={HOST_MMIO64_MIB}"]
    for node, (mib, bus) in enumerate(zip(NODE_MEMORY_MIB, LARGE_BAR_BUS)):
        argv += [
            "-object",
            f"memory-backend-ram,id=ram{node},size={mib}M",
            "-numa",
            f"node,nodeid={node},cpus={2 * node}-{2 * node + 1},memdev=ram{node}",
            "-device",
            f"pxb-pcie,id=pxb{node},bus_nr={bus},numa_node={node},bus=pcie.0,addr={0x8 + node:#x}",
            "-device",
            f"pcie-root-port,id=rpn{node},bus=pxb{node},chassis={10 + node},slot=0",
            "-device",
            f"pci-testdev,membar={LARGE_BAR_GIB}G,bus=rpn{node}",
        ]
    return argv


def qemu_argv(lab: Path, image: Path, port: int, loader: str = DEFAULT_LOADER, one_node: bool = False) -> list[str]:
    run = run_dir(lab)
    return [
        *debpkg.QEMU_HOST,
        "-name",
        HOSTNAME,
        *(ONE_NODE_ARGV if one_node else two_node_argv()),
        "-nodefaults",
        "-display",
        "none",
        "-drive",
        f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
        "-drive",
        f"if=pflash,format=raw,unit=1,file={run / 'OVMF_VARS.fd'}",
        # The root disk (/dev/vda, the overlay) and the ESP (/dev/vdb).
        "-drive",
        f"if=none,id=root,format=qcow2,file={run / 'root.qcow2'}",
        "-device",
        "virtio-blk-pci,drive=root,bus=pcie.0,addr=0x4,bootindex=1",
        "-drive",
        esp_drive(lab, image, loader),
        "-device",
        "virtio-blk-pci,drive=esp,bus=pcie.0,addr=0x5,bootindex=0",
        # The machine's hardware watchdog (Intel 6300ESB, Linux's i6300esb module): armed and
        # then no longer fed, it resets the machine (issue 16's trial boots). QEMU reports it
        # as a QMP WATCHDOG event (the second QMP socket, logged by `watchdog`).
        "-device",
        "i6300esb,bus=pcie.0,addr=0x6",
        "-action",
        "watchdog=reset",
        # Every reset of the machine (Linux's reboot, a panic's, the i6300esb's, the lab BMC's
        # system_reset) ends this QEMU, and `watchdog` starts a new one on the same disks and
        # firmware variables: a cold start. Under TCG a warm reset keeps the translated code of
        # the last boot, and OVMF and GRUB then crawl or stall for minutes writing over it (the
        # reset spin; "Welcome to GRUB!" and no more on three resets in a row, issue #26 item 8).
        "-action",
        "reboot=shutdown",
        # edu A: alone behind a root port.
        "-device",
        "pcie-root-port,id=rp1,bus=pcie.0,addr=0x1,chassis=1",
        "-device",
        "edu,bus=rp1",
        # edu B (function 0) with an HD-audio companion (function 1) behind a root port.
        "-device",
        "pcie-root-port,id=rp2,bus=pcie.0,addr=0x2,chassis=2",
        "-device",
        "edu,bus=rp2,addr=0x0.0,multifunction=on",
        "-device",
        "ich9-intel-hda,id=hda,bus=rp2,addr=0x0.1",
        "-audiodev",
        "none,id=snd0",
        "-device",
        "hda-output,bus=hda.0,audiodev=snd0",
        # edu C and the management NIC behind one PCIe-to-PCI bridge: one IOMMU group.
        "-device",
        "pcie-root-port,id=rp3,bus=pcie.0,addr=0x3,chassis=3",
        "-device",
        "pcie-pci-bridge,id=br1,bus=rp3",
        "-device",
        "edu,bus=br1,addr=0x1",
        "-device",
        "e1000,netdev=n0,mac=52:54:00:00:00:02,bus=br1,addr=0x2",
        "-netdev",
        f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
        "-chardev",
        # append: a power cycle of the lab's BMC (a new QEMU) keeps the log; `up` empties it.
        f"file,id=ser0,path={run / 'console.log'},append=on",
        "-serial",
        "chardev:ser0",
        "-qmp",
        f"unix:{run / 'qmp.sock'},server=on,wait=off",
        "-qmp",
        f"unix:{run / QMP_EVENTS},server=on,wait=off",
        "-pidfile",
        str(run / "qemu.pid"),
        "-daemonize",
    ]


def ssh_argv(lab: Path, port: int, tty: bool = False) -> list[str]:
    return [
        "ssh",
        "-i",
        str(lab / "id_ed25519"),
        "-p",
        str(port),
        "-o",
        f"UserKnownHostsFile={lab / 'known_hosts'}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ConnectTimeout=10",
        *(["-t"] if tty else []),
        "root@127.0.0.1",
    ]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        # As QEMU binds it: SO_REUSEADDR, so TIME_WAIT from earlier SSH sessions does not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for_ssh(lab: Path, port: int, timeout: float) -> float:
    """Seconds until SSH runs a command; LabError (with the console's tail) if it never does."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if qemu_pid(lab) is None:
            raise LabError(f"QEMU exited while booting; console:\n{console_tail(lab)}")
        with suppress(subprocess.TimeoutExpired):
            r = subprocess.run([*ssh_argv(lab, port), "true"], capture_output=True, timeout=30, check=False)
            if r.returncode == 0:
                return time.monotonic() - t0
        time.sleep(2)
    raise LabError(f"no SSH on 127.0.0.1:{port} after {timeout:.0f} s; console:\n{console_tail(lab)}")


def console_tail(lab: Path, chars: int = 3000) -> str:
    try:
        return (run_dir(lab) / "console.log").read_text(errors="replace")[-chars:]
    except OSError:
        return "(no console log)"


def up(
    lab: Path,
    port: int,
    fresh: bool,
    rebuild: bool,
    timeout: float,
    loader: str = DEFAULT_LOADER,
    one_node: bool = False,
) -> int:
    run = run_dir(lab)
    state = read_state(lab)
    pid = qemu_pid(lab)
    if pid:
        if fresh or rebuild:
            raise LabError("the lab host is running: `python -m dev.lab down` first")
        say(f"already running (pid {pid}), SSH on 127.0.0.1:{state.get('port')}")
        return 0
    ensure_tools(RUN_TOOLS)
    t0 = time.monotonic()
    image = ensure_image(lab, rebuild, loader)
    t_image = time.monotonic() - t0
    if not port_free(port):
        raise LabError(
            f"127.0.0.1:{port} is in use: pick another port with --port or {PORT_ENV} "
            "(and give ansible-playbook the -e options `python -m dev.lab status` prints)"
        )
    if state.get("key") not in (None, image.name) and not fresh:
        say(f"the image changed ({state.get('key')} -> {image.name}): the lab host starts fresh")
        fresh = True
    if fresh or not (run / "root.qcow2").exists():
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        # Copy-on-write overlays of the cached image's disks (GRUB's ESP is used read-only).
        for disk in ("root",) if loader == "grub" else ("root", "esp"):
            backing, overlay = str((image / f"{disk}.img").resolve()), str(run / f"{disk}.qcow2")
            debpkg.sh(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", backing, overlay])
        shutil.copy(OVMF_VARS, run / "OVMF_VARS.fd")
    info = json.loads((image / "info.json").read_text())
    (lab / "known_hosts").write_text(f"[127.0.0.1]:{port} {info['host_key']}\n")
    argv = qemu_argv(lab, image, port, loader, one_node)
    (run / "qemu.argv").write_text(json.dumps(argv) + "\n")
    (run / "console.log").write_bytes(b"")
    (run / QEMU_CPU).write_bytes(b"")
    with suppress(FileNotFoundError):
        (run / POWERED_OFF).unlink()
    start_qemu(lab)
    state = {"key": image.name, "loader": loader, "port": port, "started": time.time(), "image": str(image)}
    (run / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    pid = qemu_pid(lab)
    if pid:
        start_watchdog(lab, pid)
    say(f"booting with {loader} (console: {run / 'console.log'})")
    boot = wait_for_ssh(lab, port, timeout)
    say(f"up: SSH on 127.0.0.1:{port} after {boot:.0f} s of boot (image step {t_image:.0f} s)")
    extra = inventory_overrides(lab, port)
    if extra:
        say(f"inventories/lab assumes ~/.cache/gpuprov/lab and port {DEFAULT_PORT}: add {overrides_option(extra)}")
    return 0


def start_qemu(lab: Path) -> None:
    """Start QEMU (it daemonizes) from run/qemu.argv, as `up` wrote it."""
    run = run_dir(lab)
    for stale in ("qemu.pid", "qmp.sock", QMP_EVENTS):
        with suppress(FileNotFoundError):
            (run / stale).unlink()
    argv = json.loads((run / "qemu.argv").read_text())
    r = subprocess.run(argv, capture_output=True, text=True, cwd=run, check=False)
    if r.returncode:
        raise LabError(f"QEMU did not start: {r.stderr.strip()}")


def power_cycle(lab: Path, pid: int) -> int | None:
    """Power the lab host off and on: QEMU quit (killed if it does not) and started again on the
    same disks and firmware variables; the new QEMU's pid, None if it did not start."""
    qmp(lab, "quit")
    if not wait_gone(pid, 10):
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        wait_gone(pid, 10)
    return start_again(lab)


def start_again(lab: Path) -> int | None:
    """A new QEMU from run/qemu.argv after the last one ended (a power cycle, a reset as a cold
    start); its pid, None if it did not start."""
    try:
        start_qemu(lab)
    except LabError:
        return None
    return qemu_pid(lab)


def hmp(lab: Path, *command_lines: str) -> str:
    """QEMU's human monitor commands (``info registers -a``...) through QMP, their output; "" when
    QEMU does not answer."""
    out = []
    with suppress(OSError, ValueError), socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(run_dir(lab) / "qmp.sock"))
        f = s.makefile("rw")
        f.readline()
        for cmd, args in [
            ("qmp_capabilities", None),
            *(("human-monitor-command", {"command-line": c}) for c in command_lines),
        ]:
            f.write(json.dumps({"execute": cmd, **({"arguments": args} if args else {})}) + "\n")
            f.flush()
            while True:
                msg = json.loads(f.readline() or "{}")
                if "return" in msg or "error" in msg or not msg:
                    break
            if args:
                out.append(f"### {args['command-line']}\n{msg.get('return', msg)}")
    return "\n".join(out)


# What QEMU shows of a stuck machine, kept before the lab's watchdog resets or power-cycles it:
# where each vCPU is (RIP, mode, interrupt flag), whether it is halted, the interrupt controllers'
# and the IOMMU's state. A hang's evidence, in run/stuck-N.txt (named in run/watchdog.log).
STUCK_DUMP = (
    "info cpus",
    "info registers -a",
    "info pic",
    "info irq",
    "info pci",
)


def keep_stuck_state(lab: Path, why: str) -> str:
    """Write STUCK_DUMP's output and the console's tail to run/stuck-N.txt; its name."""
    run = run_dir(lab)
    n = 1 + len(list(run.glob("stuck-*.txt")))
    path = run / f"stuck-{n}.txt"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    path.write_text(f"{stamp} {why}\n\n{hmp(lab, *STUCK_DUMP)}\n\n### console tail\n{console_tail(lab)}\n")
    return path.name


def qmp(lab: Path, *commands: str) -> None:
    """Send QMP commands (after the capabilities handshake); errors are ignored."""
    with suppress(OSError, ValueError), socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(run_dir(lab) / "qmp.sock"))
        f = s.makefile("rw")
        f.readline()
        for cmd in ("qmp_capabilities", *commands):
            f.write(json.dumps({"execute": cmd}) + "\n")
            f.flush()
            while not {"return", "error"} & json.loads(f.readline() or "{}").keys():
                pass  # an event (RESET, POWERDOWN...) came first


# The console lines that start a boot (the firmware handing over to the boot loader, or
# the kernel restarting the machine) and the one that ends it (getty on ttyS0).
FIRMWARE_STARTS = "BdsDxe: starting"  # OVMF hands over to GRUB or systemd-boot
# Linux restarting the machine: a reboot, or a panic's (panic=N) "Rebooting in N seconds..".
RESTARTING = ("reboot: Restarting system", "Rebooting in ")
BOOT_STARTS = (FIRMWARE_STARTS, *RESTARTING)
BOOT_DONE = f"{HOSTNAME} login:"
WATCHDOG_LIMIT = 240  # seconds from a boot's start to its login prompt (about 30 s normally)
# The kernel's report of a lost timer (RCU's stall warning: "rcu_preempt kthread timer wakeup didn't
# happen for N jiffies", every 21 s): the boot hung with every vCPU halted, waiting for a timer
# interrupt that never comes (seen 2026-11-27 on an idle machine: 168 s of these, then the reset at
# WATCHDOG_LIMIT; the next boot was fine). A boot that reported it twice is reset then.
LOST_TIMER = "timer wakeup didn't happen"
LOST_TIMER_REPORTS = 2
WATCHDOG_TRIES = 3  # resets in a row without a finished boot before the watchdog gives up
FIRMWARE_LIMIT = 60  # seconds from a reset to the firmware's hand-over (about 10 s normally; 20 after a panic=10)
# Who reset the machine, first word of each run/watchdog.log line after the time stamp:
# the lab's BMC-like boot watchdog (below) or a hardware watchdog of the guest's own (QEMU's
# WATCHDOG event: the i6300esb, or q35's ICH9 TCO, which Linux's iTCO_wdt drives).
RESET_BY_LAB = "lab-bmc:"
RESET_BY_GUEST = "guest-watchdog:"
# A power cycle after a reset the firmware never answered (an emulator spin, whoever reset the
# machine: that reset is logged as its own): not a reset of a stuck boot, so not RESET_BY_LAB.
POWER_CYCLE = "lab-power:"


def qmp_events_connect(lab: Path, timeout: float = 10) -> socket.socket | None:
    """The events QMP monitor, after its handshake (QEMU sends events only then); None if it
    does not answer."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.settimeout(5)
            s.connect(str(run_dir(lab) / QMP_EVENTS))
            s.sendall(json.dumps({"execute": "qmp_capabilities"}).encode() + b"\n")
            s.setblocking(False)
            return s
        except OSError:
            s.close()
            time.sleep(0.5)
    return None


def qmp_events(buf: bytes) -> tuple[list[dict], bytes]:
    """The QMP events in ``buf`` (one JSON object a line; greeting and replies dropped) and the
    incomplete line left over."""
    *lines, rest = buf.split(b"\n")
    events = []
    for line in lines:
        with suppress(ValueError):
            msg = json.loads(line)
            if isinstance(msg, dict) and "event" in msg:
                events.append(msg)
    return events, rest


# QEMU's SHUTDOWN reasons that are a reset of the machine (qemu_argv's reboot=shutdown makes every
# reset end QEMU): `watchdog` starts a new QEMU for these and lets it go for a poweroff or a quit.
RESET_REASONS = frozenset({"guest-reset", "host-qmp-system-reset"})
# Written by `down` before it powers the host off: a reset racing it starts no new QEMU.
POWERED_OFF = "powered-off"


def reset_reason(event: dict) -> str | None:
    """The reason of a SHUTDOWN event that is a reset of the machine (RESET_REASONS), else None."""
    if event.get("event") != "SHUTDOWN":
        return None
    reason = (event.get("data") or {}).get("reason")
    return reason if reason in RESET_REASONS else None


def guest_watchdog_line(event: dict) -> str | None:
    """The watchdog.log text for a QMP WATCHDOG event (the i6300esb fired), else None."""
    if event.get("event") != "WATCHDOG":
        return None
    action = (event.get("data") or {}).get("action", "?")
    return f"{RESET_BY_GUEST} the guest's hardware watchdog (i6300esb or TCO) expired: QEMU's action {action}"


def boot_stuck(elapsed: float, lost_timer: int, limit: float = WATCHDOG_LIMIT) -> str | None:
    """Why a boot ``elapsed`` seconds old whose console reported ``lost_timer`` lost timers
    (LOST_TIMER) is stuck, for run/watchdog.log; None while it is not."""
    if lost_timer >= LOST_TIMER_REPORTS:
        reports = f"{lost_timer} reports of {LOST_TIMER!r}"
        return f"the kernel lost its timer ({reports}) {elapsed:.0f} s after the boot started"
    if elapsed > limit:
        return f"no login prompt {limit:.0f} s after the boot started"
    return None


def watchdog(lab: Path, pid: int, limit: float = WATCHDOG_LIMIT) -> None:
    """The lab's BMC: reset the machine when a boot does not reach its login prompt in time, or
    sooner when its kernel reported a lost timer twice (:func:`boot_stuck`).

    Debian's kernel under TCG now and then hangs early in boot (both vCPUs spinning
    with interrupts off, around the switch to the TSC clocksource, about one boot in
    thirty); a real host's BMC watchdog would reset it, and so does this. OVMF under TCG
    now and then spins after a reset of the machine, before it prints anything (seen after
    Linux's "reboot: Restarting system"), and a reset does not end that: a reset (Linux's,
    the guest's watchdog's or this one's) not followed by the firmware's hand-over within
    FIRMWARE_LIMIT is followed by a power cycle (:func:`power_cycle`, a new QEMU). Each
    reset is logged in run/watchdog.log (``python -m dev.lab status`` shows them), and so
    is each reset by the guest's own i6300esb (QMP WATCHDOG events): RESET_BY_LAB and
    RESET_BY_GUEST tell them apart, and POWER_CYCLE marks the power cycles. Every reset ends QEMU
    (qemu_argv's reboot=shutdown): a SHUTDOWN event for a reset (RESET_REASONS) is followed by a
    new QEMU, a cold start. Runs until QEMU exits for anything else, or `down` powered it off."""
    console, log = run_dir(lab) / "console.log", run_dir(lab) / "watchdog.log"
    offset, started, tries, lost_timer = 0, time.monotonic(), 0, 0
    reset_at: float | None = None  # a reset that the firmware has not answered yet
    events, pending = qmp_events_connect(lab), b""

    def note(text: str) -> None:
        with open(log, "a") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")

    reset: str | None = None  # QEMU is ending for a reset of the machine (RESET_REASONS)
    sample = qemu_cpu(pid)
    while True:
        if wait_gone(pid, 0 if events else 2):
            if (run_dir(lab) / POWERED_OFF).exists():
                return  # `down` counted this QEMU
            note_qemu_cpu(lab, sample)
            if reset is None:
                return
            # The reset as a cold start: a new QEMU on the same disks and firmware variables.
            new = start_again(lab)
            if new is None:
                note(f"{POWER_CYCLE} QEMU did not start again after a reset ({reset})")
                return
            if events is not None:
                events.close()
            pid, events, pending, reset = new, qmp_events_connect(lab), b"", None
            reset_at = started = time.monotonic()
            sample = qemu_cpu(pid)
            continue
        sample = qemu_cpu(pid) or sample  # its last figure before it ends (the loop's 2 s apart)
        if events:
            with suppress(OSError):
                select.select([events], [], [], 2)
                chunk = events.recv(65536)
                if not chunk:  # QEMU closed the monitor: it is exiting
                    events = None
                pending += chunk
            got, pending = qmp_events(pending)
            for line in filter(None, map(guest_watchdog_line, got)):
                note(line)
                reset_at = time.monotonic()
            reset = next(filter(None, map(reset_reason, got)), reset)
        try:
            with open(console, "rb") as f:
                f.seek(offset)
                text = f.read().decode("utf-8", "replace")
                offset = f.tell()
        except OSError:
            text = ""
        restarting, firmware = max(text.rfind(m) for m in RESTARTING), text.rfind(FIRMWARE_STARTS)
        if restarting > firmware:
            reset_at = time.monotonic()
        elif firmware >= 0:
            reset_at = None
        if reset_at is not None and time.monotonic() - reset_at > FIRMWARE_LIMIT:
            dump = keep_stuck_state(lab, "no firmware output after a reset")
            note(
                f"{POWER_CYCLE} no firmware output {FIRMWARE_LIMIT} s after a reset: power cycle (QEMU restarted;"
                f" its state before: run/{dump})"
            )
            note_qemu_cpu(lab, qemu_cpu(pid) or sample)
            new = power_cycle(lab, pid)
            if new is None:
                note(f"{POWER_CYCLE} QEMU did not start again: giving up")
                return
            if events is not None:
                events.close()
            pid, events, pending = new, qmp_events_connect(lab), b""
            reset_at, started = None, time.monotonic()
            sample = qemu_cpu(pid)
            continue
        last_start = max(text.rfind(m) for m in BOOT_STARTS)
        last_done = text.rfind(BOOT_DONE)
        if last_done > last_start:
            started, tries = None, 0
        elif last_start >= 0:
            started, lost_timer = time.monotonic(), text.count(LOST_TIMER, last_start)
        elif started is not None:
            lost_timer += text.count(LOST_TIMER)
        stuck = None if started is None else boot_stuck(time.monotonic() - started, lost_timer, limit)
        if stuck:
            tries += 1
            if tries > WATCHDOG_TRIES:
                note(f"{RESET_BY_LAB} boot stuck again after {WATCHDOG_TRIES} resets: giving up")
                return
            dump = keep_stuck_state(lab, stuck)
            note(f"{RESET_BY_LAB} {stuck}: system_reset (its state before: run/{dump})")
            qmp(lab, "system_reset")
            started = reset_at = time.monotonic()
            lost_timer = 0


def start_watchdog(lab: Path, pid: int) -> None:
    """Run :func:`watchdog` in a detached process (it outlives this command, ends with QEMU)."""
    code = f"from dev.lab.boot import watchdog; from pathlib import Path; watchdog(Path({str(lab)!r}), {pid})"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    with open(run_dir(lab) / "watchdog.err", "ab") as err:
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


def proc_stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses): [0] is
    field 3, the state. Raises OSError (no such process) or IndexError (not that file's shape)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def wait_gone(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaped counts as exited)."""
    t0 = time.monotonic()
    while True:
        try:
            if proc_stat(pid)[0] == "Z":
                return True
        except (OSError, IndexError):
            return True
        if time.monotonic() - t0 >= timeout:
            return False
        time.sleep(0.5)


# Each QEMU's run and CPU as it ended ("<seconds> <CPU-seconds>" a line; the watchdog writes it, `up`
# empties it): every reset ends QEMU (qemu_argv's reboot=shutdown), and the lab host's QEMUs are in no
# step's CPU figure of scripts/test.sh (a daemon, its own session), so `down` adds them up: where a CI
# run's CPU went.
QEMU_CPU = "qemu-cpu.log"


def qemu_cpu(pid: int) -> tuple[float, float] | None:
    """How long QEMU ``pid`` has run and the CPU it used (user + system), in seconds, from
    /proc/PID/stat (fields 22, 14 and 15); None when unreadable."""
    try:
        fields = proc_stat(pid)
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        tick = os.sysconf("SC_CLK_TCK")
        return uptime - int(fields[19]) / tick, (int(fields[11]) + int(fields[12])) / tick
    except (OSError, IndexError, ValueError):
        return None


def note_qemu_cpu(lab: Path, sample: tuple[float, float] | None) -> None:
    if sample is not None:
        with open(run_dir(lab) / QEMU_CPU, "a") as f:
            f.write(f"{sample[0]:.0f} {sample[1]:.0f}\n")


def qemu_cpu_summary(lab: Path, pid: int) -> str:
    """The QEMUs since `up`: those ended (QEMU_CPU) and ``pid``, still running."""
    samples = [qemu_cpu(pid)]
    with suppress(OSError):
        for line in (run_dir(lab) / QEMU_CPU).read_text().splitlines():
            with suppress(ValueError):
                ran, cpu = map(float, line.split())
                samples.append((ran, cpu))
    known = [s for s in samples if s is not None]
    if not known:
        return ""
    ran, cpu = sum(s[0] for s in known), sum(s[1] for s in known)
    return f"; {len(known)} QEMU run(s) since up: {ran:.0f} s, {cpu:.0f} CPU-s"


def down(lab: Path, force: bool, timeout: float) -> int:
    pid = qemu_pid(lab)
    if pid is None:
        say("not running")
        return 0
    used = qemu_cpu_summary(lab, pid)
    port = read_state(lab).get("port", default_port())
    t0 = time.monotonic()
    (run_dir(lab) / POWERED_OFF).write_text(f"{time.time()}\n")  # the watchdog restarts no QEMU now
    if not force:
        # A clean shutdown from inside (disks synced); ACPI power button as the fallback.
        with suppress(subprocess.TimeoutExpired):
            subprocess.run([*ssh_argv(lab, port), "systemctl poweroff"], capture_output=True, timeout=30, check=False)
        if not wait_gone(pid, timeout):
            qmp(lab, "system_powerdown")
    if not wait_gone(pid, 0 if force else 30):
        qmp(lab, "quit")
        if not wait_gone(pid, 10):
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 10)
    say(f"down ({time.monotonic() - t0:.0f} s{used})")
    return 0
