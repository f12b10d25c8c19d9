"""A boot change that fails its trial on the emulated lab host (docs/reference/boot-trial.md), checked
the same way by both lab scenarios: molecule/lab (GRUB, an argument that hangs the committed host)
and molecule/lab_boot (systemd-boot, one that panics a fresh one).

What a failed trial must leave: the play fails naming the argument; the host rebooted into the trial
and came back by itself on its old arguments (panic=N, or the i6300esb the trial's initramfs armed),
not by the lab's own boot watchdog (its stand-in for a BMC) or a power cycle; the files that make the
default boot byte for byte what they were; the trial recorded as failed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from dev.lab.boot import POWER_CYCLE, RESET_BY_GUEST, RESET_BY_LAB
from dev.lab.common import lab_dir

RUN = lab_dir() / "run"
PANIC, HANG = "init=/bin/false", "init=/bin/sh"
# The files that make the default boot, per bootloader: byte for byte the same after a failed trial.
DEFAULT_FILES = {
    "grub": ["/etc/default/grub", "/boot/grub/grub.cfg"],
    "systemd-boot": ["/etc/kernel/cmdline", "/boot/efi/loader/loader.conf", "/boot/efi/loader/entries/*.conf"],
}
# inventories/lab gives the trial's watchdog 300 s (iommu_host_trial_watchdog_seconds): room for a
# good trial boot under TCG on a busy machine to come up and be checked. A hang never comes up: it
# waits the watchdog out whatever its length, and needs no such room. It runs with the role's
# least, 60: the lab's i6300esb then resets the trial about 60 s after its initramfs arms it (the
# role writes i6300esb.heartbeat=60; the driver spreads it over the device's two stages), inside
# the lab's own boot watchdog (240 s from the firmware, dev/lab/boot.py), which is checked not to fire.
HANG_WATCHDOG = {"iommu_host_trial_watchdog_seconds": 60}


def timed(name: str, fn: Callable):
    """fn(), its wall time printed as a `boot-trial timing:` line (scripts/test.sh lists them)."""
    t0 = time.monotonic()
    result = fn()
    print(f"\nboot-trial timing: {name}: {round(time.monotonic() - t0)} s", flush=True)
    return result


def resets(by: str) -> int:
    """Resets noted in run/watchdog.log: by the lab's own boot watchdog (RESET_BY_LAB), by the guest's
    hardware watchdog (QEMU's WATCHDOG event, RESET_BY_GUEST), or power cycles (POWER_CYCLE). 0
    before the watchdog has noted anything (no log yet)."""
    try:
        lines = (RUN / "watchdog.log").read_text().splitlines()
    except OSError:
        return 0
    return sum(line.split(" ", 1)[-1].startswith(by) for line in lines)


def console() -> str:
    return (RUN / "console.log").read_text(errors="replace")


def default_digest(host, loader: str) -> str:
    return host.check_output(f"sha256sum {' '.join(DEFAULT_FILES[loader])} | sort")


def boot_id(host) -> str:
    return host.file("/proc/sys/kernel/random/boot_id").content_string.strip()


def cmdline(host) -> list[str]:
    return host.file("/proc/cmdline").content_string.split()


def a_failed_trial(
    host, converge: Callable, loader: str, argument: str, timing: str, default_args: list[str] | None = None
) -> str:
    """converge() with ``argument`` added to the IOMMU's (PANIC or HANG), checked as above; returns the
    console from the trial on, for the caller's bootloader's own marks. ``default_args``: /proc/cmdline
    as the default entry boots it, where the host does not run that entry now (a host still on the
    trial boot its last change committed); by default the host's arguments before the trial."""
    hang = argument == HANG
    before, booted = default_digest(host, loader), boot_id(host)
    old_args = cmdline(host) if default_args is None else default_args
    lab, guest, power = resets(RESET_BY_LAB), resets(RESET_BY_GUEST), resets(POWER_CYCLE)
    offset = len(console())
    run = timed(timing, lambda: converge({"iommu_host_extra_args": [argument], **(HANG_WATCHDOG if hang else {})}))
    assert run.failures, run.output
    message = " ".join(run.failed_msgs)
    assert argument in message and "did not come up" in message and "default is unchanged" in message, message
    # It rebooted (the trial), came back by itself on the old arguments; the default is untouched.
    assert boot_id(host) != booted
    assert cmdline(host) == old_args
    assert default_digest(host, loader) == before
    assert resets(RESET_BY_LAB) == lab, "the lab's boot watchdog fired: the trial's own fallback did not"
    assert resets(POWER_CYCLE) == power
    # A panic reboots by panic=; a hang only by the i6300esb the trial's initramfs armed.
    assert resets(RESET_BY_GUEST) == guest + hang
    trial = console()[offset:]
    assert ("Kernel panic" in trial) != hang, trial[-3000:]
    # The trial's initramfs armed the watchdog and left it unfed (it logs this at KERN_CRIT).
    assert "watchdog did not stop" in trial, trial[-3000:]
    record = json.loads(host.file("/var/lib/gpuprov/boot-trial.json").content_string)
    assert record["status"] == "failed" and argument in record["added"]
    return trial


def not_tried_again(host, converge: Callable, argument: str) -> None:
    """The same arguments again: refused (the fix: retry_failed) without a reboot."""
    booted = boot_id(host)
    run = converge({"iommu_host_extra_args": [argument]})
    assert run.failures and any("retry_failed" in m for m in run.failed_msgs), run.output
    assert boot_id(host) == booted
