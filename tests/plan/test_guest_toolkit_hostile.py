"""Issue 26, the guest side: hostile options, offline file names, daemon.json and dpkg status through
the guest_toolkit planner. Invariants: no exception; a hostile value is refused (naming it) or, where
it is data, never reaches a command as an option nor a written file as a line of its own."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprov.core.plan import COMMAND, WRITE_FILE
from gpuprov.facts.guest_toolkit import OFFLINE_SOURCE, read_guest_toolkit
from gpuprov.facts.sysfs import Sysfs
from gpuprov.plan.guest.toolkit import GuestToolkitOptions, GuestToolkitPlan, Key, plan_guest_toolkit
from tests.fakehost import FakeHost

BUDGET = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
KEY = Key(b"\x99\x00\x01key", ["0" * 40])
NASTY = ["\n", "\r", "\0", "\x1b[2J", " -oDPkg::Pre-Invoke::=touch /tmp/x", "--allow-unauthenticated", "Trusted: yes"]
text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(NASTY),
    st.builds(
        lambda a, b: a + b, st.sampled_from(["https://x", "/etc/x", "amd64", "docker.io"]), st.sampled_from(NASTY)
    ),
)


def guest(root: Path, *, daemon_json: str | None = None, status: str | None = None) -> Path:
    fake = FakeHost(root, iommu=False)
    fake.write("etc/os-release", "ID=ubuntu\nID_LIKE=debian\nVERSION_CODENAME=noble\n")
    fake.write(
        "var/lib/dpkg/status",
        status if status is not None else "Package: libc6\nStatus: install ok installed\nVersion: 2.39\n",
    )
    fake.write("usr/bin/dockerd", "#!/bin/sh\n")
    fake.write("usr/bin/nvidia-ctk", "#!/bin/sh\n")
    if daemon_json is not None:
        fake.write("etc/docker/daemon.json", daemon_json)
    return root


def plan(root: Path, opts: GuestToolkitOptions, arch: str = "amd64") -> GuestToolkitPlan:
    managed = ["etc/apt/keyrings/k.gpg", OFFLINE_SOURCE, "etc/docker/daemon.json"]
    facts = read_guest_toolkit(Sysfs(str(root)), managed=managed, architecture=arch, offline_dir="var/lib/x")
    return plan_guest_toolkit(facts, opts)


def assert_contained(p: GuestToolkitPlan, values: list[str]) -> None:
    """No planned command takes an operand that starts with '-' after '--', nor any value with a line break;
    no written file holds a hostile value that has a line break."""
    for action in p.actions:
        if action.kind == COMMAND:
            argv = action.argv or []
            assert all("\n" not in a and "\r" not in a and "\0" not in a for a in argv), argv
            if "--" in argv and argv[0] != "/usr/bin/start-stop-daemon":
                assert not any(a.startswith("-") for a in argv[argv.index("--") + 1 :]), argv
        if action.kind == WRITE_FILE and isinstance(action.content, str):
            for v in values:
                if any(c in v for c in "\n\r") and v.strip():
                    assert v not in action.content, (v, action.path)


@BUDGET
@given(
    repo_url=text,
    keyring=text,
    offline_dest=text,
    cdi_output=text,
    packages=st.lists(text, max_size=3),
    docker_packages=st.lists(text, max_size=3),
    arch=text,
)
def test_hostile_options_are_refused_or_contained(
    tmp_path_factory, repo_url, keyring, offline_dest, cdi_output, packages, docker_packages, arch
) -> None:
    root = guest(tmp_path_factory.mktemp("g"))
    opts = GuestToolkitOptions(
        key=KEY,
        repo_url=repo_url,
        keyring=keyring.lstrip("/"),
        offline_dest=offline_dest.lstrip("/"),
        cdi_output=cdi_output,
        packages=packages,
        docker_packages=docker_packages or ["docker.io"],
        install_docker=True,
        cdi=False,
    )
    p = plan(root, opts, arch=arch or "amd64")
    if p.refused:
        assert p.actions == [] and p.refusal_text().startswith("refused, nothing changed: ")
    assert_contained(p, [repo_url, keyring, offline_dest, cdi_output, arch, *packages, *docker_packages])


@BUDGET
@given(
    names=st.lists(
        st.one_of(text, st.sampled_from(["-x_1_amd64.deb", "a\nb_1_amd64.deb", "ok_1_amd64.deb"])), max_size=4
    )
)
def test_hostile_offline_file_names_are_refused(tmp_path_factory, names) -> None:
    root = guest(tmp_path_factory.mktemp("g"))
    opts = GuestToolkitOptions(
        parts=["docker", "toolkit", "runtime"], offline_names=names, offline_source="dir", offline_index="", cdi=False
    )
    p = plan(root, opts)
    bad = [n for n in names if n.startswith("-") or "\n" in n]
    if bad:
        assert p.refused and "not package file names" in p.refusal_text()
    assert_contained(p, names)


@BUDGET
@given(
    daemon=st.one_of(st.text(max_size=200), st.just("[" * 50_000), st.just('{"runtimes": 5}'), st.just("\n" * 100_000))
)
def test_hostile_daemon_json_is_refused_naming_it(tmp_path_factory, daemon) -> None:
    root = guest(tmp_path_factory.mktemp("g"), daemon_json=daemon)
    p = plan(root, GuestToolkitOptions(parts=["runtime"], cdi=False))
    if p.refused:
        assert "/etc/docker/daemon.json" in p.refusal_text() or "nvidia-ctk" in p.refusal_text()
    else:  # taken: only a JSON object (or nothing at all) may be, never a list, a number or text
        assert not daemon.strip() or isinstance(json.loads(daemon), dict), daemon


@BUDGET
@given(status=st.one_of(st.text(max_size=300), st.just("\n" * 200_000), st.just("Package: x\n" * 50_000)))
def test_hostile_dpkg_status_never_breaks_the_offline_check(tmp_path_factory, status) -> None:
    root = guest(tmp_path_factory.mktemp("g"), status=status)
    index = "Package: docker.io\nVersion: 1\nDepends: libc6 (>= 2.34)\nFilename: ./docker.io_1_amd64.deb\n"
    opts = GuestToolkitOptions(
        parts=["docker", "toolkit", "runtime"],
        offline_names=["docker.io_1_amd64.deb"],
        offline_source="dir",
        offline_index=index,
        cdi=False,
    )
    (root / "usr/bin/dockerd").unlink()
    p = plan(root, opts)
    assert p.refused  # the toolkit is not in the directory, whatever the status says
    assert p.actions == []
