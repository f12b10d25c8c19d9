"""guest_container_toolkit after converge (entry points repository and main)
and idempotence, in a Debian 12 and an Ubuntu-like (24.04 noble) instance with
no network.

The repository's key is a test key made with gpg at prepare time (the
controller's gpg home is in the scenario's ephemeral directory); Docker and
NVIDIA's container toolkit (built from its public source,
../shared/fixtures/toolkit-debs) come from an offline directory of real packages.
No driver here: everything up to the CDI spec. Helpers and fixtures:
molecule/conftest.py.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

KEYRING = "/etc/apt/keyrings/nvidia-container-toolkit.gpg"
SOURCE = "/etc/apt/sources.list.d/nvidia-container-toolkit.sources"
OFFLINE = "/var/lib/gpuprov/offline-packages"
MIRROR = "/srv/mirror"
EPHEMERAL = Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent"))
GNUPG = EPHEMERAL / "gnupg"
# What a refusal must leave alone: the configuration, the package database, the binaries.
UNTOUCHED = ("/etc", "/var/lib/dpkg", "/usr/bin", OFFLINE)


def gpg(home: Path, *args: str, stdin: bytes | None = None) -> bytes:
    cmd = ["gpg", "--batch", "--quiet", "--homedir", str(home), *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, check=True).stdout


def put(host, path: str, data: bytes) -> None:
    """Write bytes to a file in the instance."""
    host.run_expect([0], "echo %s | base64 -d > %s", base64.b64encode(data).decode(), path)


@pytest.fixture
def debian_only(host) -> None:
    """Behaviour that does not depend on the distribution is tested once, on Debian (time)."""
    if host.system_info.distribution == "ubuntu":
        pytest.skip("the same on Ubuntu; tested on the Debian instance")


def digests(digest) -> dict[str, str]:
    return {path: digest(path) for path in UNTOUCHED}


def test_the_keyring_is_the_repositorys_key_dearmored(host):
    f = host.file(KEYRING)
    assert f.is_file and f.user == "root" and f.mode == 0o644
    keyring = base64.b64decode(host.check_output("base64 -w0 %s", KEYRING))
    # Byte for byte what `gpg --export` (binary) gives of the armored key the role was handed.
    assert keyring == gpg(GNUPG, "--export")


def test_the_source_is_signed_by_that_keyring_only(host):
    f = host.file(SOURCE)
    assert f.user == "root" and f.mode == 0o644
    lines = [line for line in f.content_string.splitlines() if line and not line.startswith("#")]
    assert lines == [
        "Types: deb",
        "URIs: https://nvidia.github.io/libnvidia-container/stable/deb/amd64",
        "Suites: /",
        f"Signed-By: {KEYRING}",
    ]
    # apt reads it as NVIDIA's flat repository (nothing is fetched).
    out = host.run("apt-get update --print-uris -o Dir::State::lists=/tmp/gpuprov-lists")
    assert out.rc == 0, out.stderr
    assert "'https://nvidia.github.io/libnvidia-container/stable/deb/amd64/InRelease'" in out.stdout, out.stdout


def test_apt_checks_the_repository_with_that_keyring(host, converge, tmp_path, debian_only):
    """A mirror (guest_container_toolkit_repo_url) signed with the test key is read; signed with another, refused."""
    repo = f"{MIRROR}/deb/amd64"
    host.run_expect([0], "mkdir -p %s && cp %s/tini_*.deb %s/", repo, OFFLINE, repo)
    host.run_expect(
        [0],
        "cd %s && for f in *.deb; do dpkg-deb -f $f; echo Filename: ./$f; echo Size: $(stat -c %%s $f); "
        'echo SHA256: $(sha256sum $f | cut -d" " -f1); echo; done > Packages && '
        "printf 'Origin: gpuprov-test\\nDate: %%s\\nSHA256:\\n %%s %%s Packages\\n' "
        '"$(date -R -u)" "$(sha256sum Packages | cut -d" " -f1)" "$(stat -c %%s Packages)" > Release',
        repo,
    )
    release = base64.b64decode(host.check_output("base64 -w0 %s/Release", repo))
    update = f"apt-get update -o Dir::Etc::sourcelist={SOURCE} -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0"
    other = tmp_path / "other"
    try:
        run = converge({"guest_container_toolkit_repo_url": f"file:{MIRROR}"})
        assert run.failures == 0, run.output
        put(host, f"{repo}/InRelease", gpg(GNUPG, "--clearsign", stdin=release))
        good = host.run(update)
        assert good.rc == 0 and "W:" not in good.stderr, (good.stdout, good.stderr)
        assert f"file:{repo}" in host.check_output("apt-cache policy tini")

        other.mkdir(mode=0o700)
        gpg(other, "--passphrase", "", "--quick-gen-key", "someone else <else@gpuprov.invalid>", "ed25519", "sign")
        put(host, f"{repo}/InRelease", gpg(other, "--clearsign", stdin=release))
        bad = host.run(update)
        assert "NO_PUBKEY" in bad.stdout + bad.stderr, (bad.stdout, bad.stderr)
    finally:
        # Signing started a gpg-agent for that home, which would outlive the run (seen: one left per CI run).
        subprocess.run(["gpgconf", "--homedir", str(other), "--kill", "gpg-agent"], capture_output=True, check=False)
        host.run("rm -rf %s /var/lib/apt/lists/*srv_mirror*", MIRROR)
        restored = converge()
        assert restored.failures == 0, restored.output


def test_a_key_with_another_fingerprint_is_refused_and_nothing_changes(converge, digest, debian_only):
    before = digests(digest)
    run = converge({"guest_container_toolkit_gpg_fingerprint": "0000 1111 2222 3333 4444  5555 6666 7777 8888 9999"})
    assert run.failures > 0
    (msg,) = run.failed_msgs
    colons = gpg(GNUPG, "--with-colons", "--fingerprint").decode()
    test_key = re.search(r"^fpr:+([0-9A-F]{40}):", colons, re.M).group(1)
    assert f"has fingerprint {test_key}, not the expected 0000111122223333444455556666777788889999, nothing" in msg
    assert digests(digest) == before


def test_docker_came_from_the_offline_directory(host):
    offline = EPHEMERAL / "offline-debs"
    (deb,) = sorted(offline.glob("docker.io_*.deb"))
    version = deb.name.split("_")[1].replace("%3a", ":")
    pkg = host.package("docker.io")
    assert pkg.is_installed and pkg.version == version
    assert host.run("dockerd --version").stdout.startswith("Docker version ")
    # apt took it from the local repository made of the directory.
    assert host.file("/etc/apt/sources.list.d/gpuprov-offline.list").content_string.endswith(
        f"deb [trusted=yes] file:{OFFLINE} ./\n"
    )
    policy = host.check_output("apt-cache policy docker.io")
    assert f"file:{OFFLINE} ./ Packages" in policy, policy
    packages = host.file(f"{OFFLINE}/Packages").content_string
    assert sorted(re.findall(r"^Package: (.+)$", packages, re.M)) == sorted(
        p.name.split("_")[0] for p in offline.glob("*.deb")
    )


def test_the_toolkit_came_from_the_offline_directory_cdi_first(host):
    """Issue 25: nvidia-container-toolkit-base alone (not the legacy hook), the nvidia runtime in CDI mode,
    Docker's nvidia runtime in daemon.json; the engine is not started here (guest_container_toolkit_start: false)."""
    offline = EPHEMERAL / "offline-debs"
    (deb,) = sorted(offline.glob("nvidia-container-toolkit-base_*.deb"))
    base = host.package("nvidia-container-toolkit-base")
    assert base.is_installed and base.version == deb.name.split("_")[1]
    assert not host.package("nvidia-container-toolkit").is_installed
    assert host.run("nvidia-ctk --version").rc == 0
    for binary in ("/usr/bin/nvidia-cdi-hook", "/usr/bin/nvidia-container-runtime"):
        assert host.file(binary).is_file
    config = host.file("/etc/nvidia-container-runtime/config.toml").content_string
    assert re.search(r'^mode = "cdi"$', config, re.M), config
    daemon = json.loads(host.file("/etc/docker/daemon.json").content_string)
    assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"


