"""vfio_host after converge and idempotence, on the gpu-audio capture at /srv/host.

In that capture the edu 0000:01:00.0 (the stand-in GPU) shares IOMMU group 6 with
its HD-audio companion 0000:01:00.1 (snd_hda_intel); 0000:02:00.0 is the e1000e
NIC carrying the default route. The converge asks for [0000:01:00.0]: the
companion must come along. Helpers and fixtures: molecule/conftest.py.
"""

from __future__ import annotations

import re

import pytest
from role_checks import RoleChecks

GPU = "0000:01:00.0"
COMPANION = "0000:01:00.1"
ROUTE_NIC = "0000:02:00.0"
MODPROBE = "etc/modprobe.d/gpuprov-vfio.conf"
UDEV = "etc/udev/rules.d/61-gpuprov-vfio.rules"
HOOK = "etc/initramfs-tools/hooks/gpuprov-vfio"

# One udev rule token: KEY or KEY{attr}, an operator, a quoted value.
UDEV_TOKEN = re.compile(r'^\s*([A-Z_]+(?:\{[^}]+\})?)\s*(==|!=|\+=|-=|:=|=)\s*"([^"]*)"\s*$')


def udev_rules(text: str) -> list[list[tuple[str, str, str]]]:
    """Parse a rules file into rules of (key, op, value), failing on any malformed token."""
    rules = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        tokens = []
        for raw in line.split(","):
            m = UDEV_TOKEN.match(raw)
            assert m, f"malformed udev token {raw!r} in {line!r}"
            tokens.append(m.groups())
        rules.append(tokens)
    return rules


def test_modprobe_d_orders_vfio_pci_before_the_host_drivers(host, root):
    f = host.file(f"{root}/{MODPROBE}")
    assert f.is_file and f.user == "root" and f.mode == 0o644
    # Parsed by the real modprobe: no bad lines, and the softdeps are as read by the kernel's tools.
    out = host.run("modprobe -C %s/%s --showconfig", root, MODPROBE)
    assert out.rc == 0, out.stderr
    assert "ignoring bad line" not in out.stderr, out.stderr
    shown = out.stdout.splitlines()
    for driver in ("nvidia", "snd_hda_intel"):
        assert f"softdep {driver} pre: vfio-pci" in shown, (driver, out.stdout)


def test_udev_rule_binds_the_gpu_and_its_companion(host, root):
    f = host.file(f"{root}/{UDEV}")
    assert f.is_file and f.user == "root" and f.mode == 0o644
    rules = udev_rules(f.content_string)
    by_device = {}
    for rule in rules:
        kernel = [v for k, op, v in rule if k in ("KERNEL", "KERNELS") and op == "=="]
        assert len(kernel) == 1, f"a rule should match one PCI address: {rule}"
        by_device[kernel[0]] = rule
    assert sorted(by_device) == [GPU, COMPANION], rules
    for address, rule in by_device.items():
        assert ("SUBSYSTEM", "==", "pci") in rule, (address, rule)
        assert ("ATTR{driver_override}", "=", "vfio-pci") in rule, (address, rule)


def test_initramfs_hook_ships_the_rule_and_the_modprobe_file(host, root):
    f = host.file(f"{root}/{HOOK}")
    assert f.is_file and f.user == "root"
    assert f.mode & 0o111 == 0o111, oct(f.mode)
    text = f.content_string
    assert text.startswith("#!/bin/sh"), text.splitlines()[:1]
    host.run_expect([0], "sh -n %s/%s", root, HOOK)
    # initramfs-tools calls every hook with "prereqs" first; it must answer and exit 0.
    host.run_expect([0], "%s/%s prereqs", root, HOOK)
    # The paths the hook copies are the host's own (/etc/...), not the test root.
    assert f"/{UDEV}" in text, text
    assert f"/{MODPROBE}" in text, text


@pytest.mark.parametrize("check", [False, True], ids=["apply", "check"])
def test_refuses_the_nic_with_the_default_route_and_writes_nothing(converge, scratch_root, digest, check):
    scratch = scratch_root("/srv/refuse")
    before = digest(scratch)
    run = converge({"vfio_host_root": scratch, "vfio_host_devices": [ROUTE_NIC]}, check=check)
    assert run.failures > 0, run.output
    assert any("default route" in msg for msg in run.failed_msgs), run.failed_msgs
    assert digest(scratch) == before


def test_unbound_drops_the_boot_time_binding(host, converge, scratch_root):
    """bound, then unbound: no rule binds the devices any more; unbound again changes nothing."""
    scratch = scratch_root("/srv/unbind")
    bound = converge({"vfio_host_root": scratch})
    assert bound.failures == 0 and bound.changed > 0, bound.output
    unbound = converge({"vfio_host_root": scratch, "vfio_host_state": "unbound"})
    assert unbound.failures == 0 and unbound.changed > 0, unbound.output
    rules = host.file(f"{scratch}/{UDEV}")
    if rules.exists:
        kernels = [v for rule in udev_rules(rules.content_string) for k, _, v in rule if k in ("KERNEL", "KERNELS")]
        assert GPU not in kernels and COMPANION not in kernels, rules.content_string
    again = converge({"vfio_host_root": scratch, "vfio_host_state": "unbound"})
    assert again.failures == 0 and again.changed == 0, (again.changed_tasks, again.output)


class TestSharedChecks(RoleChecks):
    """Only under the staged root, check mode right (molecule/_shared/role_checks.py)."""
