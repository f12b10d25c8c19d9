"""guest_nvidia_driver after converge and idempotence, in a Debian 12 and an
Ubuntu-like (24.04 noble) instance, on the H100 guest capture at /srv/host with its
driver taken out (prepare.yml); the capture as taken, a working driver, is left alone.

The capture's kernel (6.18.44-fc-v657-gpu) is not the container's: the header
package the role picks must be the guest root's. Packages, update-initramfs and
reboots are reported as not run (no network, no GPU in a container); everything
before them is written and checked here. Helpers and fixtures: molecule/conftest.py.
"""

from __future__ import annotations

import base64
import json

import pytest
from role_checks import RoleChecks

KERNEL = "6.18.44-fc-v657-gpu"  # the capture's /proc/version
BLACKLIST = "etc/modprobe.d/gpuprov-blacklist-nouveau.conf"
DEBIAN = "contrib non-free non-free-firmware"
DEBIAN_SOURCES = """\
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def task_msgs(run, name: str) -> list[str]:
    """The msg of every result of the tasks called ``name`` (role prefix and all) in one run."""
    text = run.output.split("\n", 1)[1]  # the first line is the command, which may hold JSON
    data, _ = json.JSONDecoder().raw_decode(text[text.index("{") :])
    msgs = []
    for play in data["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].endswith(name):
                msgs += [str(r.get("msg", "")) for r in task["hosts"].values() if not r.get("skipped")]
    return msgs


def put(host, path: str, text: str) -> None:
    """Write text to a file in the instance."""
    data = base64.b64encode(text.encode()).decode()
    host.run_expect([0], "echo %s | base64 -d > %s", data, path)


@pytest.fixture
def ubuntu(host) -> bool:
    return host.system_info.distribution == "ubuntu"


@pytest.fixture
def debian_only(ubuntu) -> None:
    """Behaviour that does not depend on the distribution is tested once, on Debian (time)."""
    if ubuntu:
        pytest.skip("the same on Ubuntu; tested on the Debian instance")


@pytest.fixture
def guest_root(host, scratch_root):
    """guest_root(path) -> a fresh guest root: the capture plus the instance's apt sources."""

    def make(path: str) -> str:
        scratch_root(path)
        host.run_expect([0], "/usr/local/sbin/gpuprov-guest-apt %s", path)
        return path

    return make


def apt_print_uris(host, root: str) -> str:
    """What apt fetches for the guest root's sources (apt parses them; nothing is fetched)."""
    out = host.run(
        "apt-get update --print-uris -o Dir::Etc::sourcelist=%s/etc/apt/sources.list "
        "-o Dir::Etc::sourceparts=%s/etc/apt/sources.list.d -o Dir::State::lists=/tmp/gpuprov-lists",
        root,
        root,
    )
    assert out.rc == 0, out.stderr
    return out.stdout


def test_the_driver_components_are_on_the_distributions_entries(host, root, ubuntu):
    if ubuntu:
        # Ubuntu 24.04 ships restricted already: the stock ubuntu.sources is left byte for byte.
        stock = host.file("/etc/apt/sources.list.d/ubuntu.sources").content_string
        assert host.file(f"{root}/etc/apt/sources.list.d/ubuntu.sources").content_string == stock
        assert "restricted/binary-amd64/Packages" in apt_print_uris(host, root)
    else:
        assert host.file(f"{root}/etc/apt/sources.list").content_string == (
            f"deb http://deb.debian.org/debian bookworm main {DEBIAN}\n"
        )
        uris = apt_print_uris(host, root)
        for component in DEBIAN.split():
            assert f"/dists/bookworm/{component}/binary-amd64/Packages" in uris, uris


def test_deb822_sources_get_the_components_in_place(host, guest_root, converge, ubuntu):
    root = guest_root("/srv/deb822")
    if ubuntu:
        path = f"{root}/etc/apt/sources.list.d/ubuntu.sources"
        stock = host.file(path).content_string
        host.run_expect([0], "sed -i 's/^Components: .*/Components: main universe/' %s", path)
        run = converge({"guest_nvidia_driver_root": root})
        assert run.failures == 0, run.output
        assert host.file(path).content_string == stock.replace(
            "Components: main restricted universe multiverse", "Components: main universe restricted"
        )
        assert "/dists/noble-updates/restricted/binary-amd64/Packages" in apt_print_uris(host, root)
    else:
        # Debian 12 as cloud images ship it: debian.sources, no sources.list.
        host.run_expect([0], "rm %s/etc/apt/sources.list", root)
        put(host, f"{root}/etc/apt/sources.list.d/debian.sources", DEBIAN_SOURCES)
        run = converge({"guest_nvidia_driver_root": root})
        assert run.failures == 0, run.output
        assert host.file(f"{root}/etc/apt/sources.list.d/debian.sources").content_string == DEBIAN_SOURCES.replace(
            "Components: main\n", f"Components: main {DEBIAN}\n"
        )
        assert not host.file(f"{root}/etc/apt/sources.list").exists
        assert "/dists/bookworm-security/non-free-firmware/binary-amd64/Packages" in apt_print_uris(host, root)


