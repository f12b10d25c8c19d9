"""Sysfs(root) never leaves its root and never blocks (issue #11, category 1).

A directory root (an unpacked capture, a staged root) is as untrusted as a tarball and can
hold what a tarball never gets past gpuprov.rootfs: links anywhere, FIFOs, device nodes.
Reads resolve every link inside the root, as if it were `/` (docs/concepts/captures.md).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuprov.facts import sysfs as sysfs_mod
from gpuprov.facts.sysfs import Sysfs
from tests.cli.test_hostile_captures import SECRET, World, run

OUTSIDE = "CANARY-CONTENT-a41c"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    (r / "sys/class/net").mkdir(parents=True)
    (r / "proc").mkdir()
    (r / "proc/cmdline").write_text("inside\n")
    return r


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    o = tmp_path / "outside"
    o.mkdir()
    (o / "canary").write_text(OUTSIDE)
    os.symlink("canary", o / "link")
    return o


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
    if path.exists() or path.is_symlink():
        path.unlink()
    os.symlink(str(target), path)


# Links that would leave the root if the kernel resolved them: (link, target, what a read gives).
ESCAPES = [
    ("absolute-to-outside", "proc/cmdline", "OUTSIDE/canary", None),
    ("absolute-to-etc-passwd", "proc/cmdline", "/etc/passwd", None),
    ("absolute-to-proc-environ", "proc/cmdline", "/proc/self/environ", None),
    ("relative-climbing", "proc/cmdline", "../../../../../../../../etc/passwd", None),
    ("relative-climbing-to-inside", "proc/cmdline", "../../../../../../../../sys/inside", "kept\n"),
    ("absolute-to-inside", "proc/cmdline", "/sys/inside", "kept\n"),
    ("dir-link-to-outside", "proc", "OUTSIDE", None),
    ("dir-link-to-slash", "proc", "/", None),
    ("dir-link-climbing", "proc", "../../..", None),
]


@pytest.mark.parametrize(("case", "rel", "target", "expect"), ESCAPES, ids=[e[0] for e in ESCAPES])
def test_links_resolve_inside_the_root(case, rel, target, expect, root, outside) -> None:
    (root / "sys/inside").write_text("kept\n")
    if rel == "proc":
        shutil.rmtree(root / "proc")
    link(root, rel, target.replace("OUTSIDE", str(outside)))
    s = Sysfs(str(root))
    got = s.read_bytes("proc/cmdline")
    assert got == (expect.encode() if expect else None)
    assert s.read_bytes("proc/canary") is None and s.read_bytes("proc/passwd") is None
    assert s.readlink("proc/link") is None  # the outside dir's own link is not reachable
    assert not s.exists("proc/canary")
    assert "canary" not in (s.try_listdir("proc") or [])
    assert (s.try_listdir("proc") or []) == (s.try_listdir("") if target in ("/", "../../..") else s.listdir("proc"))


def test_readlink_does_not_follow_an_escaping_parent(root, outside) -> None:
    link(root, "sys/class/net/eth0", outside)  # sys/class/net/eth0/link -> canary, outside
    s = Sysfs(str(root))
    assert s.readlink("sys/class/net/eth0") == str(outside)  # the link itself is data
    assert s.readlink("sys/class/net/eth0/link") is None
    assert s.link_name("sys/class/net/eth0/link") is None
    assert s.resolve("sys/class/net/eth0").startswith(str(outside).lstrip("/"))  # a root-relative name


def test_dotdot_in_a_path_stays_at_the_top(root) -> None:
    (root / "etc").mkdir()
    (root / "etc/os-release").write_text("ID=inside\n")
    s = Sysfs(str(root))
    assert s.read("../../../../etc/os-release") == "ID=inside"
    assert s.read("proc/../../../etc/os-release") == "ID=inside"


def test_link_loops_and_long_chains_read_as_missing(root) -> None:
    link(root, "sys/a", "b")
    link(root, "sys/b", "a")
    link(root, "sys/self", "self/x")
    (root / "sys/end").write_text("end\n")
    for i in range(sysfs_mod.MAX_LINK_HOPS + 1):
        link(root, f"sys/c{i}", f"c{i + 1}" if i < sysfs_mod.MAX_LINK_HOPS else "end")
    s = Sysfs(str(root))
    for rel in ("sys/a", "sys/b/x", "sys/self", "sys/self/x/y"):
        assert bounded(lambda rel=rel: s.read(rel)) is None
        assert bounded(lambda rel=rel: s.try_listdir(rel)) is None
        assert bounded(lambda rel=rel: s.resolve(rel)) is not None
    # Fresh readers: a chain resolved before is remembered, and its hops are not counted again.
    assert Sysfs(str(root)).read("sys/c1") == "end"  # 40 hops: the kernel's limit, still followed
    assert Sysfs(str(root)).read("sys/c0") is None  # 41: a loop as far as anyone can tell


def test_a_fifo_reads_as_missing_without_blocking(root) -> None:
    (root / "proc/cmdline").unlink()
    os.mkfifo(root / "proc/cmdline")
    os.mkfifo(root / "sys/fifo")
    link(root, "sys/to-fifo", "/proc/cmdline")
    s = Sysfs(str(root))
    for rel in ("proc/cmdline", "sys/fifo", "sys/to-fifo"):
        assert bounded(lambda rel=rel: s.read(rel)) is None
    assert bounded(lambda: s.try_listdir("sys/fifo")) is None
    assert list(s.walk_files("sys")) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_a_device_node_is_never_opened(root) -> None:
    os.mknod(root / "sys/null", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null: harmless if opened
    os.mknod(root / "sys/loop", stat.S_IFBLK | 0o666, os.makedev(7, 0))
    link(root, "sys/to-null", "null")
    link(root, "sys/dev-zero", "/dev/zero")  # the machine's /dev/zero would stream forever
    s = Sysfs(str(root))
    for rel in ("sys/null", "sys/loop", "sys/to-null", "sys/dev-zero"):
        assert bounded(lambda rel=rel: s.read_bytes(rel)) is None
    assert s.exists("sys/null")  # there, but not a file gpuprov reads


def test_a_directory_past_the_entry_cap_is_unknown_not_partial(root, monkeypatch) -> None:
    monkeypatch.setattr(sysfs_mod, "MAX_DIR_ENTRIES", 10)
    for i in range(10):
        (root / "sys/class/net" / f"e{i}").mkdir()
    assert len(Sysfs(str(root)).listdir("sys/class/net")) == 10
    (root / "sys/class/net/e10").mkdir()
    assert Sysfs(str(root)).try_listdir("sys/class/net") is None


def test_a_nul_in_a_path_built_from_data_reads_as_missing(root) -> None:
    s = Sysfs(str(root))
    assert s.read("sys/bus/pci/drivers/a\x00b/new_id") is None
    assert s.try_listdir("sys/\x00") is None and s.readlink("sys/\x00") is None and not s.exists("sys/\x00")
    live = Sysfs("/")
    assert live.read("proc/\x00") is None and live.readlink("proc/\x00") is None


def test_walk_files_keeps_to_regular_files_inside(root, outside) -> None:
    (root / "etc/x").mkdir(parents=True)
    (root / "etc/x/a.conf").write_text("a")
    link(root, "etc/x/escape", outside)
    link(root, "etc/x/b.conf", outside / "canary")
    os.mkfifo(root / "etc/x/fifo")
    assert list(Sysfs(str(root)).walk_files("etc")) == ["etc/x/a.conf"]


def test_the_live_root_reads_as_before_and_skips_a_fifo(tmp_path) -> None:
    live = Sysfs("/")
    assert live.read("proc/cmdline") is not None
    assert live.try_listdir("proc") and "self" in live.listdir("proc")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert bounded(lambda: live.read(str(fifo).lstrip("/"))) is None


def test_inspect_of_a_hostile_directory_root(root, outside, tmp_path, host_root) -> None:
    """The whole command on a directory root: a link to the environment, one to passwd, a FIFO
    where a device attribute should be: a report, nothing of the machine in it, no hang."""
    tree = tmp_path / "tree"
    shutil.copytree(host_root("gpu-alone"), tree, symlinks=True)
    link(tree, "proc/cmdline", "/proc/self/environ")
    link(tree, "etc/os-release", "../../../../../../../../../etc/passwd")
    uevent = tree / "sys/bus/pci/devices/0000:01:00.0/uevent"
    real = uevent.resolve()
    real.unlink()
    os.mkfifo(real)
    world = World(tmp_path / "tmp", outside, outside / "canary", outside / "vms.yml")
    world.tmp.mkdir()
    result = run(world, ["inspect", "--json", "--root", str(tree)])
    assert result.returncode in (0, 3), result.stderr
    out = result.stdout + result.stderr
    assert SECRET not in out and "root:x:0:0" not in out and "Traceback" not in out
    assert json.loads(result.stdout)["iommu"]["cmdline"] in ("", None)


def test_a_plan_applied_on_a_staged_root_never_writes_through_its_links(tmp_path: Path) -> None:
    """A staged root whose etc/ is a link to a directory outside (absolute or climbing with ..):
    files the plan writes, replaces or removes land inside the root, never outside it."""
    from gpuprov.apply.actions import apply
    from gpuprov.core.plan import Plan, file_action

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep")
    for target in (str(outside), "../outside"):
        root = tmp_path / f"root-{len(target)}"
        root.mkdir()
        (root / "etc").symlink_to(target)
        plan = Plan()
        plan.actions.append(file_action("etc/victim", "written", None, "test"))
        plan.actions.append(file_action("etc/new/file", "written", None, "test"))
        apply(plan, str(root))
        assert (outside / "victim").read_text() == "keep" and sorted(p.name for p in outside.iterdir()) == ["victim"]
        inside = root / str(target).lstrip("/").replace("../", "")
        assert (inside / "victim").read_text() == "written" and (inside / "new/file").read_text() == "written"
