"""Issue #26, items 5, 6 and 7: intent that failed silently, convert's crashes, fail-open answers.

Each case is a regression test (the hostile input, the refusal naming its entry or key path, and
nothing changed where the command could write), then one hypothesis property over mutated
declarations through the resolver and ``gpuprov plan``: no exception escapes, every bad one is
refused naming the entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuprov.cli.main import main
from gpuprov.core.vm_spec import HostSettings
from gpuprov.facts.host import HostFacts, gather
from gpuprov.facts.sysfs import Sysfs
from gpuprov.facts.usage import guest_of_cmdline
from gpuprov.inputs.hostroot import root_problem
from gpuprov.model.convert import ConvertError, convert
from gpuprov.model.resolve import resolve
from gpuprov.plan.vm.fit import plan_host
from tests.conftest import REPO, collections_path, tree_digest
from tests.fakehost import FakeHost
from tests.model.test_host_model import CONSOLE, H100, SRIOV, VGPU, build_host, declaration, vm

A = H100[0]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_host(tmp_path_factory.mktemp("intent-host"))


@pytest.fixture(scope="module")
def facts(host: Path) -> HostFacts:
    return gather(Sysfs(str(host)))


def plan_cli(tmp_path: Path, root: Path, doc: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`gpuprov plan --json` on ``doc``: (exit code, stdout+stderr); the root and the file unchanged."""
    path = tmp_path / "host.yml"
    path.write_text(yaml.safe_dump(doc))
    before = (tree_digest(root), path.read_bytes())
    rc = main(["plan", str(path), "--root", str(root), "--json"])
    out = capsys.readouterr()
    assert (tree_digest(root), path.read_bytes()) == before
    assert "Traceback" not in out.err
    return rc, out.out + out.err


# ---------------------------------------------------------------- item 5: convert


CONVERT_HOSTILE = [
    ({"gpuprov_gpus": {A: {"use": "mdev", "mdevs": [5]}}}, f"gpuprov_gpus.{A}: mdevs[0]"),
    ({"gpuprov_gpus": {A: {"use": "mdev", "mdevs": ["A100-4C"]}}}, f"gpuprov_gpus.{A}: mdevs[0]"),
    ({"gpuprov_gpus": {A: {"use": "sriov_vgpu", "vgpus": [[1, 2]]}}}, f"gpuprov_gpus.{A}: vgpus[0]"),
    ({"gpuprov_gpus": {A: {"use": "sriov_vgpu", "vgpus": {"a": 1}}}}, f"gpuprov_gpus.{A}"),
    ({"gpuprov_gpus": {A: {"use": "mdev", "mdevs": [{"type": "x", "color": 1}]}}}, f"gpuprov_gpus.{A}"),
    ({"gpuprov_gpus": {A: {"use": "mig", "mig": [[1]]}}}, f"gpuprov_gpus.{A}: mig"),
    ({"gpuprov_gpus": [1]}, "gpuprov_gpus"),
    ({"gpu_vms_list": [{"name": "a", "mdevs": [5]}]}, "gpu_vms_list[0].mdevs[0]"),
    ({"gpu_vms_list": [{"name": "a", "vfs": [[1]]}]}, "gpu_vms_list[0].vfs[0]"),
    ({"gpu_vms_list": [{"name": "a", "gpus": [{"address": [1]}]}]}, "gpu_vms_list[0].gpus[0].address"),
    ({"gpu_vms_list": [{"name": "bad name!", "memory_mib": -1}]}, "gpu_vms_list[0].name"),
    ({"gpu_vms_list": 5}, "gpu_vms_list"),
    ({"gpu_vms_list": [], "gpu_vms_defaults": [1]}, "gpu_vms_defaults"),
    ({"vfio_host_devices": [5]}, "vfio_host_devices[0]"),
]


@pytest.mark.parametrize(("doc", "named"), CONVERT_HOSTILE)
def test_convert_refuses_a_malformed_old_value_naming_its_path(facts, doc, named) -> None:
    with pytest.raises(ConvertError) as caught:
        convert(doc, facts)
    assert named in str(caught.value)
    assert "fix" in str(caught.value) or "write" in str(caught.value) or "give" in str(caught.value)


