"""Placement over NUMA nodes (issue #29): a VM whose GPUs sit on two host nodes is split into
guest cells; the memory each VM binds (strict) to a node is checked against that node, not only
the host's total; hugepage shortfalls name their node; unknown node memory is never "fits".

The host: tests/vmhosts.py's two_node_host at 64 GiB, 32768 MiB per node; 4 GiB kept for the
host by default (10% of RAM, at most 4 GiB), 2048 MiB of it on each node (in proportion to the
nodes' memory), so 30720 MiB per node for VMs in normal pages."""

from __future__ import annotations

from gpuprov.core.vm_spec import HostPlan, HostSettings
from gpuprov.facts.host import gather
from gpuprov.facts.sysfs import Sysfs
from gpuprov.plan.vm.fit import plan_host
from tests.vmhosts import GIB_KIB, two_node_host

GPU0, GPU1 = "0000:41:00.0", "0000:c1:00.0"  # on node 0, on node 1
NODE_FIX = "fewer or smaller VMs on node 1, reserve fewer hugepages there, or place the VM on another node (numa_node)"


def plan(facts, vms: list[dict]) -> HostPlan:
    return plan_host(facts, vms, HostSettings())


def refusals(p: HostPlan) -> list[tuple[str, str | None]]:
    return [(r.message, r.fix) for r in p.refusals]


def node_use(p: HostPlan) -> dict[int, int]:
    return {n["node"]: n["vms_bound_mib"] for n in p.resources["memory"]["nodes"]}


def test_a_vm_over_both_nodes_gets_a_cell_on_each(tmp_path) -> None:
    facts = two_node_host(tmp_path / "root", memory_gib=64)
    p = plan(facts, [{"name": "both", "vcpus": 4, "memory_mib": 8192, "gpus": [GPU0, GPU1]}])
    assert refusals(p) == []
    placement = p.placements["both"]
    assert placement.node is None
    assert [(c.node, c.vcpus, c.memory_mib) for c in placement.cells] == [(0, 2, 4096), (1, 2, 4096)]
    assert placement.cpus == [1, 2, 16, 17]  # CPU 0 kept for the host; each cell's vCPUs on its node
    assert placement.gpu_cells == {GPU0: 0, GPU1: 1}
    assert p.resources["memory"]["nodes"] == [
        {
            "node": 0,
            "host_mib": 32768,
            "reserved_for_host_mib": 2048,
            "hugepages_reserved_mib": 0,
            "vms_bound_mib": 4096,
        },
        {
            "node": 1,
            "host_mib": 32768,
            "reserved_for_host_mib": 2048,
            "hugepages_reserved_mib": 0,
            "vms_bound_mib": 4096,
        },
    ]


def test_a_vm_too_big_for_node_1_is_refused_naming_node_1_and_nothing_else_changes(tmp_path) -> None:
    facts = two_node_host(tmp_path / "root", memory_gib=64)
    a = {"name": "a", "vcpus": 2, "memory_mib": 8192, "gpus": [GPU0]}
    fits = plan(facts, [a, {"name": "b", "vcpus": 2, "memory_mib": 30720, "gpus": [GPU1]}])  # all node 1 has
    assert refusals(fits) == [] and node_use(fits) == {0: 8192, 1: 30720}
    # One MiB more: the host's total has room (8 + 30 GiB + 4 kept of 64), node 1 has not.
    too_big = plan(facts, [a, {"name": "b", "vcpus": 2, "memory_mib": 30721, "gpus": [GPU1]}])
    assert refusals(too_big) == [
        (
            "VM b: memory oversubscribed on NUMA node 1: 30721 MiB bound there, the node has 30720 MiB left "
            "(32768 MiB, 2048 MiB of it kept for the host, 0 MiB reserved as hugepages, 0 MiB bound to earlier VMs)",
            NODE_FIX,
        )
    ]
    assert too_big.placements == fits.placements  # a's placement and b's node as before
    assert too_big.placements["b"].node == 1 and node_use(too_big) == {0: 8192, 1: 0}


def test_earlier_vms_on_the_node_count_and_a_refused_one_takes_nothing(tmp_path) -> None:
    facts = two_node_host(tmp_path / "root", memory_gib=64)
    vms = [
        {"name": "x", "memory_mib": 20480, "numa_node": 1, "pin": False},
        {"name": "y", "memory_mib": 16384, "numa_node": 1, "pin": False},  # 10240 MiB left
        {"name": "z", "memory_mib": 10240, "numa_node": 1, "pin": False},  # fits: y took nothing
    ]
    p = plan(facts, vms)
    assert refusals(p) == [
        (
            "VM y: memory oversubscribed on NUMA node 1: 16384 MiB bound there, the node has 10240 MiB left "
            "(32768 MiB, 2048 MiB of it kept for the host, 0 MiB reserved as hugepages, 20480 MiB bound to "
            "earlier VMs x)",
            NODE_FIX,
        )
    ]
    assert node_use(p) == {0: 0, 1: 30720}