def test_nouveau_is_blacklisted(host, root):
    f = host.file(f"{root}/{BLACKLIST}")
    assert f.is_file and f.user == "root" and f.mode == 0o644
    out = host.run("modprobe -C %s/%s --showconfig", root, BLACKLIST)
    assert out.rc == 0 and "ignoring bad line" not in out.stderr, out.stderr
    shown = out.stdout.splitlines()
    assert "blacklist nouveau" in shown and "options nouveau modeset=0" in shown, out.stdout


def test_check_mode_on_the_converged_guest_changes_nothing_and_names_the_packages(host, root, converge, digest, ubuntu):
    """The packages follow the guest root's kernel and release (the container's kernel is another one)."""
    assert host.check_output("uname -r") != KERNEL
    before = digest(root)
    run = converge(check=True)
    assert run.failures == 0, run.output
    assert run.changed == 0, (run.changed_tasks, run.output)
    assert digest(root) == before
    (plan,) = task_msgs(run, "Show the driver's plan for this guest")
    assert plan.startswith("missing: no NVIDIA driver; plan: ")
    install = f"apt-get install -y --no-install-recommends linux-headers-{KERNEL} "
    if ubuntu:
        assert f"{install}nvidia-driver-570-server-open dkms (" in plan
        unpinned = converge({"guest_nvidia_driver_version": ""}, check=True)
        (plan,) = task_msgs(unpinned, "Show the driver's plan for this guest")
        assert f"{install}ubuntu-drivers-common (" in plan
        assert "run ubuntu-drivers install --gpgpu (" in plan
    else:
        assert f"{install}nvidia-driver nvidia-open-kernel-dkms (" in plan


def test_a_working_driver_is_left_alone(scratch_root, converge, digest, ubuntu):
    """The capture as taken: driver 580 loaded, nvidia-smi answered. Nothing planned, changed=0;
    another branch is refused naming it, and nothing changed."""
    root = scratch_root("/srv/working")
    before = digest(root)
    for check in (True, False):
        run = converge({"guest_nvidia_driver_root": root, "guest_nvidia_driver_version": ""}, check=check)
        assert run.failures == 0 and run.changed == 0, (run.changed_tasks, run.output)
        (plan,) = task_msgs(run, "Show the driver's plan for this guest")
        assert plan.startswith("working: NVIDIA driver 580.") and plan.endswith("; nothing to do"), plan
    assert digest(root) == before
    if ubuntu:
        run = converge({"guest_nvidia_driver_root": root, "guest_nvidia_driver_version": "570"})
        assert run.failures > 0
        assert any("branch 570 is asked for" in m and "replace_other_driver: true" in m for m in run.failed_msgs)
        assert digest(root) == before


@pytest.fixture
def vgpu_files(tmp_path):
    """The admin's vGPU files on the controller (where this test runs): the installer
    (named as NVIDIA names it; never run on a staged root) and a client token."""
    run = tmp_path / "NVIDIA-Linux-x86_64-550.54.15-grid.run"
    run.write_text("#!/bin/sh\nexit 1\n")
    token = tmp_path / "client_configuration_token_11-21-2026-12-00-00.tok"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.test-token.signature\n")
    return {"guest_nvidia_driver_vgpu_package": str(run), "guest_nvidia_driver_vgpu_token": str(token)}


