"""The iommu_host role's trial boot on the lab host booting with systemd-boot, for real
(docs/reference/boot-trial.md), in file order:
- an argument that panics the kernel (init=/bin/false: init exits, the kernel panics): the lab host
  comes back by itself on its old arguments (panic=N, not the lab's own boot watchdog), the play
  fails naming the argument, and the default entry is byte for byte what it was; run again, the same
  arguments are refused without a reboot (molecule/_shared/lab_trials.py, which molecule/lab shares:
  it hangs its converged GRUB host the same way);
- the good change, its run killed and run again: trial boot, checks, commit; the next reboot keeps
  it; a rerun changes nothing.

The timings are printed (molecule runs this file with -s) and go in the closing notes.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

# molecule/conftest.py's runner (the folder's name is the molecule package's: loaded by path).
_spec = importlib.util.spec_from_file_location("gpuprov_molecule_conftest", REPO / "molecule" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_conftest = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
converge_killed_in = _conftest.converge_killed_in

from lab_trials import PANIC, a_failed_trial, boot_id, cmdline, not_tried_again, timed  # noqa: E402

LOADER = "systemd-boot"


def adhoc(module: str, args: str) -> subprocess.CompletedProcess:
    """`ansible gpu_hosts -m MODULE -a ARGS` with this scenario's inventory (inventories/lab)."""
    inventory = os.path.dirname(os.environ["MOLECULE_INVENTORY_FILE"])
    cmd = [str(Path(sys.executable).with_name("ansible")), "-i", inventory, "gpu_hosts", "-m", module, "-a", args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=False)


def test_a_panicking_argument_comes_back_by_itself_on_the_old_arguments(host, lab_converge):
    assert "intel_iommu=off" in cmdline(host)  # the image's own line: this is the host's first trial
    # systemd-boot (timeout 0) names no entry on the console: the panic is the trial's mark.
    a_failed_trial(host, lab_converge, LOADER, PANIC, f"{LOADER} panic")


def test_the_failed_arguments_are_not_tried_again(host, lab_converge):
    not_tried_again(host, lab_converge, PANIC)


def test_a_good_change_is_tried_then_committed(host, lab_converge):
    """The run is killed 3 s into the module call (while it builds the trial initramfs: where a
    handler's notification died with the controller) and run again (issue #14); molecule/lab
    converges its GRUB host uninterrupted."""
    booted = boot_id(host)
    assert converge_killed_in("Turn the IOMMU on at boot"), "the run ended before the module call"
    assert boot_id(host) == booted  # killed before its reboot
    run = timed(f"{LOADER} good (trial + commit)", lab_converge)
    assert run.failures == 0, run.output
    assert boot_id(host) != booted
    args = cmdline(host)
    assert "intel_iommu=on" in args and "iommu=pt" in args and any(a.startswith("gpuprov.trial=") for a in args)
    assert "intel_iommu=on iommu=pt" in host.file("/etc/kernel/cmdline").content_string
    assert not host.file("/boot/efi/loader/entries/gpuprov-trial.conf").exists
    # What an uninterrupted run leaves (molecule/lab checks the same after its converge): the
    # initramfs holds vfio and the trial's watchdog script, nothing of the trial is left over.
    listing = host.check_output("lsinitramfs /boot/initrd.img-$(uname -r)")
    for member in ("vfio-pci.ko", "scripts/init-top/gpuprov-trial", "i6300esb.ko"):
        assert member in listing, member
    left = host.check_output("ls /var/lib/gpuprov /boot /boot/efi 2>/dev/null; true")
    assert "gpuprov-trial" not in left and "boot-trial.json" not in left and "trial-up" not in left, left
    assert host.file("/sys/class/iommu/dmar0").exists
    again = timed(f"{LOADER} no-op rerun", lab_converge)
    assert again.failures == 0 and again.changed == 0, again.output


def test_the_next_reboot_keeps_it(host, lab_converge):
    booted = boot_id(host)
    r = adhoc("ansible.builtin.reboot", "reboot_timeout=600")
    assert r.returncode == 0, r.stdout + r.stderr
    assert boot_id(host) != booted
    args = cmdline(host)
    assert "intel_iommu=on" in args and not any(a.startswith("gpuprov.trial=") for a in args)
    run = lab_converge()
    assert run.failures == 0 and run.changed == 0, run.output