def test_a_split_vm_whose_node_1_cell_does_not_fit_is_refused_naming_node_1_only(tmp_path) -> None:
    facts = two_node_host(tmp_path / "root", memory_gib=64)
    vms = [
        {"name": "x", "memory_mib": 20480, "numa_node": 1, "pin": False},
        {"name": "both", "vcpus": 2, "memory_mib": 24576, "gpus": [GPU0, GPU1]},  # 12288 MiB per cell
    ]
    p = plan(facts, vms)
    assert refusals(p) == [
        (
            "VM both: memory oversubscribed on NUMA node 1: 12288 MiB bound there (its guest cell on it; its GPUs "
            "span nodes [0, 1]), the node has 10240 MiB left (32768 MiB, 2048 MiB of it kept for the host, 0 MiB "
            "reserved as hugepages, 20480 MiB bound to earlier VMs x)",
            NODE_FIX,
        )
    ]
    assert [(c.node, c.memory_mib) for c in p.placements["both"].cells] == [(0, 12288), (1, 12288)]
    assert node_use(p) == {0: 0, 1: 20480}  # its node 0 cell is not counted either


def test_hugepages_reserved_on_a_node_leave_less_for_normal_pages_there(tmp_path) -> None:
    facts = two_node_host(tmp_path / "root", memory_gib=64, pages={GIB_KIB: 20})  # 20 GiB of node 1 in 1G pages
    p = plan(facts, [{"name": "n", "memory_mib": 12288, "numa_node": 1, "hugepages": "no", "pin": False}])
    assert refusals(p) == [
        (
            "VM n: memory oversubscribed on NUMA node 1: 12288 MiB bound there, the node has 10240 MiB left "
            "(32768 MiB, 2048 MiB of it kept for the host, 20480 MiB reserved as hugepages, 0 MiB bound to "
            "earlier VMs)",
            NODE_FIX,
        )
    ]
    # In those hugepages it fits: they are counted against the node's pages, not its normal memory.
    p = plan(facts, [{"name": "n", "memory_mib": 12288, "numa_node": 1, "pin": False}])
    assert refusals(p) == [] and p.placements["n"].hugepage_kib == GIB_KIB and node_use(p) == {0: 0, 1: 0}


def test_hugepages_short_on_one_node_name_that_node(tmp_path) -> None:
    facts = two_node_host(tmp_path / "root", memory_gib=64, pages0={GIB_KIB: 8}, pages={GIB_KIB: 2})
    both = {"name": "both", "vcpus": 2, "memory_mib": 8192, "gpus": [GPU0, GPU1]}  # 4096 MiB per cell
    p = plan(facts, [{**both, "hugepages": "yes"}])
    assert refusals(p) == [
        (
            "VM both: hugepages oversubscribed: 4096 MiB wanted in hugepages on NUMA node 1 (1048576 kB pages: "
            "2048 MiB left) (its GPUs span nodes [0, 1])",
            "reserve more hugepages on NUMA node 1 (nr_hugepages of /sys/devices/system/node/nodeN), "
            "or hugepages: auto",
        )
    ]
    # auto: normal pages on both nodes instead, still a cell on each.
    p = plan(facts, [both])
    assert refusals(p) == [] and p.placements["both"].hugepage_kib is None
    assert node_use(p) == {0: 4096, 1: 4096}
    # One node: the VM on its GPU's node 0.
    p = plan(facts, [{"name": "one", "memory_mib": 10240, "gpus": [GPU0], "hugepages": "yes"}])
    assert [m for m, _fix in refusals(p)] == [
        "VM one: hugepages oversubscribed: 10240 MiB wanted in hugepages on NUMA node 0 "
        "(1048576 kB pages: 8192 MiB left)"
    ]


def test_split_hugepages_in_no_one_page_size(tmp_path) -> None:
    # Each node has its cell's share, but node 0 in 2M pages and node 1 in 1G pages: a VM has one size.
    facts = two_node_host(tmp_path / "root", memory_gib=64, pages0={2048: 2048}, pages={GIB_KIB: 4})
    p = plan(facts, [{"name": "both", "vcpus": 2, "memory_mib": 4096, "gpus": [GPU0, GPU1], "hugepages": "yes"}])
    (message,) = [m for m, _fix in refusals(p)]
    assert message == (
        "VM both: hugepages oversubscribed: 2048 MiB wanted in hugepages on NUMA node 0 (1048576 kB pages: 0 MiB "
        "left, 2048 kB pages: 4096 MiB left); 2048 MiB wanted in hugepages on NUMA node 1 (1048576 kB pages: "
        "4096 MiB left, 2048 kB pages: 0 MiB left); no one page size holds every cell's share (its GPUs span "
        "nodes [0, 1])"
    )


def test_unknown_node_memory_is_refused_not_fitted(tmp_path) -> None:
    root = tmp_path / "root"
    two_node_host(root, memory_gib=64)
    (root / "sys/devices/system/node/node1/meminfo").unlink()
    facts = gather(Sysfs(str(root)))
    p = plan(facts, [{"name": "n", "memory_mib": 1024, "numa_node": 1, "pin": False}])
    found = [m for m, _fix in refusals(p)]
    assert len(found) == 1 and found[0].startswith("unknown: host memory could not be read"), found
    assert "node1/meminfo" in found[0]
    assert "nodes" not in p.resources["memory"]  # no per-node accounting from a guess
