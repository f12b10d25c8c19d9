"""Property tests of the validation boundary (hypothesis, the fixed budget of tests/conftest.py):
random host_vars documents (junk of every type in every field of a good document, strings with
control characters, nested junk) through the validator, ``gpuprov plan`` (in process and as a
subprocess) and the modules: never a traceback, exit 0, 2 or 3 only, and an accepted document
has the declared types. And whatever the validator accepts, gpu_vm's XML builder builds:
the domain XML parses and passes virt-xml-validate."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuprov.cli.main import main
from gpuprov.core.vm_spec import FIRMWARES, STATES, Placement, VmSpec
from gpuprov.inputs.boundary import validate_gpu_vgpu_options, validate_gpu_vm_options, validate_host_vars
from gpuprov.inputs.validate import (
    MAC_RE,
    MACHINE_RE,
    NETWORK_RE,
    ROM_DIR,
    UUID_RE,
    VENDOR_ID_RE,
    VM_NAME_RE,
)
from gpuprov.inputs.vm_list import parse_vm
from gpuprov.plan.vm.domain import build_domain, to_xml
from gpuprov.plan.vm.plan import domain_config, vm_paths
from tests.conftest import tree_digest
from tests.inputs.test_inputs import BASE, REPO
from tests.modrun import run_in_process
from tests.vmhosts import ssh_public_key

VALIDATE = shutil.which("virt-xml-validate")

# Strings people and attackers write: near misses of valid values, and control characters.
TRICKY = [
    "false",
    "yes",
    " true",
    "0-4000000000",
    "0-3\n",
    "52:54:00:00:00:01\n",
    "01:00:5e:00:00:01",
    "{{ x }}",
    "../x",
    "/etc/shadow",
    f"{ROM_DIR}/../x",
    "ssh-ed25519 AAAA",
    "q35\x07",
    "a\x1b[2Jb",
    "[/x]",
    "",
    "-1",
    "1e3",
    "\u202ename",
    "\ufeff",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=40),
    st.sampled_from(TRICKY),
)
junk = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


BASE_PATHS = list(_paths(BASE))[1:]


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    node = doc
    for key in path[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return  # an earlier change replaced what held this path
    if isinstance(node, (dict, list)):
        with contextlib.suppress(IndexError, TypeError):
            node[path[-1]] = value


@st.composite
def hostile_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        _set(doc, draw(st.sampled_from(BASE_PATHS)), draw(junk))
    if draw(st.booleans()):
        doc[draw(st.sampled_from(["gpu_vms_state", "gpu_vms_wait", "other_role_var", "gpu_vms_bogus"]))] = draw(junk)
    return doc


# ---------------------------------------------------------------- what "validated" means


def assert_typed(spec: VmSpec) -> None:
    """A VM the validator accepted has the declared types and meets the rules."""
    assert isinstance(spec.name, str) and VM_NAME_RE.fullmatch(spec.name)
    assert spec.state is None or spec.state in STATES
    for number in (spec.memory_mib, spec.vcpus):
        assert type(number) is int and number > 0
    assert spec.firmware in FIRMWARES and isinstance(spec.machine, str) and MACHINE_RE.fullmatch(spec.machine)
    assert spec.numa_node is None or (type(spec.numa_node) is int and spec.numa_node >= 0)
    assert spec.cpuset is None or (all(type(c) is int and 0 <= c < 8192 for c in spec.cpuset))
    assert type(spec.pin) is bool and type(spec.autostart) is bool and spec.hide_kvm in (None, True, False)
    assert spec.hugepages in ("auto", "yes", "no")
    assert spec.network is None or NETWORK_RE.fullmatch(spec.network)
    assert spec.mac is None or (MAC_RE.fullmatch(spec.mac) and not int(spec.mac[:2], 16) & 1)
    assert spec.vendor_id is None or VENDOR_ID_RE.fullmatch(spec.vendor_id)
    for m in spec.mdevs:
        assert UUID_RE.fullmatch(m.uuid) and "/" not in m.type and "/" not in m.parent
    for g in spec.gpus:
        assert g.rom in (None, "on", "off") or g.rom.startswith(ROM_DIR + "/")
    texts = [spec.boot.cmdline or "", spec.boot.kernel, spec.boot.initrd or ""] if spec.boot else []
    if spec.cloud_init:
        texts += [spec.cloud_init.user, *spec.cloud_init.ssh_authorized_keys, *spec.cloud_init.packages]
    assert all(isinstance(t, str) and t.isprintable() for t in texts)


@given(hostile_documents())
def test_the_validator_never_raises_and_types_what_it_accepts(doc: dict[str, Any]) -> None:
    host_vars, problems = validate_host_vars(doc, cpu_limit=2)
    assert (host_vars is None) == bool(problems)
    assert all(r.message and r.fix for r in problems)
    if host_vars is None:
        return
    settings_ = host_vars.settings
    assert settings_.reserved_memory_mib is None or type(settings_.reserved_memory_mib) is int
    assert type(settings_.mixed_vgpu_types) is bool
    for i, entry in enumerate(host_vars.vm_list):
        spec, found = parse_vm(entry, i)
        assert found == [] and spec is not None
        assert_typed(spec)


@pytest.fixture(scope="module")
def mtty(host_root) -> Path:
    return host_root("mtty-mdev")


@given(doc=hostile_documents())
def test_plan_in_process_exits_0_2_or_3_and_reports_typed_values(doc, mtty, tmp_path_factory) -> None:
    path = tmp_path_factory.mktemp("doc") / "host.yml"
    path.write_text(yaml.safe_dump(doc))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["plan", str(path), "--root", str(mtty), "--json"])
    assert rc in (0, 2, 3), err.getvalue()
    if rc == 2:
        assert err.getvalue().startswith("gpuprov: error: ") and out.getvalue() == ""
        return
    report = json.loads(out.getvalue())
    for vm in report["vms"]:
        assert VM_NAME_RE.fullmatch(vm["name"]) and type(vm["memory_mib"]) is int and type(vm["vcpus"]) is int
        cpus = vm["placement"]["cpus"]
        assert cpus is None or all(type(c) is int for c in cpus)
    assert report["ok"] is (rc == 0)


@settings(max_examples=15)
@given(doc=hostile_documents())
def test_plan_as_a_subprocess_never_traces_back(doc, mtty, tmp_path_factory) -> None:
    path = tmp_path_factory.mktemp("doc") / "host.yml"
    path.write_text(yaml.safe_dump(doc))
    out = subprocess.run(
        [sys.executable, "-m", "gpuprov", "plan", str(path), "--root", str(mtty)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert out.returncode in (0, 2, 3) and "Traceback" not in out.stderr, out.stderr[-2000:]


@settings(max_examples=30)
@given(doc=hostile_documents())
def test_the_modules_never_trace_back_and_change_nothing(doc, mtty, tmp_path_factory) -> None:
    """gpu_vm (check mode) and gpu_vgpu (check mode) over a staged copy: a refusal, Ansible's own
    type error or a plan; never an exception, never a change."""
    tmp = tmp_path_factory.mktemp("module")
    root = tmp / "root"
    shutil.copytree(mtty, root, symlinks=True)
    before = tree_digest(tmp)
    vms = doc.get("gpu_vms_list")
    vm = vms[0] if isinstance(vms, list) and vms and isinstance(vms[0], dict) else {"name": "vm-a"}
    args = {"vm": vm, "root": str(root), "storage_dir": str(tmp / "vms"), "reserved_memory_mib": 0}
    if isinstance(doc.get("gpu_vms_defaults"), dict):
        args["defaults"] = doc["gpu_vms_defaults"]
    result = run_in_process("gpu_vm", args, check=True)
    assert not result["failed"] or result["msg"], result
    if result["failed"] and result["msg"].startswith("refused, nothing changed: "):
        assert result["refusals"]
    gpus = doc.get("gpuprov_gpus")
    result = run_in_process("gpu_vgpu", {"gpus": gpus if isinstance(gpus, dict) else {}, "root": str(root)}, check=True)
    assert not result["failed"] or result["msg"], result
    assert tree_digest(tmp) == before


@given(doc=hostile_documents())
def test_plan_and_the_modules_agree(doc) -> None:
    """The same VM entry and layout: the validator gives gpu_vm and gpu_vgpu plan's verdict."""
    vms = doc.get("gpu_vms_list")
    if not (isinstance(vms, list) and len(vms) == 1 and isinstance(vms[0], dict)):
        return
    settings_ = {k: doc.get(f"gpu_vms_{k}") for k in ("reserved_memory_mib", "reserved_cpus", "mixed_vgpu_types")}
    if not isinstance(settings_["mixed_vgpu_types"], bool) or not isinstance(doc.get("gpu_vms_defaults"), dict):
        return  # Ansible types these module options itself (test_inputs.test_ansible_types_top_level_options)
    plan_doc = {k: v for k, v in doc.items() if k != "gpuprov_gpus"}
    _hv, plan_found = validate_host_vars(plan_doc, cpu_limit=2)
    params = {"vm": vms[0], "defaults": doc["gpu_vms_defaults"], "state": "running", **settings_}
    params = {**params, "reserved_cpus": "" if settings_["reserved_cpus"] is None else settings_["reserved_cpus"]}
    _given, module_found = validate_gpu_vm_options(params, cpu_limit=2)
    rename = {"gpu_vms_list[0]": "vm", "gpu_vms_defaults": "defaults", "gpu_vms_": ""}
    renamed = set()
    for r in plan_found:
        if "is not a variable of role gpu_vms" in r.message:
            continue  # a host_vars file's own concern
        message = r.message
        for old, new in rename.items():
            message = message.replace(old, new)
        renamed.add(message)
    assert renamed == {r.message for r in module_found}
    if isinstance(doc.get("gpuprov_gpus"), dict):
        _hv, layout_found = validate_host_vars({"gpu_vms_list": [], "gpuprov_gpus": doc["gpuprov_gpus"]})
        assert [r.message for r in layout_found] == [
            r.message for r in validate_gpu_vgpu_options({"gpus": doc["gpuprov_gpus"]})
        ]