def test_a_dependency_the_directory_lacks_is_refused_before_anything_changes(converge, digest, debian_only):
    """The legacy hook needs libnvidia-container-tools, which the directory does not hold: one refusal naming
    it, before anything is copied or written."""
    before = digests(digest)
    run = converge({"gpuprov_molecule_entry_points": ["main"], "guest_container_toolkit_legacy_hook": True})
    assert run.failures > 0
    (msg,) = run.failed_msgs
    assert msg.startswith("refused, nothing changed: the offline directory "), msg
    assert "libnvidia-container-tools (>= 1.19.0~) (needed by nvidia-container-toolkit)" in msg
    assert "fix: add them to it: scripts/offline-debs.sh --status" in msg
    assert digests(digest) == before


def test_the_runtime_step_follows_gpuprov_verifys_checks_in_check_mode(host, converge, digest, debian_only):
    """Docker is configured by the converge; containerd (Debian's, CRI on) is configured only when named: it runs
    as no service here. Check mode says what it would run and changes nothing."""
    before = digests(digest)
    run = converge({"gpuprov_molecule_entry_points": ["runtime"]}, check=True)
    assert run.failures == 0, run.output
    assert run.changed == 0, run.changed_tasks
    run = converge(
        {"gpuprov_molecule_entry_points": ["runtime"], "guest_container_toolkit_runtimes": ["docker", "containerd"]},
        check=True,
    )
    assert run.failures == 0, run.output
    assert "would run nvidia-ctk runtime configure --runtime=containerd (containerd's CRI" in run.output
    assert "--runtime=docker" not in run.output
    assert digests(digest) == before


def test_gpuprov_verify_here_sees_dockers_runtime_and_names_the_cdi_fix(host):
    """What the play's closing check says on this guest: Docker has the nvidia runtime; no CDI spec (no driver)."""
    result = host.ansible("gpuprov.kvm.gpu_verify", '{"container": false, "fail_on": []}', check=False)
    checks = {c["id"]: c for c in result["checks"]}
    assert checks["docker-runtime"]["status"] == "ok"
    assert checks["docker-runtime"]["message"] == (
        "/etc/docker/daemon.json has the nvidia runtime (nvidia-container-runtime)"
    )
    cdi = checks["cdi-spec"]
    assert cdi["status"] == "warn" and cdi["fix"] == "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
    # Debian's containerd is installed with its CRI on, but no containerd service runs here.
    assert checks["containerd-runtime"]["status"] == "skip"
    assert "no containerd service runs" in checks["containerd-runtime"]["message"]


def test_check_mode_on_the_converged_guest_reports_no_change(converge, digest):
    before = digests(digest)
    run = converge(check=True)
    assert run.failures == 0, run.output
    assert run.changed == 0, (run.changed_tasks, run.output)
    assert digests(digest) == before