@pytest.mark.parametrize(("doc", "named"), CONVERT_HOSTILE[:3])
def test_convert_on_the_cli_is_exit_2_and_writes_nothing(tmp_path, host, capsys, doc, named) -> None:
    path = tmp_path / "old.yml"
    path.write_text(yaml.safe_dump(doc))
    before = (tree_digest(host), tree_digest(tmp_path))
    assert main(["convert", str(path), "--root", str(host)]) == 2
    out = capsys.readouterr()
    assert named in out.err and "Traceback" not in out.err and out.out == ""
    assert (tree_digest(host), tree_digest(tmp_path)) == before


# ---------------------------------------------------------------- item 6: intent


def test_two_selectors_over_one_gpu_are_refused_naming_both(tmp_path, host, capsys) -> None:
    gpus = [{"name": "keep", "select": "all", "use": "host"}, {"name": "train", "select": "all", "use": "passthrough"}]
    rc, out = plan_cli(tmp_path, host, declaration(gpus, [vm("a", "train")]), capsys)
    assert rc == 3
    report = json.loads(out)
    messages = [r["message"] for r in report["refusals"]]
    assert any("gpuprov_host.gpus[1] 'train' and gpuprov_host.gpus[0] 'keep' both match" in m for m in messages)
    assert any("'a': gpus[0]: 'train'" in m and "stands for no GPU" in m for m in messages)


@pytest.mark.parametrize(
    "pair",
    [
        ({"select": "all"}, {"select": "10de:2330"}),
        ({"select": "10de:2330"}, {"select": {"model": "NVIDIA"}}),
        ({"select": {"index": 1}}, {"select": "all"}),
        ({"select": "all"}, {"select": {"index": 1}}),
    ],
)
def test_any_two_overlapping_selectors_are_refused(facts, pair) -> None:
    gpus = [{"name": "one", "use": "host", **pair[0]}, {"name": "two", "use": "passthrough", **pair[1]}]
    model = resolve(declaration(gpus), facts)
    assert any("'two' and gpuprov_host.gpus[0] 'one' both match" in r.message for r in model.refusals), model.refusals


def test_an_address_entry_still_carves_its_gpu_out_of_select_all(facts) -> None:
    gpus = [{"name": "console", "address": CONSOLE, "use": "host"}, {"name": "rest", "select": "all", "use": "host"}]
    model = resolve(declaration(gpus), facts)
    assert (model.problems, model.refusals) == ([], [])
    assert CONSOLE not in next(g for g in model.gpus if g.name == "rest").addresses


@pytest.mark.parametrize(
    ("gpus", "ref", "named"),
    [
        ([{"name": "t", "select": {"model": "nothing-like-it"}, "use": "passthrough"}], "t", "'t' is gpuprov_host"),
        (  # its only match is named by address elsewhere: the entry stands for nothing
            [
                {"name": "x", "address": VGPU, "use": "host"},
                {"name": "t", "select": "10de:20b0", "use": "passthrough"},
            ],
            "t",
            "stands for no GPU on this host",
        ),
        ([{"name": "t", "address": "0000:e1:00.0", "use": "passthrough"}], "t", "'t'"),
        ([{"name": "m", "address": VGPU, "use": "mdev", "instances": {"nvidia-999": 1}}], "m.0", "'m.0'"),
    ],
)
def test_a_vm_whose_gpu_resolves_to_nothing_is_refused(facts, gpus, ref, named) -> None:
    model = resolve(declaration(gpus, [vm("a", ref)]), facts)
    vm_refusals = [r.message for r in model.refusals if r.message.startswith("gpuprov_host.vms[0] 'a'")]
    assert vm_refusals and any(named in m for m in vm_refusals), model.refusals


@pytest.mark.parametrize(
    "old",
    [
        {"gpu_vms_list": [{"name": "bad name!", "memory_mib": -1}]},
        {"gpu_vms_list": []},
        {"gpuprov_gpus": {A: {"use": "passthrough"}}},
        {"vfio_host_devices": [A]},
        {"gpu_vms_defaults": {"vcpus": 2}},
        {"gpu_vms_reserved_cpus": "0-1"},
    ],
)
def test_the_new_form_beside_an_old_variable_is_refused_naming_both(tmp_path, host, capsys, old) -> None:
    doc = {**declaration([{"name": "t", "address": A, "use": "passthrough"}], [vm("a", "t")]), **old}
    rc, out = plan_cli(tmp_path, host, doc, capsys)
    assert rc == 2
    name = next(iter(old))
    assert f"gpuprov_host and the old variables {name} are set together" in out and "gpuprov convert" in out