# ---------------------------------------------------------------- what plan accepts, gpu_vm builds


def either(valid: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Nine times in ten a value of the right form, else anything at all (control and XML characters too)."""
    anything = st.one_of(st.text(max_size=30), st.sampled_from(TRICKY))
    return st.integers(0, 9).flatmap(lambda n: anything if n == 9 else valid)


# Printable text with XML's special characters and any script: what a cmdline or a key comment may hold.
PRINTABLE = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Cf", "Co", "Cn", "Zl", "Zp")), max_size=80)
PCI = st.from_regex(re.compile(r"0000:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]"), fullmatch=True)
PATH = st.from_regex(re.compile(r"/[A-Za-z0-9._-]{1,12}(/[A-Za-z0-9._&<>'\"-]{1,12}){0,3}"), fullmatch=True)


@st.composite
def vm_entries(draw: st.DrawFn) -> dict[str, Any]:
    gpu = st.fixed_dictionaries(
        {"address": either(PCI)},
        optional={"rom": st.one_of(st.sampled_from(["on", "off", True]), either(PATH.map(lambda p: ROM_DIR + p)))},
    )
    entry: dict[str, Any] = {
        "name": draw(either(st.from_regex(VM_NAME_RE, fullmatch=True))),
        "machine": draw(either(st.from_regex(re.compile(r"(pc-)?q35[a-z0-9._-]{0,12}"), fullmatch=True))),
        "network": draw(st.one_of(st.none(), either(st.from_regex(NETWORK_RE, fullmatch=True)))),
        "mac": draw(either(st.from_regex(re.compile(r"[0-9a-f][02468ace](:[0-9a-f]{2}){5}"), fullmatch=True))),
        "vendor_id": draw(either(st.from_regex(VENDOR_ID_RE, fullmatch=True))),
        "gpus": draw(st.lists(gpu, max_size=2, unique_by=lambda g: str(g["address"]))),
        "mdevs": draw(
            st.lists(
                st.fixed_dictionaries({"parent": st.just("mtty"), "type": st.just("mtty-1"), "uuid": st.uuids()}),
                max_size=2,
            )
        ),
        "disk": {"base": draw(either(PATH)), "size_gib": draw(st.integers(1, 100))},
        "cloud_init": {
            "user": draw(either(st.from_regex(re.compile(r"[a-z_][a-z0-9_-]{0,31}"), fullmatch=True))),
            "ssh_authorized_keys": [ssh_public_key(draw(either(PRINTABLE)))],
            "packages": draw(
                st.lists(either(st.from_regex(re.compile(r"[a-z0-9][a-z0-9+.-]{1,20}"), fullmatch=True)), max_size=3)
            ),
        },
        "boot": {"kernel": draw(either(PATH)), "cmdline": draw(either(PRINTABLE))},
    }
    for m in entry["mdevs"]:
        m["uuid"] = str(m["uuid"])
    return entry


@settings(max_examples=40)
@given(entry=vm_entries())
def test_what_the_validator_accepts_the_domain_builder_builds(entry, tmp_path_factory) -> None:
    spec, problems = parse_vm(entry)
    if spec is None:
        assert problems
        return
    assert_typed(spec)
    placement = Placement(node=None, cpus=spec.cpuset, hugepage_kib=None, pci_slots=[[g.address] for g in spec.gpus])
    paths = vm_paths(spec, "/var/lib/libvirt/images/gpuprov")
    xml = to_xml(build_domain(domain_config(spec, placement, paths)))
    parsed = ET.fromstring(xml)
    assert parsed.findtext("name") == spec.name
    assert (parsed.findtext("os/cmdline") or "") == ((spec.boot.cmdline or "") if spec.boot else "")
    if VALIDATE:
        path = tmp_path_factory.mktemp("xml") / "domain.xml"
        path.write_text(xml)
        check = subprocess.run([VALIDATE, str(path), "domain"], capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stderr + xml