def test_a_vgpu_guest_gets_its_driver_gridd_conf_and_token(host, guest_root, converge, vgpu_files, digest, debian_only):
    """On a fresh root: also the initramfs rebuild, due once (the blacklist is new), then not again."""
    root = guest_root("/srv/vgpu")
    tokens = f"{root}/etc/nvidia/ClientConfigToken"
    host.run_expect([0], "mkdir -p %s && echo old > %s/client_configuration_token_old.tok", tokens, tokens)
    extra = {
        "guest_nvidia_driver_root": root,
        **vgpu_files,
        "guest_nvidia_driver_vgpu_feature_type": 4,
        "guest_nvidia_driver_gridd_settings": {"ProxyServerAddress": "proxy.example", "ProxyServerPort": 3128},
    }
    run = converge(extra)
    assert run.failures == 0, run.output
    gridd = host.file(f"{root}/etc/nvidia/gridd.conf")
    assert gridd.mode == 0o644
    settings = [line for line in gridd.content_string.splitlines() if line and not line.startswith("#")]
    assert settings == ["FeatureType=4", "ProxyServerAddress=proxy.example", "ProxyServerPort=3128"]
    token = host.file(f"{tokens}/client_configuration_token_11-21-2026-12-00-00.tok")
    assert token.mode == 0o744 and token.user == "root"
    assert token.content_string == "eyJhbGciOiJSUzI1NiJ9.test-token.signature\n"
    assert host.check_output("ls %s", tokens).split() == ["client_configuration_token_11-21-2026-12-00-00.tok"]
    (plan,) = task_msgs(run, "Show the driver's plan for this guest")
    assert f"--no-install-recommends linux-headers-{KERNEL} dkms build-essential (" in plan
    (vgpu_not_run,) = task_msgs(run, "Report the vGPU guest driver install not run on a staged root")
    assert (
        "install the vGPU guest driver NVIDIA-Linux-x86_64-550.54.15-grid.run (run, version 550.54.15)" in vgpu_not_run
    )
    (not_run,) = task_msgs(run, "Report what was not run on a staged root")
    assert "run update-initramfs -u -k all (" in not_run
    before = digest(root)
    again = converge(extra)
    assert again.failures == 0 and again.changed == 0, (again.changed_tasks, again.output)
    (not_run,) = task_msgs(again, "Report what was not run on a staged root")
    assert "update-initramfs" not in not_run  # the blacklist is in place: the rebuild was due once
    assert digest(root) == before


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        ({"guest_nvidia_driver_vgpu": True},
         "and no vGPU guest driver is running, but vgpu_package is empty, nothing changed"),
        ({"guest_nvidia_driver_vgpu_package": "/nonexistent/NVIDIA-Linux-x86_64-550.54.15-grid.run"},
         "/nonexistent/NVIDIA-Linux-x86_64-550.54.15-grid.run is not a file on the controller, nothing changed"),
        ({"guest_nvidia_driver_vgpu": "maybe"}, "bad variables, nothing changed: guest_nvidia_driver_vgpu must be"),
    ],
    ids=["vgpu-without-driver", "missing-package", "bad-vgpu-value"],
)  # fmt: skip
def test_bad_input_fails_and_changes_nothing(guest_root, converge, digest, extra, text, debian_only):
    root = guest_root("/srv/refuse")
    before = digest(root)
    run = converge({"guest_nvidia_driver_root": root, **extra})
    assert run.failures > 0, run.output
    assert any(text in m for m in run.failed_msgs), run.failed_msgs
    assert digest(root) == before


def test_a_vgpu_without_a_token_fails_and_changes_nothing(guest_root, converge, digest, vgpu_files, debian_only):
    root = guest_root("/srv/refuse")
    before = digest(root)
    run = converge({"guest_nvidia_driver_root": root, **vgpu_files, "guest_nvidia_driver_vgpu_token": ""})
    assert run.failures > 0
    assert any("but guest_nvidia_driver_vgpu_token is empty, nothing changed" in m for m in run.failed_msgs)
    assert any("client configuration token (client_configuration_token_*.tok)" in m for m in run.failed_msgs)
    assert digest(root) == before


def test_a_pinned_version_on_debian_fails_and_changes_nothing(guest_root, converge, digest, debian_only):
    root = guest_root("/srv/refuse")
    before = digest(root)
    run = converge({"guest_nvidia_driver_root": root, "guest_nvidia_driver_version": "570"})
    assert any("Debian ships one driver per release" in m for m in run.failed_msgs), run.failed_msgs
    assert digest(root) == before


@pytest.mark.parametrize("allow", [False, True], ids=["not-allowed", "allowed"])
def test_nouveau_loaded_means_reboot_required(host, guest_root, converge, allow, debian_only):
    root = guest_root("/srv/nouveau")
    host.run_expect([0], "echo 'nouveau 3096576 0 - Live 0xffffffffc1000000' >> %s/proc/modules", root)
    run = converge({"guest_nvidia_driver_root": root, "guest_nvidia_driver_allow_reboot": allow})
    if allow:
        # A staged root is not rebooted: it is reported.
        assert run.failures == 0, run.output
        (msg,) = task_msgs(run, "Report the reboot not run on a staged root")
        assert msg == (
            f"not run (root {root} is not /): "
            "reboot (nouveau is loaded and holds the GPU (the blacklist takes effect at boot))"
        )
    else:
        assert run.failures > 0
        assert run.failed_msgs == [
            "reboot required: nouveau is loaded and holds the GPU (the blacklist takes effect at boot). "
            "Reboot the guest, or set guest_nvidia_driver_allow_reboot: true."
        ]
        # The blacklist that needs the reboot is in place.
        assert host.file(f"{root}/{BLACKLIST}").exists


class TestSharedChecks(RoleChecks):
    """Only under the staged root, check mode right (molecule/_shared/role_checks.py)."""

    @pytest.fixture
    def fresh_root(self, guest_root):
        return guest_root

    def test_check_mode_on_a_fresh_root_reports_changes_and_writes_nothing(
        self, converge, fresh_root, root_var, digest, debian_only
    ):
        check = super().test_check_mode_on_a_fresh_root_reports_changes_and_writes_nothing
        check(converge, fresh_root, root_var, digest)
