"""The domain of a multi-GPU, large-BAR VM (docs/reference/vm-domain.md): four H100s with
128 GiB BARs on two host NUMA nodes, joined by NVLink. From host facts to XML: the BARs
read from sysfs size OVMF's 64-bit MMIO window, each GPU sits behind the pcie-expander-bus
of the guest NUMA cell matching its host node, vCPUs and memory split over the cells, and
QEMU's x-nv-gpudirect-clique groups the NVLink GPUs. libvirt's schema accepts it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import jsonschema
import pytest
import yaml

from gpuprov.cli.main import main
from gpuprov.core.vm_spec import HostSettings
from gpuprov.facts.pci import PciBar, parse_bars
from gpuprov.inputs.vm_list import parse_vm
from gpuprov.plan.vm.domain import QEMU_NS, DomainConfig, PciPassthrough, build_domain, domain_xml, mmio64_window_mib
from gpuprov.plan.vm.fit import plan_host
from gpuprov.plan.vm.plan import domain_config
from tests.cli.test_plan_schema import SCHEMA
from tests.plan.test_domain import validate
from tests.vmhosts import GIB_KIB, HGX_GPUS, h100_resource, hgx_two_node_host, two_node_host

GIB = 1 << 30
MMIO_ARG = "name=opt/ovmf/X-PciMmio64Mb,string="


def hgx_vm(**kw) -> dict:
    return {"name": "big", "vcpus": 8, "memory_mib": 65536, "gpus": list(HGX_GPUS), "nvlink_clique": True, **kw}


def planned(facts, vm: dict):
    plan = plan_host(facts, [vm], HostSettings())
    assert not plan.refusals, plan.refusals
    return plan, plan.placements[vm["name"]]


def qemu_args(root: ET.Element) -> list[str]:
    return [a.get("value", "") for a in root.findall(f"{{{QEMU_NS}}}commandline/{{{QEMU_NS}}}arg")]


def test_bars_read_from_the_resource_file() -> None:
    bars = parse_bars(h100_resource(0))
    assert bars is not None
    assert [(b.index, b.size, b.mem64_prefetchable) for b in bars] == [
        (0, 16 << 20, False),
        (1, 128 * GIB, True),
        (3, 32 << 20, True),
    ]


def with_line(index: int, line: str) -> str:
    lines = h100_resource(0).splitlines()
    lines[index] = line
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "0x0 0x0 0x0\n" * 5,  # short: a BAR may be missing
        with_line(1, "0xzz 0x1 0x14220c"),  # not hex
        with_line(3, "0x0000000000001000 0x0000000000001fff"),  # two fields
        with_line(1, "0x0000000000002000 0x0000000000001000 0x000000000014220c"),  # ends before it starts
    ],
)
def test_unreadable_bars_are_unknown_not_empty(text) -> None:
    assert parse_bars(text) is None


def test_lines_after_the_standard_bars_do_not_count() -> None:
    # The ROM and SR-IOV VF BAR lines may be anything: they are not this function's BARs.
    assert parse_bars(with_line(7, "garbage")) == parse_bars(h100_resource(0))


def test_the_window_rule() -> None:
    # Largest first, each aligned to its size, a quarter more, a power of two.
    assert mmio64_window_mib([128 * GIB, 32 << 20]) == 256 * 1024
    assert mmio64_window_mib([128 * GIB] * 4 + [32 << 20] * 4) == 1024 * 1024
    assert mmio64_window_mib([128 * GIB] * 8) == 2048 * 1024
    assert mmio64_window_mib([16 << 20, 256 << 20]) == 512  # 272 MiB * 1.25 = 340 MiB -> 512
    assert mmio64_window_mib([]) == 1


def test_four_gpus_on_two_nodes_with_128g_bars_and_nvlink(tmp_path) -> None:
    facts = hgx_two_node_host(tmp_path / "root", pages={GIB_KIB: 64})
    plan, placement = planned(facts, hgx_vm())
    assert [(c.node, c.vcpus, c.memory_mib) for c in placement.cells] == [(0, 4, 32768), (1, 4, 32768)]
    assert placement.cpus == [1, 2, 3, 4, 32, 33, 34, 35]  # CPU 0 kept for the host
    assert placement.hugepage_kib == GIB_KIB
    assert placement.gpu_cells == {HGX_GPUS[0]: 0, HGX_GPUS[1]: 0, HGX_GPUS[2]: 1, HGX_GPUS[3]: 1}
    assert placement.mmio64_mib == 1024 * 1024  # 4 x (128 GiB + 32 MiB) -> 1 TiB
    xml = domain_xml(domain_config(plan.vm("big"), placement, {}))
    validate(xml, tmp_path)
    root = ET.fromstring(xml)

    # The MMIO window, as OVMF's fw_cfg knob.
    assert qemu_args(root) == ["-fw_cfg", f"{MMIO_ARG}1048576"]

    # Guest NUMA cells match the host nodes; each cell's memory bound to its node.
    cells = root.findall("cpu/numa/cell")
    assert [(c.get("id"), c.get("cpus"), c.get("memory")) for c in cells] == [
        ("0", "0,1,2,3", str(32 * GIB_KIB)),
        ("1", "4,5,6,7", str(32 * GIB_KIB)),
    ]
    assert root.find("cpu/topology").get("sockets") == "2"
    memnodes = [(m.get("cellid"), m.get("nodeset")) for m in root.findall("numatune/memnode")]
    assert memnodes == [("0", "0"), ("1", "1")] and root.find("numatune/memory").get("nodeset") == "0,1"
    pins = [int(p.get("cpuset")) for p in root.findall("cputune/vcpupin")]
    assert pins[:4] == [1, 2, 3, 4] and pins[4:] == [32, 33, 34, 35]  # cell 0's vCPUs on node 0, cell 1's on node 1

    # An expander bus per cell, on its node; each GPU's root port on its node's bus.
    controllers = {c.get("index"): c for c in root.findall("devices/controller")}
    pxbs = [c for c in controllers.values() if c.get("model") == "pcie-expander-bus"]
    assert [(p.find("model").get("name"), p.find("target/node").text) for p in pxbs] == [
        ("pxb-pcie", "0"),
        ("pxb-pcie", "1"),
    ]
    pxb_of_cell = {p.find("target/node").text: int(p.get("index")) for p in pxbs}
    for hostdev in root.findall("devices/hostdev"):
        host = hostdev.find("source/address")
        address = f"0000:{int(host.get('bus'), 16):02x}:00.0"
        port = controllers[str(int(hostdev.find("address").get("bus"), 16))]
        assert port.get("model") == "pcie-root-port"
        cell = str(placement.gpu_cells[address])
        assert int(port.find("address").get("bus"), 16) == pxb_of_cell[cell], address

    # One NVLink clique: every GPU's vfio-pci device gets x-nv-gpudirect-clique=0 through its alias.
    aliases = [h.find("alias").get("name") for h in root.findall("devices/hostdev")]
    assert aliases == ["ua-gpu0", "ua-gpu1", "ua-gpu2", "ua-gpu3"]
    overrides = root.findall(f"{{{QEMU_NS}}}override/{{{QEMU_NS}}}device")
    props = {d.get("alias"): d.find(f"{{{QEMU_NS}}}frontend/{{{QEMU_NS}}}property").attrib for d in overrides}
    assert props == {a: {"name": "x-nv-gpudirect-clique", "type": "unsigned", "value": "0"} for a in aliases}


def test_nvlink_cliques_as_groups(tmp_path) -> None:
    facts = hgx_two_node_host(tmp_path / "root")
    # Short addresses name the same GPUs.
    vm = hgx_vm(nvlink_clique=[[HGX_GPUS[0], HGX_GPUS[1]], [HGX_GPUS[2], "ab:00.0"]])
    plan, placement = planned(facts, vm)
    root = build_domain(domain_config(plan.vm("big"), placement, {}))
    values = [
        d.find(f"{{{QEMU_NS}}}frontend/{{{QEMU_NS}}}property").get("value")
        for d in root.findall(f"{{{QEMU_NS}}}override/{{{QEMU_NS}}}device")
    ]
    assert values == ["0", "0", "1", "1"]
    validate(domain_xml(domain_config(plan.vm("big"), placement, {})), tmp_path)


def test_without_nvlink_there_is_no_override_and_no_alias(tmp_path) -> None:
    facts = hgx_two_node_host(tmp_path / "root")
    plan, placement = planned(facts, hgx_vm(nvlink_clique=False))
    root = build_domain(domain_config(plan.vm("big"), placement, {}))
    assert root.find(f"{{{QEMU_NS}}}override") is None and root.find("devices/hostdev/alias") is None


def test_one_node_per_vm_stays_as_before(tmp_path) -> None:
    facts = hgx_two_node_host(tmp_path / "root")
    plan, placement = planned(facts, hgx_vm(gpus=list(HGX_GPUS[2:]), vcpus=4, nvlink_clique=None))
    assert (placement.node, placement.cells, placement.gpu_cells) == (1, [], {})
    root = build_domain(domain_config(plan.vm("big"), placement, {}))
    assert root.find("cpu/numa") is None and root.find("numatune/memnode") is None
    assert not [c for c in root.findall("devices/controller") if c.get("model") == "pcie-expander-bus"]
    assert root.find("numatune/memory").get("nodeset") == "1"
    assert qemu_args(root) == ["-fw_cfg", f"{MMIO_ARG}{512 * 1024}"]  # 2 x (128 GiB + 32 MiB) -> 512 GiB
    # A node given keeps every GPU on it (and warns), as before; so do fewer vCPUs than nodes.
    plan, placement = planned(facts, hgx_vm(numa_node=0))
    assert placement.node == 0 and placement.cells == []
    plan, placement = planned(facts, hgx_vm(vcpus=1))
    assert placement.node == 0 and placement.cells == [] and placement.cpus == [1]


def test_no_mmio_knob_for_bios_or_small_bars(tmp_path) -> None:
    facts = hgx_two_node_host(tmp_path / "root")
    plan, placement = planned(facts, hgx_vm(firmware="bios"))
    assert qemu_args(build_domain(domain_config(plan.vm("big"), placement, {}))) == []
    small = hgx_two_node_host(tmp_path / "small", bar1_bytes=4 * GIB)  # 4 x 4 GiB -> 32 GiB: OVMF's default
    plan, placement = planned(small, hgx_vm())
    assert placement.mmio64_mib == 32 * 1024
    assert qemu_args(build_domain(domain_config(plan.vm("big"), placement, {}))) == []


def test_unknown_bars_are_named_in_a_warning(tmp_path) -> None:
    facts = two_node_host(tmp_path / "root")  # no resource files
    plan = plan_host(facts, [{"name": "a", "gpus": ["0000:41:00.0"]}], HostSettings())
    assert plan.placements["a"].mmio64_mib is None
    assert any("unknown: BAR sizes of 0000:41:00.0, 0000:41:00.1" in w for w in plan.warnings), plan.warnings


def test_split_cells_refuse_when_a_node_has_too_few_cpus(tmp_path) -> None:
    facts = hgx_two_node_host(tmp_path / "root")
    plan = plan_host(facts, [hgx_vm(vcpus=64)], HostSettings())
    assert any("NUMA node 0" in r.message and "GPUs span nodes [0, 1]" in r.message for r in plan.refusals)


def test_split_hugepages_yes_refuses_when_a_node_has_none(tmp_path) -> None:
    facts = hgx_two_node_host(tmp_path / "root")
    plan = plan_host(facts, [hgx_vm(hugepages="yes")], HostSettings())
    assert any("hugepages oversubscribed" in r.message for r in plan.refusals)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("yes", "nvlink_clique: must be true, false or a list of cliques"),
        ([["0000:41:00.0"]], "nvlink_clique[0][0]: 0000:41:00.0 is not one of the VM's gpus"),
        ([[HGX_GPUS[0]], [HGX_GPUS[0]]], "nvlink_clique[1][0]: 0000:18:00.0 is in two cliques"),
        ([["nope"]], "nvlink_clique[0][0]"),
        ([[HGX_GPUS[0]]] * 17, "more than 16"),
        ("", "must be true, false or a list"),
    ],
)
def test_nvlink_clique_input_rules(value, message) -> None:
    spec, problems = parse_vm(hgx_vm(nvlink_clique=value))
    assert spec is None and any(message in p.describe() for p in problems), [p.describe() for p in problems]


def test_one_gpu_is_no_clique() -> None:
    spec, problems = parse_vm(hgx_vm(gpus=[HGX_GPUS[0]]))
    assert spec is None and any("joins 1 GPU" in p.describe() for p in problems)


def test_builder_keeps_slots_on_pcie_root_without_cells(tmp_path) -> None:
    cfg = DomainConfig(name="vm", memory_kib=GIB_KIB, vcpus=2, pci=[PciPassthrough(["0000:41:00.0"], clique=3)])
    root = build_domain(cfg)
    (port,) = root.findall("devices/controller")
    assert port.get("model") == "pcie-root-port" and port.find("address") is None
    validate(domain_xml(cfg), tmp_path)


def test_bar_flags() -> None:
    assert PciBar(1, GIB, 0x0014220C).mem64_prefetchable
    assert not PciBar(1, GIB, 0x00042208 & ~0x200).mem64_prefetchable  # not memory
    assert not PciBar(0, GIB, 0x00100200).mem64_prefetchable  # 64-bit, not prefetchable


def test_plan_json_shows_cells_and_window_and_matches_its_schema(tmp_path, capsys) -> None:
    hgx_two_node_host(tmp_path / "root")
    path = tmp_path / "vms.yml"
    path.write_text(yaml.safe_dump([hgx_vm()]))
    assert main(["plan", str(path), "--root", str(tmp_path / "root"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    jsonschema.validate(report, SCHEMA)
    placement = report["vms"][0]["placement"]
    assert placement["numa_cells"] == [
        {"node": 0, "vcpus": 4, "memory_mib": 32768},
        {"node": 1, "vcpus": 4, "memory_mib": 32768},
    ]
    assert placement["gpu_cells"] == {HGX_GPUS[0]: 0, HGX_GPUS[1]: 0, HGX_GPUS[2]: 1, HGX_GPUS[3]: 1}
    assert placement["mmio64_mib"] == 1024 * 1024