@pytest.mark.parametrize(
    "doc",
    [
        declaration([{"name": "train\n", "address": A, "use": "passthrough"}]),
        declaration([{"name": "t", "address": A, "use": "passthrough"}], [vm("a", "t\n")]),
        {"gpuprov_layouts": {"l\n": {"gpus": []}}, "gpuprov_host": {"layout": "l"}},
        {"gpuprov_layouts": {"l": {"gpus": []}}, "gpuprov_host": {"layout": "l\n"}},
        declaration([{"name": "t", "address": A + "\n", "use": "passthrough"}]),
        declaration([{"name": "t", "select": "all\n", "use": "passthrough"}]),
        declaration([{"name": "t", "address": A, "expect": "10de:2330\n", "use": "passthrough"}]),
        declaration([{"name": "v", "address": VGPU, "use": "mdev", "instances": [{"type": "a", "name": "n\n"}]}]),
    ],
)
def test_a_trailing_newline_is_not_a_name(tmp_path, host, capsys, doc) -> None:
    rc, out = plan_cli(tmp_path, host, doc, capsys)
    assert rc == 2 and "\\n" in out  # the value shown escaped, named by its path


def test_gpu_host_model_refuses_the_old_and_the_new_together(host) -> None:
    from tests.modrun import run_in_process

    host_decl = declaration([{"name": "t", "address": A, "use": "passthrough"}], [vm("a", "t")])["gpuprov_host"]
    result = run_in_process("gpu_host_model", {"root": str(host), "host": host_decl, "vms": [{"name": "b"}]})
    assert result["failed"] and "gpu_vms_list are set together" in result["msg"]
    named = {"root": str(host), "host": host_decl, "old_variables": ["gpu_vms_reserved_cpus"]}
    result = run_in_process("gpu_host_model", named)
    assert result["failed"] and "gpu_vms_reserved_cpus are set together" in result["msg"]
    train = {"root": str(host), "host": declaration([{"name": "train\n", "address": A, "use": "host"}])["gpuprov_host"]}
    assert run_in_process("gpu_host_model", train)["failed"]


