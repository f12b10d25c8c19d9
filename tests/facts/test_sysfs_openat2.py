"""Sysfs on an untrusted root reads the same through openat2(RESOLVE_IN_ROOT) and through its own walk.

The kernel resolves a directory root's paths where it can (gpuprov/facts/openat2.py); where it cannot
(before Linux 5.6, a seccomp filter, GPUPROV_NO_OPENAT2), gpuprov walks them itself. A hostile tree
(links out of the root, absolute and climbing, `..` chains, loops, a FIFO, a huge file, a directory
where a file is expected, device nodes) must give the same answers both ways, none of them from
outside the root, none blocking, every read bounded.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuprov.facts import openat2 as openat2_mod
from gpuprov.facts import sysfs as sysfs_mod
from gpuprov.facts.sysfs import Sysfs

REPO = Path(__file__).resolve().parents[2]
OUTSIDE = "CANARY-CONTENT-7e2d"
HAVE_OPENAT2 = openat2_mod.opener() is not None
DEVICE = "sys/devices/pci0000:00/0000:00:01.0"


def bounded(call: Callable[[], object], seconds: float = 20) -> object:
    """``call()``, failing the test (not hanging it) when it does not return in time."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the read blocked"
    return result[0]


def link(root: Path, rel: str, target: str | Path) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(str(target), path)


def force_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sysfs as on a kernel without openat2: every directory resolved by gpuprov's own walk."""
    monkeypatch.setattr(sysfs_mod, "opener", lambda: None)


