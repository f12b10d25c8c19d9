"""The host model (gpuprov/model): one declaration, resolved against a host's facts, honoured by
`gpuprov plan` (and through plan_host by gpu_vm). docs/reference/host-model.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpuprov.cli.main import main
from gpuprov.facts.host import HostFacts, gather
from gpuprov.facts.sysfs import Sysfs
from gpuprov.inputs.declaration import SCHEMA, check
from gpuprov.model.resolve import resolve
from tests.conftest import tree_digest
from tests.fakehost import FakeHost
from tests.vmhosts import GIB_KIB, add_numa

H100 = ["0000:41:00.0", "0000:61:00.0", "0000:81:00.0", "0000:c1:00.0"]
CONSOLE = "0000:01:00.0"
VGPU = "0000:a1:00.0"
SRIOV = "0000:b1:00.0"


def build_host(root: Path) -> Path:
    """A host with a console GPU, four H100s (each behind its own root port and group), an mdev
    GPU offering nvidia-474/475 and an SR-IOV PF with two VFs offering types 557/558."""
    fake = FakeHost(root)
    fake.pci("0000:00:00.0", cls=0x060000, vendor=0x8086, device=0x1234, group=0, numa_node=0)
    fake.pci(CONSOLE, cls=0x030000, device=0x1EB1, group=1, numa_node=0, driver="nvidia", boot_vga=True)
    for i, address in enumerate(H100):
        port = f"0000:{int(address[5:7], 16) - 1:02x}:01.0"
        fake.pci(port, cls=0x060400, vendor=0x8086, device=0x2345, group=10 + 2 * i, numa_node=0, driver="pcieport")
        fake.pci(address, cls=0x030200, parent=port, group=11 + 2 * i, numa_node=0, driver="vfio-pci")
    fake.pci(VGPU, cls=0x030200, device=0x20B0, group=30, numa_node=0, driver="nvidia")
    fake.mdev_types(VGPU, {"nvidia-474": ("GRID A100-4C", 4), "nvidia-475": ("GRID A100-8C", 2)})
    fake.pci(SRIOV, cls=0x030200, device=0x20B5, group=31, numa_node=0, driver="nvidia", sriov_totalvfs=16)
    for i, fn in enumerate((4, 5)):
        vf = f"0000:b1:00.{fn}"
        fake.pci(vf, cls=0x030200, device=0x20B5, group=32 + i, numa_node=0, physfn=SRIOV, driver="nvidia")
        fake.vgpu_vf(vf, {557: "NVIDIA A100-4C", 558: "NVIDIA A100-8C"}, 0)
    add_numa(fake, [("0-31", 256 * GIB_KIB, {})])
    return fake.finish()


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_host(tmp_path_factory.mktemp("model-host"))


@pytest.fixture(scope="module")
def facts(host: Path) -> HostFacts:
    return gather(Sysfs(str(host)))


def declaration(gpus: list[dict[str, Any]], vms: list[dict[str, Any]] | None = None, **host: Any) -> dict[str, Any]:
    return {"gpuprov_host": {"version": 1, "gpus": gpus, "vms": vms or [], "reserved_cpus": "", **host}}


WHOLE = [
    {"name": "console", "address": CONSOLE, "use": "host"},
    {"name": "train", "select": "10de:2330", "use": "passthrough"},
]


def vm(name: str, *gpus: Any) -> dict[str, Any]:
    return {"name": name, "memory_mib": 1024, "vcpus": 1, "gpus": list(gpus)}


def plan(tmp_path: Path, host: Path, doc: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    """`gpuprov plan --json` on the declaration; the host tree is unchanged."""
    path = tmp_path / "host.yml"
    path.write_text(yaml.safe_dump(doc))
    before = tree_digest(host)
    rc = main(["plan", str(path), "--root", str(host), "--json"])
    out = capsys.readouterr()
    assert tree_digest(host) == before
    return rc, (json.loads(out.out) if rc != 2 else {"stderr": out.err})


# ---------------------------------------------------------------- what a VM may be given


@pytest.mark.parametrize("use", ["host", "mig", "mdev"])
def test_a_vm_given_a_gpu_not_for_passthrough_is_refused_naming_the_entry(tmp_path, host, capsys, use) -> None:
    gpus = [{"name": "shared", "address": H100[0], "use": use}]
    rc, report = plan(tmp_path, host, declaration(gpus, [vm("a", "shared")]), capsys)
    assert rc == 3
    messages = [r["message"] for r in report["refusals"]]
    assert any("gpuprov_host.gpus[0] 'shared'" in m and f"use: {use}" in m for m in messages), messages


def test_the_same_file_with_passthrough_is_accepted(tmp_path, host, capsys) -> None:
    gpus = [{"name": "shared", "address": H100[0], "use": "passthrough"}]
    rc, report = plan(tmp_path, host, declaration(gpus, [vm("a", "shared")]), capsys)
    assert (rc, report["refusals"]) == (0, [])
    assert report["vms"][0]["placement"]["pci_slots"] == [[H100[0]]]


def test_the_old_variables_get_the_same_verdict_with_a_deprecation_warning(tmp_path, host, capsys) -> None:
    doc = {
        "gpuprov_gpus": {CONSOLE: {"use": "host"}, H100[0]: {"use": "passthrough"}},
        "gpu_vms_list": [vm("a", CONSOLE)],
        "gpu_vms_reserved_cpus": "",
    }
    rc, report = plan(tmp_path, host, doc, capsys)
    assert rc == 3
    assert any(f"gpuprov_gpus['{CONSOLE}'], declared use: host" in r["message"] for r in report["refusals"])
    assert any("deprecated" in w for w in report["warnings"])
    doc["gpu_vms_list"] = [vm("a", H100[0])]
    rc, report = plan(tmp_path, host, doc, capsys)
    assert (rc, report["refusals"]) == (0, [])


def test_an_undeclared_name_is_refused(tmp_path, host, capsys) -> None:
    rc, report = plan(tmp_path, host, declaration(WHOLE, [vm("a", "trian")]), capsys)
    assert rc == 3
    assert "'trian' names no GPU or instance declared" in report["refusals"][0]["message"]
    assert "train" in report["refusals"][0]["fix"]


# ---------------------------------------------------------------- selectors and the id guard


def test_a_selector_resolves_every_gpu_it_matches(facts) -> None:
    model = resolve(declaration(WHOLE, [vm("big", "train")]), facts)
    assert (model.problems, model.refusals) == ([], [])
    assert [g.addresses for g in model.gpus] == [[CONSOLE], H100]
    assert model.vfio_devices == H100
    assert model.vm_list[0]["gpus"] == H100


@pytest.mark.parametrize(
    ("select", "expected"),
    [
        ("all", sorted([*H100, VGPU, SRIOV])),  # the console is the address entry's
        ({"index": 2}, [H100[1]]),  # nvidia-smi's order: by address, console first
        ({"model": "nothing like this"}, []),
        ("10de:20b0", [VGPU]),
    ],
)
def test_selectors(facts, select, expected) -> None:
    gpus = [WHOLE[0], {"name": "pick", "select": select, "use": "passthrough"}]
    model = resolve(declaration(gpus), facts)
    assert model.gpus[1].addresses == expected
    if not expected:
        assert "matches no GPU on this host" in model.refusals[0].message


def test_vm_takes_one_gpu_of_a_selector_by_index(facts) -> None:
    model = resolve(declaration(WHOLE, [vm("a", "train[3]"), vm("b", "train[4]")]), facts)
    assert model.vm_list[0]["gpus"] == [H100[3]]
    assert "selects 4 GPU(s)" in model.refusals[0].message


@pytest.mark.parametrize("expect", ["10de:2330", "10de:2330:10de:0000"])
def test_a_matching_id_guard_passes(facts, expect) -> None:
    model = resolve(declaration([{**WHOLE[1], "expect": expect}]), facts)
    assert model.refusals == []


@pytest.mark.parametrize("expect", ["10de:2335", "10de:2330:10de:16c1"])
def test_an_id_guard_that_does_not_match_is_refused(tmp_path, host, capsys, expect) -> None:
    gpus = [{"name": "train", "address": H100[2], "use": "passthrough", "expect": expect}]
    rc, report = plan(tmp_path, host, declaration(gpus, [vm("a", "train")]), capsys)
    assert rc == 3
    message = report["refusals"][0]["message"]
    assert f"gpuprov_host.gpus[0] 'train': {H100[2]} is 10de:2330" in message and f"expect says {expect}" in message


def test_an_address_the_host_lacks_is_refused(facts) -> None:
    model = resolve(declaration([{"name": "gone", "address": "0000:e1:00.0", "use": "passthrough"}]), facts)
    assert "no device 0000:e1:00.0 on this host" in model.refusals[0].message


def test_one_gpu_in_two_entries_is_refused(facts) -> None:
    gpus = [
        {"name": "a", "address": H100[0], "use": "passthrough"},
        {"name": "b", "select": {"index": 1}, "use": "host"},
    ]
    model = resolve(declaration(gpus), facts)
    assert f"{H100[0]} is already gpuprov_host.gpus[0] 'a''s" in model.refusals[0].message


# ---------------------------------------------------------------- instances: declared once, one UUID scheme


def test_mdev_instances_are_declared_once_and_vms_name_them(tmp_path, host, facts, capsys) -> None:
    gpus = [{"name": "a100", "address": VGPU, "use": "mdev", "instances": {"A100-4C": 2}}]
    doc = declaration(gpus, [vm("a", "a100.0"), vm("b", "a100.1")])
    model = resolve(doc, facts)
    assert model.refusals == []
    layout = model.layout[VGPU]["mdevs"]
    assert [vm_["mdevs"][0]["uuid"] for vm_ in model.vm_list] == [m["uuid"] for m in layout]
    assert {vm_["mdevs"][0]["type"] for vm_ in model.vm_list} == {"nvidia-474"}
    rc, report = plan(tmp_path, host, doc, capsys)
    assert (rc, report["refusals"], report["warnings"]) == (0, [], [])


def test_a_type_the_host_does_not_offer_is_refused_naming_the_entry(facts) -> None:
    gpus = [{"name": "a100", "address": VGPU, "use": "mdev", "instances": [{"type": "A100-40C", "name": "big"}]}]
    model = resolve(declaration(gpus, [vm("a", "big")]), facts)
    assert any(
        r.message.startswith("gpuprov_host.gpus[0] 'a100':") and "'A100-40C' is not offered" in r.message
        for r in model.refusals
    ), model.refusals
    assert "mdevs" not in model.vm_list[0]


def test_sriov_instances_land_on_the_pfs_vfs(facts) -> None:
    gpus = [{"name": "a100s", "address": SRIOV, "use": "sriov_vgpu", "instances": {"A100-8C": 2}}]
    model = resolve(declaration(gpus, [vm("a", "a100s.1")]), facts)
    assert model.refusals == []
    assert model.vm_list[0]["vfs"] == [{"address": "0000:b1:00.5", "vgpu_type": 558}]
    assert model.layout[SRIOV]["vgpus"] == [
        {"type": "A100-8C", "vf": "0000:b1:00.4"},
        {"type": "A100-8C", "vf": "0000:b1:00.5"},
    ]


def test_old_vm_mdevs_without_uuid_take_the_layouts(facts) -> None:
    doc = {
        "gpuprov_gpus": {VGPU: {"use": "mdev", "mdevs": [{"type": "nvidia-474"}]}},
        "gpu_vms_list": [{"name": "a", "mdevs": [{"parent": VGPU, "type": "nvidia-474"}]}],
    }
    model = resolve(doc, facts)
    from gpuprov.plan.vgpu import declared_mdevs

    declared, _ = declared_mdevs(facts, model.layout)
    assert list(declared) == [model.vm_list[0]["mdevs"][0]["uuid"]]


# ---------------------------------------------------------------- layouts by name, other formats


def test_a_host_picks_a_named_layout_and_overrides_an_entry(facts) -> None:
    doc = {
        "gpuprov_layouts": {"fleet": {"gpus": [{"name": "console", "select": {"index": 0}, "use": "host"}, WHOLE[1]]}},
        "gpuprov_host": {"layout": "fleet", "gpus": [{"name": "train", "address": H100[0], "use": "passthrough"}]},
    }
    model = resolve(doc, facts)
    assert (model.problems, model.refusals) == ([], [])
    assert {g.name: g.addresses for g in model.gpus} == {"console": [CONSOLE], "train": [H100[0]]}


def test_mig_parted_configs_are_layouts(facts) -> None:
    doc = {
        "gpuprov_layouts": {
            "version": "v1",
            "mig-configs": {"all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]},
        },
        "gpuprov_host": {"layout": "all-1g.10gb"},
    }
    model = resolve(doc, facts)
    assert model.problems == []
    assert model.layout[H100[0]] == {"use": "mig", "mig": {"1g.10gb": 7}}
    assert len([e for e in model.layout.values() if e["use"] == "mig"]) == 7  # every NVIDIA GPU


# ---------------------------------------------------------------- one schema


HOSTILE = [
    ({"gpuprov_host": {"gpus": [{"name": "x", "address": CONSOLE, "use": "hots"}]}}, "gpuprov_host.gpus[0].use"),
    ({"gpuprov_host": {"gpus": [{"name": "X!", "address": CONSOLE, "use": "host"}]}}, "gpuprov_host.gpus[0].name"),
    ({"gpuprov_host": {"gpus": [{"name": "x", "use": "host", "color": 1}]}}, "gpuprov_host.gpus[0].color"),
    ({"gpuprov_host": {"gpus": [{"name": "x", "select": "every", "use": "host"}]}}, "gpuprov_host.gpus[0].select"),
    ({"gpuprov_host": {"gpus": [{"name": "x", "select": {"index": True}, "use": "host"}]}}, "select.index"),
    ({"gpuprov_host": {"gpus": [{"name": "x", "select": "all", "use": "mig", "mig": {"1g.10gb": 8}}]}}, "1g.10gb"),
    ({"gpuprov_host": {"gpus": [{"name": "x", "select": "all", "use": "mdev", "instances": {"T": -1}}]}}, "T"),
    ({"gpuprov_host": {"gpus": [{"name": "x", "use": "host"}] * 1025}}, "more than 1024"),
    ({"gpuprov_host": {"vms": [{"name": "a", "mdevs": []}]}}, "gpuprov_host.vms[0]: key 'mdevs'"),
    ({"gpuprov_host": {"vms": [{"name": "a", "gpus": ["{{ x }}"]}]}}, "gpuprov_host.vms[0].gpus[0]"),
    ({"gpuprov_host": {"vms": [{"name": "a", "memory_mib": "lots"}]}}, "gpuprov_host.vms[0].memory_mib"),
    ({"gpuprov_host": {"gpus": [{"name": "x", "address": CONSOLE, "select": "all", "use": "host"}]}}, "exactly one"),
    ({"gpuprov_host": {"layout": "nope"}}, "no layout 'nope'"),
    ({"gpuprov_host": [], "gpuprov_layouts": {"a": {}}}, "gpuprov_host"),
]


@pytest.mark.parametrize(("doc", "named"), HOSTILE)
def test_a_file_breaking_the_schema_is_exit_2_naming_the_field(tmp_path, host, capsys, doc, named) -> None:
    rc, out = plan(tmp_path, host, doc, capsys)
    assert rc == 2, out
    assert named in out["stderr"] and "Traceback" not in out["stderr"]


VALID = [
    declaration(WHOLE, [vm("a", "train", {"name": "train[1]", "rom": "off"})], vm_defaults={"vcpus": 2}),
    {"gpuprov_layouts": {"l.1": {"gpus": []}}, "gpuprov_host": {"layout": "l.1"}},
    declaration([{"name": "v", "select": {"model": "A100"}, "use": "sriov_vgpu", "instances": [{"type": 557}]}]),
]


@pytest.mark.parametrize("doc", VALID + [d for d, _ in HOSTILE if "exactly one" not in _ and "no layout" not in _])
def test_the_validator_and_a_json_schema_validator_agree(doc) -> None:
    ours = not check(doc, "(the file)")
    theirs = jsonschema.Draft202012Validator(SCHEMA).is_valid(doc)
    assert ours == theirs


def test_the_published_schema_is_the_one_in_the_package() -> None:
    published = Path(__file__).parents[2] / "docs/reference/gpuprov-host.schema.json"
    assert json.loads(published.read_text()) == json.loads(json.dumps(SCHEMA))
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


# ---------------------------------------------------------------- the shipped inventories


# ---------------------------------------------------------------- the module, gpu_vm, inspect, init, convert


def test_gpu_host_model_returns_what_the_roles_take(host) -> None:
    from tests.modrun import run_in_process

    gpus = [*WHOLE, {"name": "a100", "address": VGPU, "use": "mdev", "instances": {"A100-4C": 1}}]
    result = run_in_process(
        "gpu_host_model", {"root": str(host), "host": declaration(gpus, [vm("a", "a100.0")])["gpuprov_host"]}
    )
    assert not result["failed"], result
    model = result["ansible_facts"]["gpuprov_model"]
    assert model["vfio_devices"] == H100
    assert model["gpus"][VGPU]["mdevs"][0]["uuid"] == model["vms"][0]["mdevs"][0]["uuid"]
    assert model["declared"][CONSOLE] == {"use": "host", "entry": "gpuprov_host.gpus[0] 'console'"}
    refused = run_in_process(
        "gpu_host_model", {"root": str(host), "host": declaration(WHOLE, [vm("a", "console")])["gpuprov_host"]}
    )
    assert refused["failed"] and "'console' is gpuprov_host.gpus[0] 'console', declared use: host" in refused["msg"]


def test_gpu_vm_refuses_a_gpu_declared_for_the_host(host, tmp_path) -> None:
    from tests.modrun import run_in_process

    declared = {CONSOLE: {"use": "host", "entry": "gpuprov_host.gpus[0] 'console'"}}
    args = {"vm": vm("a", CONSOLE), "root": str(host), "uri": "test:///default", "reserved_cpus": ""}
    before = tree_digest(host)
    result = run_in_process("gpu_vm", {**args, "declared": declared}, check=True)
    assert result["failed"]
    assert any("gpuprov_host.gpus[0] 'console', declared use: host" in r["message"] for r in result["refusals"])
    assert tree_digest(host) == before
    hostile = run_in_process("gpu_vm", {**args, "declared": {CONSOLE: {"use": "sideways"}}}, check=True)
    assert hostile["failed"] and "declared['0000:01:00.0'].use" in hostile["msg"]


def test_inspect_judges_each_gpu_for_its_declared_use(tmp_path, host, capsys) -> None:
    from tests.vgpuhosts import running_domain

    gpus = [*WHOLE, {"name": "a100", "address": VGPU, "use": "mdev"}, {"name": "s", "address": SRIOV, "use": "host"}]
    path = tmp_path / "decl.yml"
    path.write_text(yaml.safe_dump(declaration(gpus)))
    held = build_host(tmp_path / "held")
    fake = FakeHost.__new__(FakeHost)
    fake.root = held
    running_domain(fake, "vm-a", pci=(H100[0],))
    assert main(["inspect", "--root", str(held), "--declaration", str(path), "--json"]) == 0
    report = {g["address"]: g for g in json.loads(capsys.readouterr().out)["gpus"]}
    console = report[CONSOLE]
    assert (console["intended_use"], console["ready"]) == ("host", True)
    assert not any("vfio-pci" in (f["fix"] or "") for f in console["findings"])  # never advice that breaks the host
    assert (report[VGPU]["intended_use"], report[VGPU]["ready"]) == ("mdev", True)
    assert "vGPU-ready" in report[VGPU]["findings"][-1]["message"]
    assert report[H100[0]]["state"] == "in use by VM vm-a" and report[H100[0]]["ready"]
    assert (report[H100[1]]["intended_use"], report[H100[1]]["ready"]) == ("passthrough", True)


def test_inspect_require_ready_prints_the_reasons(tmp_path, host, capsys) -> None:
    path = tmp_path / "decl.yml"
    path.write_text(yaml.safe_dump(declaration([{"name": "a", "address": CONSOLE, "use": "mdev"}])))
    assert main(["inspect", "--root", str(host), "--declaration", str(path), "--require-ready", "all"]) == 3
    err = capsys.readouterr().err
    assert f"{CONSOLE} (use: mdev): offers no mdev types" in err and "fix: load the NVIDIA vGPU host driver" in err
    guard = declaration([{"name": "a", "address": H100[0], "use": "passthrough", "expect": "10de:2335"}])
    path.write_text(yaml.safe_dump(guard))
    assert main(["inspect", "--root", str(host), "--declaration", str(path), "--require-ready", "all"]) == 3
    assert "expect says 10de:2335" in capsys.readouterr().err


def test_init_writes_a_declaration_that_resolves_on_its_host(host, facts, capsys) -> None:
    assert main(["init", "--root", str(host)]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert not check(doc, "init")
    model = resolve(doc, facts)
    assert (model.problems, model.refusals) == ([], [])
    uses = {g.addresses[0]: g.use for g in model.gpus}
    assert uses[CONSOLE] == "host" and uses[H100[0]] == "passthrough" and uses[VGPU] == "mdev"


def test_convert_gives_the_same_host_in_the_new_form(tmp_path, facts, capsys) -> None:
    old = {
        "gpuprov_gpus": {CONSOLE: {"use": "host"}, VGPU: {"use": "mdev", "mdevs": [{"type": "nvidia-474"}]}},
        "vfio_host_devices": [H100[0], H100[1]],
        "gpu_vms_defaults": {"memory_mib": 2048},
        "gpu_vms_list": [
            {"name": "a", "gpus": [H100[0]], "mdevs": [{"parent": VGPU, "type": "nvidia-474"}]},
            {"name": "b", "gpus": [{"address": H100[1], "rom": "off"}]},
        ],
        "gpu_vms_reserved_cpus": "",
        "gpu_vms_install": False,
    }
    path = tmp_path / "old.yml"
    path.write_text(yaml.safe_dump(old))
    assert main(["convert", str(path), "--root", str(Path(facts.root))]) == 0
    new = yaml.safe_load(capsys.readouterr().out)
    assert "gpuprov_gpus" not in new and new["gpu_vms_install"] is False
    was, now = resolve(old, facts), resolve(new, facts)
    assert (now.problems, now.refusals) == ([], [])
    assert (now.vm_list, now.vfio_devices) == (was.vm_list, was.vfio_devices)
    from gpuprov.plan.vgpu import declared_mdevs

    assert declared_mdevs(facts, now.layout) == declared_mdevs(facts, was.layout)
    uses = {a: e["use"] for a, e in now.declared.items()}
    assert uses == {CONSOLE: "host", VGPU: "mdev", H100[0]: "passthrough", H100[1]: "passthrough"}
    assert main(["schema"]) == 0 and json.loads(capsys.readouterr().out) == json.loads(json.dumps(SCHEMA))


def test_a_gpu_its_running_vm_holds_is_in_use_by_that_vm_not_blocked(tmp_path, capsys) -> None:
    from tests.vgpuhosts import running_domain

    root = build_host(tmp_path / "h")
    fake = FakeHost.__new__(FakeHost)
    fake.root = root
    fake.open_file(4242, "qemu-system-x86", "/dev/vfio/11")  # H100[0]'s group
    fake.open_file(4343, "some-tool", "/dev/vfio/13")  # H100[1]'s, no VM behind it
    running_domain(fake, "vm-a", pci=(H100[0],))
    assert main(["inspect", "--root", str(root), "--json"]) == 0
    gpus = {g["address"]: g for g in json.loads(capsys.readouterr().out)["gpus"]}
    assert (gpus[H100[0]]["state"], gpus[H100[0]]["ready"]) == ("in use by VM vm-a", True)
    assert [f["code"] for f in gpus[H100[1]]["findings"] if f["severity"] == "blocker"] == ["in-use"]


# ---------------------------------------------------------------- a real multi-GPU guest (2x H200)

H200X2 = Path(__file__).parents[1] / "fixtures/hosts/h200x2-live.tar.gz"


# No pci.ids name for 2335 on that guest: its name is the vendor's alone.
@pytest.mark.parametrize("select", ["all", "10de:2335", {"model": "nvidia"}])
def test_a_selector_over_a_multi_gpu_guest_resolves_every_gpu(tmp_path, capsys, select) -> None:
    gpus = [{"name": "all-of-them", "select": select, "use": "passthrough", "expect": "10de:2335:10de:18bf"}]
    rc, report = plan(tmp_path, H200X2, declaration(gpus, [vm("big", "all-of-them")]), capsys)
    assert [r["message"] for r in report["refusals"]] and rc == 3  # no IOMMU inside the guest: refused...
    assert report["vms"][0]["gpus"] == ["0000:00:06.0", "0000:00:07.0"]  # ...but both GPUs


def test_inspect_on_the_multi_gpu_guest_follows_the_declared_use(tmp_path, capsys) -> None:
    path = tmp_path / "decl.yml"
    path.write_text(yaml.safe_dump(declaration([{"name": "h200", "select": "all", "use": "passthrough"}])))
    assert main(["inspect", "--root", str(H200X2), "--declaration", str(path), "--require-ready", "all"]) == 3
    err = capsys.readouterr().err
    assert "0000:00:06.0 (use: passthrough): the IOMMU is off" in err and "0000:00:07.0 (use: passthrough)" in err
    path.write_text((Path(__file__).parents[1] / "fixtures/outputs/h200x2/init.yml").read_text())
    assert main(["inspect", "--root", str(H200X2), "--declaration", str(path), "--require-ready", "all"]) == 0
    assert "bind it to vfio-pci" not in capsys.readouterr().out  # kept by the guest: no advice to take it