def test_role_host_model_refuses_an_inventory_gpu_vms_list_beside_gpuprov_host(tmp_path, host) -> None:
    collections_path()
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {"host_model_root": str(host)},
            "roles": [{"role": "gpuprov.kvm.host_model"}],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    extra = {
        "gpuprov_host": {"gpus": [{"name": "t", "address": A, "use": "passthrough"}], "reserved_cpus": ""},
        "gpu_vms_list": [{"name": "bad name!", "memory_mib": -1}],
        "ansible_python_interpreter": sys.executable,
    }
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", str(tmp_path / "play.yml")]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    before = tree_digest(host)
    proc = subprocess.run(
        [*cmd, "-e", json.dumps(extra)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "gpu_vms_list are set together" in proc.stdout + proc.stderr
    assert tree_digest(host) == before


# ---------------------------------------------------------------- item 7: no success without evidence


@pytest.mark.parametrize("kind", ["missing", "file", "tarball", "no-sys"])
def test_gpu_host_facts_refuses_a_root_that_is_no_host(tmp_path, kind) -> None:
    from tests.modrun import run_in_process

    root = {
        "missing": tmp_path / "nonexistent",
        "file": tmp_path / "f.txt",
        "tarball": tmp_path / "host.tar.gz",
        "no-sys": tmp_path / "empty",
    }[kind]
    if kind in ("file", "tarball"):
        root.write_bytes(b"x")
    if kind == "no-sys":
        root.mkdir()
    before = tree_digest(tmp_path)
    result = run_in_process("gpu_host_facts", {"root": str(root)})
    assert result["failed"] and "ansible_facts" not in result
    assert result["msg"] == root_problem(str(root), "root", captures=False)
    assert tree_digest(tmp_path) == before
    assert run_in_process("gpu_host_model", {"root": str(root), "host": {"gpus": []}})["failed"]


# Every other module with a `root`, and what it needs there (sys/ for those that read devices).
ROOT_MODULES = {
    "apt_components": ({"codename": "bookworm", "components": ["contrib"]}, False),
    "apt_keyring": ({"dest": "/etc/apt/keyrings/x.gpg", "data": "eA=="}, False),
    "guest_driver": ({}, True),
    "guest_toolkit": ({"parts": ["runtime"]}, True),
    "kernel_cmdline": ({"arguments": ["iommu=pt"]}, False),
    "gpu_vm": ({"vm": {"name": "vm1", "memory_mib": 1024, "vcpus": 1}}, True),
    "gpu_vm_host": ({}, False),
}


@pytest.mark.parametrize("module", sorted(ROOT_MODULES))
@pytest.mark.parametrize("kind", ["missing", "file", "tarball", "no-sys"])
def test_every_module_refuses_a_root_that_is_not_there(tmp_path, module, kind) -> None:
    """Issue 26, item 7: no module answers from a root that is not there (it would read as a host with
    nothing on it); the refusal is the CLI's wording and nothing is written."""
    from tests.modrun import run_in_process

    args, needs_sys = ROOT_MODULES[module]
    root = {"missing": tmp_path / "nonexistent", "file": tmp_path / "f.txt", "tarball": tmp_path / "h.tar.gz"}.get(
        kind, tmp_path / "empty"
    )
    if kind in ("file", "tarball"):
        root.write_bytes(b"x")
    if kind == "no-sys":
        root.mkdir()
    before = tree_digest(tmp_path)
    result = run_in_process(module, {**args, "root": str(root)}, check=True)
    if kind == "no-sys" and not needs_sys:
        assert "has no sys/ directory" not in str(result.get("msg"))  # a directory of files is all it reads
    else:
        assert result["failed"], result
        assert result["msg"] == root_problem(str(root), "root", captures=False, host=needs_sys) + "; nothing changed"
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("kind", ["missing", "file", "no-sys"])
def test_the_module_check_and_the_cli_refuse_the_same_roots(tmp_path, capsys, kind) -> None:
    root = tmp_path / kind
    if kind == "file":
        root.write_text("x")
    if kind == "no-sys":
        root.mkdir()
    assert main(["inspect", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    problem = root_problem(str(root), captures=False)
    assert problem is not None
    # The same verdict, the same words up to how the path is quoted (one check, main.py to call it).
    assert problem.split(" ", 2)[2].split(":")[0] in err


def holder_host(root: Path, cmdline: bytes | None, pidfile: str | None = None) -> HostFacts:
    fake = FakeHost(root)
    fake.pci("0000:41:00.0", cls=0x030200, group=5, driver="vfio-pci")
    from tests.vmhosts import GIB_KIB, add_numa

    add_numa(fake, [("0-7", 64 * GIB_KIB, {})])
    fake.open_file(4242, "qemu-system-x86", "/dev/vfio/5")
    if cmdline is not None:
        fake.write("proc/4242/cmdline", cmdline)
    if pidfile is not None:
        fake.write(f"run/libvirt/qemu/{pidfile}.pid", "4242")
    return gather(Sysfs(str(fake.finish())))


GUEST_A = b"/usr/bin/qemu-system-x86_64\0-name\0guest=a,debug-threads=on\0-S\0"


@pytest.mark.parametrize(
    ("cmdline", "pidfile", "refused", "named"),
    [
        (None, None, True, "qemu-system-x86 (pid 4242) has /dev/vfio/5 open; a holder plan cannot tie to VM a"),
        (GUEST_A.replace(b"guest=a", b"guest=b"), None, True, "(pid 4242, guest b) has /dev/vfio/5 open; another VM's"),
        (b"qemu\0-name\0b\0", None, True, "guest b"),
        (b"sleep\0100\0", None, True, "cannot tie to VM a"),
        (b"qemu\0-name\0guest=a\nb\0", None, True, "cannot tie to VM a"),  # not a printable name
        (GUEST_A, None, False, "held open by this VM's own QEMU (pid 4242)"),
        (b"qemu\0-name\0a\0", None, False, "this VM's own QEMU"),
        (None, "a", False, "this VM's own QEMU"),
        (None, "b", True, "another VM's (b)"),
    ],
)
def test_a_vfio_gpu_held_open_is_refused_unless_it_is_this_vms_own(tmp_path, cmdline, pidfile, refused, named) -> None:
    facts = holder_host(tmp_path / "root", cmdline, pidfile)
    plan = plan_host(facts, [{"name": "a", "memory_mib": 128, "gpus": ["0000:41:00.0"]}], HostSettings(0, ""))
    texts = [r.message for r in plan.refusals] if refused else plan.warnings
    assert any(named in t for t in texts), (plan.refusals, plan.warnings)
    if not refused:
        assert not plan.refusals


@pytest.mark.parametrize("by", ["cmdline", "pidfile"])
def test_a_capture_ties_a_holder_to_its_vm_as_the_live_host_does(tmp_path, by) -> None:
    """Issue #50: a capture of a host whose VM runs with its GPU plans that VM as the live host does;
    the capture keeps the guest's name as a digest and nothing else of QEMU's command line."""
    from gpuprov.cli import rootfs
    from gpuprov.cli.capture import capture

    secret = b"-object\0secret,id=s0,data=hunter2\0"
    cmdline = GUEST_A + secret if by == "cmdline" else b"/usr/bin/qemu-system-x86_64\0" + secret
    live = holder_host(tmp_path / "root", cmdline, "a" if by == "pidfile" else None)
    tarball = tmp_path / "c.tar.gz"
    capture(str(tarball), str(tmp_path / "root"), run_commands=False)
    raw = subprocess.run(["tar", "-xzOf", str(tarball)], capture_output=True, check=True).stdout
    assert b"hunter2" not in raw and b"guest=a," not in raw and b"qemu/a.pid" not in raw
    (tmp_path / "unpacked").mkdir()
    rootfs.unpack(str(tarball), str(tmp_path / "unpacked"))
    captured = gather(Sysfs(str(tmp_path / "unpacked")))
    for facts in (live, captured):
        for name, refused in (("a", False), ("b", True)):
            plan = plan_host(facts, [{"name": name, "memory_mib": 128, "gpus": ["0000:41:00.0"]}], HostSettings(0, ""))
            if refused:
                assert any("in use" in r.message for r in plan.refusals), plan.refusals
            else:
                assert not plan.refusals and any("held open by this VM's own QEMU" in w for w in plan.warnings)


def test_plan_on_a_capture_refuses_a_held_vfio_gpu_naming_the_holder(tmp_path, host_root, capsys) -> None:
    root = host_root("vfio-bound")
    rc, out = plan_cli(tmp_path, root, [{"name": "a", "memory_mib": 128, "gpus": ["0000:01:00.0"]}], capsys)
    assert rc == 3 and "sleep (pid 194) has /dev/vfio/6 open" in out


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        (b"qemu\0-name\0guest=vm,,1,debug-threads=on\0", "vm,1"),
        (b"qemu\0-name\0", None),
        (b"qemu\0-name\0debug-threads=on\0", None),
        (b"qemu\0-name\0" + b"x" * 300 + b"\0", None),
        (b"", None),
    ],
)
def test_guest_of_cmdline(raw, name) -> None:
    assert guest_of_cmdline(raw) == name


# ---------------------------------------------------------------- the property


NAMES = st.one_of(
    st.sampled_from(["train", "keep", "a100", "h"]),
    st.sampled_from(["train\n", "l\n", "x\r", "a\x00", "t\x1b[31m", "Train", "1x", "", "a" * 40]),
)
SELECTS = st.sampled_from(["all", "10de:2330", "10de:20b0", {"index": 0}, {"index": 9}, {"model": "NVIDIA"}])
ADDRESSES = st.sampled_from([A, H100[1], CONSOLE, VGPU, SRIOV, "0000:e1:00.0", A + "\n"])
USES = st.sampled_from(["host", "passthrough", "mdev", "mig"])


@st.composite
def declarations(draw: st.DrawFn) -> dict[str, Any]:
    gpus = []
    for _ in range(draw(st.integers(1, 4))):
        entry: dict[str, Any] = {"name": draw(NAMES), "use": draw(USES)}
        if draw(st.booleans()):
            entry["select"] = draw(SELECTS)
        else:
            entry["address"] = draw(ADDRESSES)
        gpus.append(entry)
    names = [g["name"] for g in gpus] + ["nothing", "train[3]", "keep.0"]
    vms = [
        vm(draw(st.sampled_from(["a", "b", "bad name!", "c\n"])), *draw(st.lists(st.sampled_from(names), max_size=3)))
    ]
    doc = declaration(gpus, vms)
    if draw(st.booleans()):
        doc[draw(st.sampled_from(["gpu_vms_list", "gpuprov_gpus", "vfio_host_devices", "gpu_vms_defaults"]))] = []
    return doc


def _bad(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    """What a declaration must be refused for, by an oracle independent of the resolver's code:
    each as the ways a message may name the entry (its path, its name as repr shows it)."""
    import re

    bad: list[tuple[str, ...]] = []
    if any(k != "gpuprov_host" for k in doc):
        bad.append(("gpuprov_host and the old variables",))
    for i, g in enumerate(doc["gpuprov_host"]["gpus"]):
        named = (f"gpuprov_host.gpus[{i}]", repr(g["name"])[1:-1])
        if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", g["name"]):
            bad.append(named)
        if "address" in g and not re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", g["address"]):
            bad.append(named)
    for i, v in enumerate(doc["gpuprov_host"]["vms"]):
        for j, ref in enumerate(v["gpus"]):
            if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}(\[[0-9]{1,4}\]|\.[0-9]{1,4})?", ref):
                bad.append((f"gpuprov_host.vms[{i}].gpus[{j}]", repr(ref)[1:-1]))
    return bad


@settings(max_examples=60, deadline=None)
@given(doc=declarations())
def test_mutated_declarations_never_escape_and_bad_ones_are_refused_naming_the_entry(facts, doc) -> None:
    model = resolve(doc, facts)
    told = [r.message for r in model.problems + model.refusals]
    for names in _bad(doc):
        assert any(n in m for m in told for n in names), (names, told)
    if model.problems:
        return
    # Resolved: every VM with names gets a device for each, or a refusal names the VM.
    plan = plan_host(facts, model.vm_list, model.settings, path=model.vm_path, declared=model.checked_uses)
    by_name = {v["name"]: v for v in model.vm_list}
    for i, v in enumerate(doc["gpuprov_host"]["vms"]):
        got = by_name.get(v["name"], {})
        devices = len(got.get("gpus", [])) + len(got.get("mdevs", [])) + len(got.get("vfs", []))
        if v["gpus"] and devices == 0:
            assert any(m.startswith(f"gpuprov_host.vms[{i}]") for m in told), (doc, told)
    # Two entries over one GPU: refused naming both.
    owners: dict[str, list[str]] = {}
    for g in model.gpus:
        for a in g.addresses:
            owners.setdefault(a, []).append(g.name)
    assert all(len(v) == 1 for v in owners.values()) or model.refusals
    assert plan is not None


HOSTILE_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(["A100-4C", "nvidia-474", "x\n", A])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["type", "uuid", "vf", "use"]), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def old_layouts(draw: st.DrawFn) -> dict[str, Any]:
    use = draw(st.sampled_from(["mdev", "sriov_vgpu", "mig", "passthrough", 5]))
    key = {"mdev": "mdevs", "sriov_vgpu": "vgpus", "mig": "mig"}.get(use, "mdevs") if isinstance(use, str) else "x"
    doc: dict[str, Any] = {"gpuprov_gpus": {draw(ADDRESSES): {"use": use, key: draw(HOSTILE_VALUES)}}}
    if draw(st.booleans()):
        doc["gpu_vms_list"] = [{"name": "a", draw(st.sampled_from(["gpus", "mdevs", "vfs"])): draw(HOSTILE_VALUES)}]
    return doc


@settings(max_examples=60, deadline=None)
@given(doc=old_layouts())
def test_mutated_old_variables_through_convert_are_converted_or_refused_never_a_traceback(facts, doc) -> None:
    try:
        out, _notes = convert(doc, facts)
    except ConvertError as exc:
        assert str(exc).strip()
        return
    assert "gpuprov_host" in out