@pytest.fixture(params=["openat2", "walk"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "walk":
        force_walk(monkeypatch)
    elif not HAVE_OPENAT2:
        pytest.skip("this kernel (or its seccomp filter) has no openat2")
    return request.param


def hostile_tree(tmp_path: Path) -> tuple[Path, Path]:
    """A root with a small PCI device and every kind of trap; and a directory outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary").write_text(OUTSIDE)
    (outside / "sub").mkdir()
    (outside / "sub/file").write_text(OUTSIDE)
    root = tmp_path / "root"
    dev = root / DEVICE
    (dev / "net/eth0").mkdir(parents=True)
    (dev / "uevent").write_text("DRIVER=vfio-pci\nPCI_ID=10DE:2330\n")
    (dev / "vendor").write_text("0x10de\n")
    (dev / "net/eth0/address").write_text("02:00:00:00:00:01\n")
    (dev / "config").mkdir()  # a directory where a file is expected
    (root / "sys/kernel/iommu_groups/3").mkdir(parents=True)
    (root / "sys/kernel/iommu_groups/3/type").write_text("DMA\n")
    link(root, f"{DEVICE}/iommu_group", "../../../kernel/iommu_groups/3")
    link(root, "sys/bus/pci/devices/0000:00:01.0", "../../../devices/pci0000:00/0000:00:01.0")
    link(root, "sys/class/net/eth0", "../../devices/pci0000:00/0000:00:01.0/net/eth0")
    (root / "proc").mkdir()
    (root / "proc/cmdline").write_text("inside\n")
    (root / "etc").mkdir()
    (root / "etc/passwd").write_text("inside-passwd\n")
    link(root, "etc/abs-passwd", "/etc/passwd")  # the root's passwd, never the machine's
    link(root, "etc/abs-shadow", "/etc/shadow")  # not in the root: missing
    link(root, "etc/climb-passwd", "../../../../../../../../../../etc/passwd")
    link(root, "etc/abs-outside", outside / "canary")
    link(root, "etc/rel-outside", os.path.relpath(outside / "canary", root / "etc"))
    link(root, "etc/environ", "/proc/self/environ")
    link(root, "dir-out", outside)
    link(root, "dir-out-rel", os.path.relpath(outside, root))
    link(root, "dir-slash", "/")
    link(root, "dir-climb", "../../../../..")
    link(root, "loop-a", "loop-b")
    link(root, "loop-b", "loop-a")
    link(root, "self", "self/x")
    (root / "chain").mkdir()
    (root / "chain/end").write_text("end\n")
    for i in range(sysfs_mod.MAX_LINK_HOPS + 1):
        link(root, f"chain/c{i}", f"c{i + 1}" if i < sysfs_mod.MAX_LINK_HOPS else "end")
    link(root, "chain/dir", "../sys/devices/pci0000:00")  # a directory through a link, then more
    os.mkfifo(root / "etc/fifo")
    os.mkfifo(root / f"{DEVICE}/fifo")
    link(root, "etc/to-fifo", "/etc/fifo")
    with open(root / "etc/huge", "wb") as f:  # sparse: 64 MiB of zeros on no disk
        f.truncate(64 << 20)
    with open(root / f"{DEVICE}/huge", "wb") as f:
        f.truncate(64 << 20)
    if os.geteuid() == 0:
        os.mknod(root / "etc/null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        link(root, "etc/zero", "/dev/zero")
    return root, outside


# Paths asked of every reader: plain, through links, with `..`, `.`, `//`, a trailing `/`, absolute.
PATHS = [
    "",
    ".",
    "/",
    "..",
    "sys",
    DEVICE,
    f"{DEVICE}/uevent",
    f"{DEVICE}/vendor",
    f"{DEVICE}/config",
    f"{DEVICE}/config/x",
    f"{DEVICE}/fifo",
    f"{DEVICE}/huge",
    f"{DEVICE}/iommu_group",
    f"{DEVICE}/iommu_group/type",
    f"{DEVICE}/net/eth0/address",
    f"{DEVICE}/nothere",
    "sys/bus/pci/devices/0000:00:01.0",
    "sys/bus/pci/devices/0000:00:01.0/uevent",
    "sys/bus/pci/devices/0000:00:01.0/iommu_group/type",
    "sys/bus/pci/devices/0000:00:01.0/../0000:00:01.0/vendor",
    "sys/class/net/eth0",
    "sys/class/net/eth0/address",
    "sys/class/net/eth0/..",
    "sys/class/net/eth0/../../uevent",
    "sys/class/net/eth0/../../../../../../../../etc/passwd",
    "sys//devices/./pci0000:00//0000:00:01.0/vendor",
    "sys/devices/",
    "proc/cmdline",
    "proc/cmdline/",
    "proc/cmdline/x",
    "../../../../etc/passwd",
    "/etc/passwd",
    "proc/../../../etc/passwd",
    "etc/abs-passwd",
    "etc/abs-shadow",
    "etc/climb-passwd",
    "etc/abs-outside",
    "etc/rel-outside",
    "etc/environ",
    "etc/fifo",
    "etc/to-fifo",
    "etc/huge",
    "etc/null",
    "etc/zero",
    "dir-out",
    "dir-out/canary",
    "dir-out/sub/file",
    "dir-out/..",
    "dir-out-rel",
    "dir-out-rel/canary",
    "dir-slash",
    "dir-slash/etc/passwd",
    "dir-slash/..",
    "dir-climb",
    "dir-climb/etc/passwd",
    "dir-climb/proc/cmdline",
    "loop-a",
    "loop-a/x",
    "loop-b/..",
    "self",
    "self/x",
    "chain/c0",
    "chain/c1",
    "chain/dir",
    "chain/dir/0000:00:01.0/vendor",
    "chain/dir/0000:00:01.0/iommu_group/type",
    "nothere/x",
    "etc/pass\x00wd",
    "etc\x00/passwd",
]


WALKED = ("", "sys", "dir-out", "dir-slash", "self")


def answers(root: Path) -> dict[str, tuple]:
    """Every reader method's answer for every path, from one fresh Sysfs."""
    s = Sysfs(str(root))
    out: dict[str, tuple] = {}
    for rel in PATHS:
        data = bounded(lambda rel=rel: s.read_bytes(rel))
        info = s.stat(rel)
        out[rel] = (
            data if data is None or len(data) < 4096 else ("big", len(data)),
            bounded(lambda rel=rel: s.try_listdir(rel)),
            s.readlink(rel),
            s.link_name(rel),
            s.exists(rel),
            None if info is None else stat.S_IFMT(info.st_mode),
            s.mtime(rel) is not None,
            bounded(lambda rel=rel: list(s.walk_files(rel))) if rel in WALKED else None,
        )
    s.close()
    return out


def test_a_hostile_tree_reads_the_same_through_openat2_and_the_walk(tmp_path, monkeypatch) -> None:
    if not HAVE_OPENAT2:
        pytest.skip("this kernel (or its seccomp filter) has no openat2")
    root, _outside = hostile_tree(tmp_path)
    assert Sysfs(str(root)).kernel_confined
    through_kernel = answers(root)
    force_walk(monkeypatch)
    assert not Sysfs(str(root)).kernel_confined
    walked = answers(root)
    differ = {rel: (through_kernel[rel], walked[rel]) for rel in PATHS if through_kernel[rel] != walked[rel]}
    assert not differ


def test_what_a_hostile_tree_reads_as(tmp_path, mode) -> None:
    root, outside = hostile_tree(tmp_path)
    got = answers(root)
    read = {rel: a[0] for rel, a in got.items()}
    passwd = b"inside-passwd\n"
    # Links out of the root stay in it: the root's own passwd, or nothing.
    for rel in (
        "etc/abs-passwd",
        "etc/climb-passwd",
        "../../../../etc/passwd",
        "/etc/passwd",
        "proc/../../../etc/passwd",
        "dir-slash/etc/passwd",
        "dir-climb/etc/passwd",
        "sys/class/net/eth0/../../../../../../../../etc/passwd",
    ):
        assert read[rel] == passwd, rel
    assert read["dir-climb/proc/cmdline"] == b"inside\n"
    for rel in ("etc/abs-shadow", "etc/abs-outside", "etc/rel-outside", "etc/environ", "dir-out/canary"):
        assert read[rel] is None, rel
    assert read["dir-out-rel/canary"] is None and read["dir-out/sub/file"] is None
    assert got["dir-out"][1] is None and got["dir-out"][4] is True  # the link is there, its target is not
    assert got["dir-slash"][1] == got[""][1] == got["dir-slash/.."][1] == got["dir-climb"][1]
    assert all(OUTSIDE.encode() not in (a[0] if isinstance(a[0], bytes) else b"") for a in got.values())
    # Loops and chains past the kernel's 40 links read as missing; 40 still resolve.
    for rel in ("loop-a", "loop-a/x", "self", "self/x"):
        assert got[rel][0] is None and got[rel][1] is None, rel
    assert read["chain/c1"] == b"end\n" and read["chain/c0"] is None
    # Through links to directories, with `..`, `.` and `//`.
    assert read["sys/bus/pci/devices/0000:00:01.0/iommu_group/type"] == b"DMA\n"
    assert read["chain/dir/0000:00:01.0/iommu_group/type"] == b"DMA\n"
    assert read["sys/class/net/eth0/../../uevent"] == read[f"{DEVICE}/uevent"] != None  # noqa: E711
    assert read["sys//devices/./pci0000:00//0000:00:01.0/vendor"] == b"0x10de\n"
    assert "eth0" in got["sys/class/net/eth0/.."][1]
    # Not regular files: never read; a FIFO never blocks; a directory is not a file nor a file a directory.
    for rel in (
        "etc/fifo",
        "etc/to-fifo",
        f"{DEVICE}/fifo",
        "etc/null",
        "etc/zero",
        f"{DEVICE}/config",
        "proc/cmdline/",
    ):
        assert read[rel] is None, rel
    assert got[f"{DEVICE}/fifo"][1] is None and got["proc/cmdline"][1] is None and got["proc/cmdline/x"][4] is False
    # A huge file: one page of a sysfs attribute, at most MAX_READ_BYTES (and a chunk) of anything else.
    assert got[f"{DEVICE}/huge"][0] == ("big", 1 << 16)
    assert got["etc/huge"][0][1] <= sysfs_mod.MAX_READ_BYTES + (1 << 16)
    # A NUL is never a shorter path.
    assert got["etc/pass\x00wd"] == got["etc\x00/passwd"] == (None, None, None, None, False, None, False, None)
    # Links are data: read as stored, not followed.
    assert got["etc/abs-outside"][2] == str(outside / "canary") and got["etc/abs-outside"][4]
    assert got[f"{DEVICE}/iommu_group"][3] == "3"
    # walk_files: regular files only, no link followed (not even one to a directory inside).
    device_files = [f"{DEVICE}/{n}" for n in ("huge", "net/eth0/address", "uevent", "vendor")]
    inside = ["/chain/end", "/etc/huge", "/etc/passwd", "/proc/cmdline"]
    assert got[""][7] == [*inside, *(f"/{f}" for f in device_files), "/sys/kernel/iommu_groups/3/type"]
    assert got["sys"][7] == [*device_files, "sys/kernel/iommu_groups/3/type"]
    assert got["dir-out"][7] == [] and got["self"][7] == []
    assert got["dir-slash"][7] == [f"dir-slash{f}" for f in got[""][7]]


def test_fallback_when_the_kernel_has_no_openat2(tmp_path, monkeypatch) -> None:
    """ENOSYS (a kernel before 5.6), as a seccomp filter's EPERM would: the walk, same answers."""
    monkeypatch.setattr(openat2_mod, "_state", {})
    monkeypatch.setattr(openat2_mod, "_NR_OPENAT2", 1 << 20)  # no such system call: ENOSYS
    assert openat2_mod.opener() is None
    root, _outside = hostile_tree(tmp_path)
    s = Sysfs(str(root))
    assert not s.kernel_confined
    assert s.read("etc/abs-passwd") == "inside-passwd" and s.read("etc/abs-outside") is None
    monkeypatch.setattr(openat2_mod, "_state", {})
    monkeypatch.setattr(openat2_mod, "_NR_OPENAT2", 437)
    monkeypatch.setenv("GPUPROV_NO_OPENAT2", "1")
    assert openat2_mod.opener() is None


def test_a_seccomp_refusal_mid_run_reads_as_missing_not_outside(tmp_path, monkeypatch, mode) -> None:
    """openat2 failing after the probe (EPERM from a filter installed later) is a missing file, never a
    path the kernel resolves unconfined."""
    root, _outside = hostile_tree(tmp_path)
    s = Sysfs(str(root))
    if mode == "openat2":

        def refused(dirfd: int, path: str, flags: int) -> int:
            raise PermissionError(1, "Operation not permitted", path)

        s._root()
        s._open_in_root = refused
    assert s.read("proc/cmdline") == ("inside" if mode == "walk" else None)
    assert s.read("etc/abs-passwd") == ("inside-passwd" if mode == "walk" else None)


def test_directories_kept_open_are_bounded_and_closed(tmp_path, mode) -> None:
    root = tmp_path / "root"
    for i in range(3 * sysfs_mod.MAX_OPEN_DIRS):
        (root / f"sys/d{i}").mkdir(parents=True)
        (root / f"sys/d{i}/f").write_text(str(i))
    before = len(os.listdir("/proc/self/fd"))
    s = Sysfs(str(root))
    for _ in range(2):
        for i in range(3 * sysfs_mod.MAX_OPEN_DIRS):
            assert s.read(f"sys/d{i}/f") == str(i)
            assert s.listdir(f"sys/d{i}") == ["f"]
    # The root, MAX_OPEN_DIRS directories (the walk keeps their parents among them), no more.
    assert len(os.listdir("/proc/self/fd")) - before <= sysfs_mod.MAX_OPEN_DIRS + 1
    s.close()
    assert len(os.listdir("/proc/self/fd")) == before
    assert s.read("sys/d0/f") == "0"  # opened again
    del s
    assert len(os.listdir("/proc/self/fd")) == before


def test_held_directories_stay_open_bounded_and_are_released(tmp_path, mode) -> None:
    """A held directory outlives MAX_OPEN_DIRS others (a bridge whose devices come later); holds are
    bounded by MAX_HELD_DIRS, and once released the kept ones come back down to MAX_OPEN_DIRS."""
    root = tmp_path / "root"
    many = sysfs_mod.MAX_HELD_DIRS + 2 * sysfs_mod.MAX_OPEN_DIRS
    for i in range(many + 1):
        (root / f"sys/d{i}").mkdir(parents=True)
        (root / f"sys/d{i}/f").write_text(str(i))
    before = len(os.listdir("/proc/self/fd"))
    s = Sysfs(str(root))
    for i in range(many):
        assert s.names(f"sys/d{i}") == {"f"}
        s.hold(f"sys/d{i}")
    assert len(s._held) == sysfs_mod.MAX_HELD_DIRS and set(s._held) <= set(s._fds)
    assert "sys/d0" in s._fds  # held: still open, and its listing's types still known
    assert s.read_in("sys/d0", ["f", "missing"]) == {"f": "0"}
    # The root, the held ones and MAX_OPEN_DIRS others, no more.
    assert len(os.listdir("/proc/self/fd")) - before <= sysfs_mod.MAX_HELD_DIRS + sysfs_mod.MAX_OPEN_DIRS + 1
    for i in range(many):
        s.release(f"sys/d{i}")
    assert s.read(f"sys/d{many}/f") == str(many)  # one more opened: the rest closed down to the limit
    assert not s._held and len(s._fds) <= sysfs_mod.MAX_OPEN_DIRS
    s.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_read_in_reads_as_read(tmp_path, mode) -> None:
    """A directory's files read together: each as read() gives it, links followed inside the root,
    nothing that is not a regular file opened, and every read traced."""
    root = tmp_path / "root"
    (root / DEVICE).mkdir(parents=True)
    (root / DEVICE / "a").write_text(" 0x10de\n")
    (root / DEVICE / "empty").write_text("")
    os.mkfifo(root / DEVICE / "fifo")
    (root / "etc").mkdir()
    (root / "etc/inside").write_text("inside")
    os.symlink("/etc/inside", root / DEVICE / "abs-link")
    names = ["a", "empty", "fifo", "abs-link", "missing", "."]
    for listed in (False, True):
        s = Sysfs(str(root), trace=True)
        if listed:
            s.names(DEVICE)
        got = bounded(lambda s=s: s.read_in(DEVICE, names))
        assert got == {n: t for n in names if (t := Sysfs(str(root)).read(f"{DEVICE}/{n}")) is not None}
        assert got == {"a": "0x10de", "empty": "", "abs-link": "inside"}
        assert [rel for op, rel in s.trace or [] if op == "read"] == [f"{DEVICE}/{n}" for n in names]


def test_a_directory_replaced_while_kept_open_reads_its_new_files(tmp_path, mode) -> None:
    """A file written (or replaced) after its directory was opened is read; a directory renamed away is
    the one still open (as a process's cwd would be), so staged roots that change write files in place."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/a").write_text("1")
    s = Sysfs(str(root))
    assert s.read("etc/a") == "1" and s.listdir("etc") == ["a"]
    (root / "etc/b").write_text("2")
    (root / "etc/a.new").write_text("3")
    os.replace(root / "etc/a.new", root / "etc/a")
    assert s.read("etc/b") == "2" and s.read("etc/a") == "3" and s.exists("etc/b")


def test_the_live_root_reads_as_before(mode) -> None:
    live = Sysfs("/")
    assert not live.kernel_confined
    assert live.read("proc/cmdline") is not None and live.read("proc/self/status") is not None
    assert "self" in live.listdir("proc") and live.readlink("proc/self") == str(os.getpid())
    assert live.exists("proc/self") and live.stat("proc/self") is not None and live.mtime("proc/cmdline") is not None
    assert live.read("proc/\x00") is None and not live._fds


def test_inspect_reports_the_same_with_and_without_openat2(host_root, tmp_path) -> None:
    root = host_root("gpu-alone")
    outputs = []
    for extra in ({}, {"GPUPROV_NO_OPENAT2": "1"}):
        env = {**os.environ, "PYTHONPATH": str(REPO), **extra}
        env.pop("GPUPROV_NO_OPENAT2", None) if not extra else None
        run = subprocess.run(
            [sys.executable, "-m", "gpuprov", "inspect", "--json", "--root", str(root)],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=120,
            check=False,
        )
        assert run.returncode in (0, 3), run.stderr
        outputs.append(json.loads(run.stdout))
    assert outputs[0] == outputs[1] and outputs[0]["pci_devices"]


# Once, under PATH's python3: the walk is os.open/os.readlink with dir_fd, no ctypes; the second
# pass (Debian's python3) runs test_sysfs_safety.py itself, through openat2.
@pytest.mark.interpreter_independent
def test_the_safety_suite_passes_without_openat2(tmp_path) -> None:
    """tests/**/test_sysfs_safety.py again, on the walk: its answers do not depend on the kernel."""
    suite = sorted((REPO / "tests").rglob("test_sysfs_safety.py"))
    assert suite, "no test_sysfs_safety.py under tests/"
    env = {**os.environ, "GPUPROV_NO_OPENAT2": "1", "PYTHONPATH": str(REPO)}
    # Its own --basetemp: without one, that pytest's exit prunes the machine's older numbered
    # /tmp/pytest-of-<user>/pytest-N folders, any other run's included (seen: minutes on a
    # 244,000-entry folder a past run left, past this test's timeout).
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'inner'}",
            str(suite[0]),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


def test_a_managed_files_mode_is_read_inside_the_root(tmp_path, mode) -> None:
    """file_state's permission bits come from the file the bytes came from: a link's target inside the
    root, never the same path outside it."""
    from gpuprov.facts.files import file_state

    root, outside = hostile_tree(tmp_path)
    (root / "etc/passwd").chmod(0o640)
    (outside / "canary").chmod(0o604)
    s = Sysfs(str(root))
    assert file_state(s, "etc/abs-passwd") == (b"inside-passwd\n", 0o640)
    assert file_state(s, "etc/climb-passwd") == (b"inside-passwd\n", 0o640)
    assert file_state(s, "etc/abs-outside") == (None, None)
    assert file_state(s, "etc/fifo") == (None, None)
