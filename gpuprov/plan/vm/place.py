"""Where each VM runs, and whether the host has room for them all.

:func:`place`: each VM's NUMA node (the node of its first GPU, VF or mdev parent,
unless given), one host CPU per vCPU on that node (first free, in list order, after
the CPUs kept for the host), and hugepages when enough are reserved there.
:func:`check_totals`: host memory, CPUs and hugepages oversubscribed, or not
readable (fail closed: docs/concepts/safety-rules.md); then :func:`check_nodes`:
the memory bound (strict) to each NUMA node against what that node has.

Pure: no I/O. Standard library only.
"""

from __future__ import annotations

from ...core.plan import Refusal
from ...core.vm_spec import GuestCell, HostPlan, HostSettings, Placement, VmSpec
from ...facts.evidence import RESOURCES, how_to_read
from ...facts.host import HostFacts
from ...facts.numa import parse_cpulist
from ...rules.assess import unknown_finding
from .domain import MAX_CELLS, mmio64_window_mib


def _gib(kib: float) -> str:
    gib = kib / 1048576
    return f"{gib:.0f} GiB" if gib == int(gib) or gib >= 10 else f"{gib:.1f} GiB"


def _mib(kib: float) -> str:
    return f"{kib / 1024:.0f} MiB"


def _device_node(facts: HostFacts, addresses: list[str]) -> int | None:
    for addr in addresses:
        dev = facts.pci.get(addr)
        if dev is not None and dev.numa_node is not None and dev.numa_node >= 0:
            return dev.numa_node
    return None


def _node_hugepages(facts: HostFacts) -> dict[int, dict[int, int]]:
    """node -> page size KiB -> KiB reserved (total pages x size)."""
    out: dict[int, dict[int, int]] = {}
    for node in facts.numa:
        for size, counts in node.hugepages.items():
            try:
                size_kib = int(size.rstrip("kB"))
            except ValueError:
                continue
            total = counts.get("total") or 0
            if total:
                out.setdefault(node.node, {})[size_kib] = total * size_kib
    return out


def _pages_left(hugepages_left: dict[int, dict[int, int]], nodes: list[int], sizes: list[int]) -> str:
    """What is left of each page size on these nodes, for a hugepage refusal."""
    return (
        ", ".join(f"{s} kB pages: {_mib(sum(hugepages_left.get(n, {}).get(s, 0) for n in nodes))} left" for s in sizes)
        or "none reserved"
    )


def _spread_nodes(facts: HostFacts, vm: VmSpec, node_cpus: dict[int, list[int]]) -> list[int]:
    """The host nodes of the VM's GPUs when it is to be split over them (guest NUMA cells):
    its GPUs on more than one node (at most MAX_CELLS: the expander buses' bus numbers), every
    GPU's node known, no node or cpuset given, a vCPU for each node. Otherwise []: one node per
    VM, as before."""
    if vm.numa_node is not None or vm.cpuset is not None or vm.vfs or vm.mdevs:
        return []
    nodes = [facts.pci[g.address].numa_node if g.address in facts.pci else None for g in vm.gpus]
    spread = sorted({n for n in nodes if n is not None})
    if None in nodes or not 2 <= len(spread) <= min(MAX_CELLS, vm.vcpus) or any(n not in node_cpus for n in spread):
        return []
    return spread


def _place_cells(
    facts: HostFacts,
    vm: VmSpec,
    nodes: list[int],
    plan: HostPlan,
    pools: tuple[dict[int, list[int]], set[int], dict[int, str]],
    hugepages_left: dict[int, dict[int, int]],
) -> Placement:
    """vCPUs and memory split evenly over the GPUs' nodes (the first cells take what is left
    over), each cell pinned and backed on its own node."""
    node_cpus, reserved, used = pools
    n = len(nodes)
    cells = [
        GuestCell(
            node=node,
            vcpus=vm.vcpus // n + (1 if i < vm.vcpus % n else 0),
            memory_mib=vm.memory_mib // n + (1 if i < vm.memory_mib % n else 0),
        )
        for i, node in enumerate(nodes)
    ]
    cpus: list[int] | None = None
    if vm.pin:
        cpus = []
        for cell in cells:
            pool = [c for c in node_cpus[cell.node] if c not in reserved and c not in used]
            if len(pool) < cell.vcpus:
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: CPUs oversubscribed: {cell.vcpus} vCPUs to pin on NUMA node {cell.node} "
                        f"(its GPUs span nodes {nodes}), {len(pool)} CPUs of it left",
                        "use fewer vCPUs, fewer GPUs per node, or pin: false",
                    )
                )
                cpus = None
                break
            cpus.extend(pool[: cell.vcpus])
        for c in cpus or []:
            used.setdefault(c, vm.name)
    hugepage_kib = None
    if vm.hugepages != "no":
        sizes = sorted({s for node in nodes for s in hugepages_left.get(node, {})}, reverse=True)
        for size in sizes:
            fits = all(
                (c.memory_mib * 1024) % size == 0 and hugepages_left.get(c.node, {}).get(size, 0) >= c.memory_mib * 1024
                for c in cells
            )
            if fits:
                hugepage_kib = size
                for c in cells:
                    hugepages_left[c.node][size] -= c.memory_mib * 1024
                break
        if hugepage_kib is None and vm.hugepages == "yes":
            short = [
                c
                for c in cells
                if not any(
                    (c.memory_mib * 1024) % s == 0 and hugepages_left.get(c.node, {}).get(s, 0) >= c.memory_mib * 1024
                    for s in sizes
                )
            ]
            # Every node may hold its share, but in different page sizes: a VM has one.
            wanted = short or cells
            plan.refusals.append(
                Refusal(
                    f"VM {vm.name}: hugepages oversubscribed: "
                    + "; ".join(
                        f"{c.memory_mib} MiB wanted in hugepages on NUMA node {c.node} "
                        f"({_pages_left(hugepages_left, [c.node], sizes)})"
                        for c in wanted
                    )
                    + ("" if short else "; no one page size holds every cell's share")
                    + f" (its GPUs span nodes {nodes})",
                    f"reserve more hugepages on NUMA node {', '.join(str(c.node) for c in wanted)} "
                    "(nr_hugepages of /sys/devices/system/node/nodeN), or hugepages: auto",
                )
            )
    gpu_cells = {
        g.address: nodes.index(facts.pci[g.address].numa_node)  # type: ignore[arg-type]
        for g in vm.gpus
    }
    return Placement(node=None, cpus=cpus, hugepage_kib=hugepage_kib, cells=cells, gpu_cells=gpu_cells)


def size_mmio64(facts: HostFacts, vm: VmSpec, plan: HostPlan) -> None:
    """The VM's 64-bit MMIO window from the 64-bit prefetchable BARs of its passed-through
    functions (:func:`gpuprov.plan.vm.domain.mmio64_window_mib`). BARs that do not read are
    named in a warning: the window then covers only those that do."""
    placement = plan.placements[vm.name]
    sizes: list[int] = []
    unknown: list[str] = []
    for slot in placement.pci_slots:
        for address in slot:
            dev = facts.pci.get(address)
            if dev is None:
                continue  # refused by check_pci
            if dev.bars is None:
                unknown.append(address)
            else:
                sizes.extend(b.size for b in dev.bars if b.mem64_prefetchable)
    if unknown and vm.firmware == "efi":
        plan.warnings.append(
            f"VM {vm.name}: unknown: BAR sizes of {', '.join(unknown)} (no readable resource file); the guest's "
            "64-bit MMIO window counts only the BARs that read (OVMF's default: 32 GiB)"
        )
    placement.mmio64_mib = mmio64_window_mib(sizes) if sizes else None


def place(facts: HostFacts, vms: list[VmSpec], plan: HostPlan, reserved_cpus: list[int]) -> None:
    node_cpus = {n.node: parse_cpulist(n.cpulist) for n in facts.numa}
    all_cpus = sorted({c for cpus in node_cpus.values() for c in cpus})
    reserved = set(reserved_cpus)
    used: dict[int, str] = {}  # host CPU -> VM pinned there
    hugepages_left = _node_hugepages(facts)
    for vm in vms:
        spread = _spread_nodes(facts, vm, node_cpus)
        if spread:
            pools = (node_cpus, reserved, used)
            plan.placements[vm.name] = _place_cells(facts, vm, spread, plan, pools, hugepages_left)
            continue
        devices = [g.address for g in vm.gpus] + [v.address for v in vm.vfs] + [m.parent for m in vm.mdevs]
        device_node = _device_node(facts, devices)
        node = vm.numa_node if vm.numa_node is not None else device_node
        if vm.numa_node is not None and vm.numa_node not in node_cpus:
            plan.refusals.append(
                Refusal(
                    f"VM {vm.name}: NUMA node {vm.numa_node} does not exist (nodes: {', '.join(map(str, node_cpus))})"
                )
            )
            node = None
        elif vm.numa_node is not None and device_node is not None and vm.numa_node != device_node:
            plan.warnings.append(
                f"VM {vm.name}: placed on NUMA node {vm.numa_node} while its GPU is on node {device_node} "
                "(every DMA crosses the interconnect)"
            )
        if len(node_cpus) <= 1 and vm.numa_node is None:
            node = None  # one node: nothing to bind
        nodes_of_devices = {facts.pci[a].numa_node for a in devices if a in facts.pci} - {None, -1}
        if len(nodes_of_devices) > 1:
            plan.warnings.append(
                f"VM {vm.name}: its devices sit on NUMA nodes {sorted(nodes_of_devices)}; placed on node {node}"
            )
        cpus: list[int] | None = None
        if vm.pin:
            if vm.cpuset is not None:
                cpus = list(vm.cpuset)
                unknown = [c for c in cpus if c not in all_cpus]
                if unknown:
                    plan.refusals.append(Refusal(f"VM {vm.name}: cpuset names CPUs {unknown} the host does not have"))
                taken = sorted({used[c] for c in cpus if c in used})
                if taken:
                    plan.refusals.append(
                        Refusal(
                            f"VM {vm.name}: cpuset overlaps the CPUs pinned to VM {', '.join(taken)}",
                            "pinned VMs must not share host CPUs",
                        )
                    )
                if node is not None and any(c not in node_cpus.get(node, []) for c in cpus):
                    plan.warnings.append(f"VM {vm.name}: cpuset is not all on NUMA node {node}")
            else:
                pool_all = node_cpus.get(node, []) if node is not None else all_cpus
                pool = [c for c in pool_all if c not in reserved and c not in used]
                if len(pool) < vm.vcpus:
                    where = f"NUMA node {node}" if node is not None else "the host"
                    kept = len([c for c in pool_all if c in reserved])
                    pinned = len([c for c in pool_all if c in used])
                    plan.refusals.append(
                        Refusal(
                            f"VM {vm.name}: CPUs oversubscribed: {vm.vcpus} vCPUs to pin, {len(pool)} CPUs of {where} "
                            f"left ({len(pool_all)} CPUs, {kept} kept for the host, {pinned} pinned to earlier VMs)",
                            "use fewer vCPUs, another GPU's node, or pin: false",
                        )
                    )
                else:
                    cpus = pool[: vm.vcpus]
            for c in cpus or []:
                used.setdefault(c, vm.name)
        hugepage_kib = None
        if vm.hugepages != "no":
            memory_kib = vm.memory_mib * 1024
            nodes = [node] if node is not None else sorted(hugepages_left)
            sizes = sorted({s for n in nodes for s in hugepages_left.get(n, {})}, reverse=True)
            for size in sizes:
                if memory_kib % size:
                    continue
                left = sum(hugepages_left.get(n, {}).get(size, 0) for n in nodes)
                if left >= memory_kib:
                    hugepage_kib = size
                    need = memory_kib
                    for n in nodes:
                        take = min(need, hugepages_left.get(n, {}).get(size, 0))
                        if take:
                            hugepages_left[n][size] -= take
                            need -= take
                    break
            if hugepage_kib is None and vm.hugepages == "yes":
                where = f"NUMA node {node}" if node is not None else "the host"
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: hugepages oversubscribed: {vm.memory_mib} MiB wanted in hugepages on {where} "
                        f"({_pages_left(hugepages_left, nodes, sizes)})",
                        "reserve more hugepages (vm.nr_hugepages or hugepages= at boot), or hugepages: auto",
                    )
                )
        plan.placements[vm.name] = Placement(node=node, cpus=cpus, hugepage_kib=hugepage_kib)


def reserved_memory_kib(settings: HostSettings, total_kib: int) -> int:
    """Memory kept for the host: as set, else 10% of RAM, at most 4 GiB."""
    if settings.reserved_memory_mib is not None:
        return settings.reserved_memory_mib * 1024
    return min(4 * 1048576, total_kib // 10)


def check_totals(
    facts: HostFacts, vms: list[VmSpec], plan: HostPlan, settings: HostSettings, reserved: list[int]
) -> None:
    total_kib = sum(n.memory_kib or 0 for n in facts.numa)
    reserved_kib = reserved_memory_kib(settings, total_kib)
    huge_kib = sum(v for sizes in _node_hugepages(facts).values() for v in sizes.values())
    normal_vms = [v for v in vms if plan.placements[v.name].hugepage_kib is None]
    want_kib = sum(v.memory_mib * 1024 for v in vms)
    normal_kib = sum(v.memory_mib * 1024 for v in normal_vms)
    cpus = sorted({c for n in facts.numa for c in parse_cpulist(n.cpulist)})
    reserved_cpus = [c for c in reserved if c in cpus]
    vcpus = sum(v.vcpus for v in vms)
    plan.resources = {
        "memory": {
            "host_mib": total_kib // 1024,
            "reserved_for_host_mib": reserved_kib // 1024,
            "hugepages_reserved_mib": huge_kib // 1024,
            "vms_mib": want_kib // 1024,
            "vms_in_hugepages_mib": (want_kib - normal_kib) // 1024,
        },
        "cpus": {"host": len(cpus), "reserved_for_host": len(reserved_cpus), "vcpus": vcpus},
    }
    unknown = {n: m for n, m in facts.missing.items() if m.rule == RESOURCES}
    for finding in [unknown_finding(name, m) for name, m in unknown.items()]:
        # Fail closed: a fit that cannot be checked is refused (docs/concepts/safety-rules.md).
        plan.refusals.append(Refusal(finding.message, finding.fix))
    if not total_kib and not unknown:
        plan.refusals.append(
            Refusal("unknown: host memory reads as 0 kB (NUMA meminfo)", how_to_read(facts.root == "/"))
        )
    if not total_kib or unknown:
        return
    sizes: dict[int, int] = {}
    for v in vms:
        sizes[v.memory_mib] = sizes.get(v.memory_mib, 0) + 1
    breakdown = " + ".join(f"{n} x {_gib(m * 1024)}" for m, n in sorted(sizes.items(), reverse=True))
    if want_kib + reserved_kib > total_kib:
        plan.refusals.append(
            Refusal(
                f"host memory oversubscribed: the VMs need {_gib(want_kib)} ({len(vms)} VMs: {breakdown}), "
                f"the host has {_gib(total_kib)} of which {_gib(reserved_kib)} is kept for the host",
                "fewer or smaller VMs, or a host with more memory (VFIO pins all guest memory: no overcommit)",
            )
        )
    elif normal_kib + huge_kib + reserved_kib > total_kib:
        plan.refusals.append(
            Refusal(
                f"host memory oversubscribed: {_gib(normal_kib)} of VMs in normal pages, {_gib(huge_kib)} reserved as "
                f"hugepages and {_gib(reserved_kib)} kept for the host exceed the host's {_gib(total_kib)}",
                "back more VMs with the reserved hugepages, or reserve fewer",
            )
        )
    if cpus and vcpus > len(cpus) - len(reserved_cpus):
        plan.refusals.append(
            Refusal(
                f"host CPUs oversubscribed: the VMs have {vcpus} vCPUs, the host {len(cpus)} CPUs of which "
                f"{len(reserved_cpus)} are kept for the host",
                "fewer vCPUs per VM, or fewer VMs",
            )
        )
    check_nodes(facts, vms, plan, reserved_kib, total_kib)


def check_nodes(facts: HostFacts, vms: list[VmSpec], plan: HostPlan, reserved_kib: int, total_kib: int) -> None:
    """The memory each VM binds (strict) to a NUMA node, in list order, against that node's:
    its MemTotal less its share of what is kept for the host (shared in proportion to the
    nodes' memory: the host's own use is not bound to one node) and less its reserved
    hugepages (VMs in hugepages are counted against those by :func:`place`). A VM that does
    not fit is refused and takes nothing, so later VMs are judged on what the others take.
    Only called when every node's memory was read (check_totals refuses on unknown)."""
    hugepages = _node_hugepages(facts)
    nodes: dict[int, dict[str, int]] = {}
    for n in facts.numa:
        memory = n.memory_kib or 0
        nodes[n.node] = {
            "memory": memory,
            "reserved": reserved_kib * memory // total_kib,
            "hugepages": sum(hugepages.get(n.node, {}).values()),
            "vms": 0,
        }
    bound_to: dict[int, list[str]] = {}
    for vm in vms:
        placement = plan.placements[vm.name]
        if placement.hugepage_kib is not None or vm.hugepages == "yes":
            continue  # in hugepages, or refused for want of them: not in the node's normal pages
        wants = [(c.node, c.memory_mib * 1024) for c in placement.cells]
        if not wants and placement.node is not None:
            wants = [(placement.node, vm.memory_mib * 1024)]
        short = False
        for node, kib in wants:
            have = nodes.get(node)
            if have is None:
                continue  # a node the host lacks: refused by place()
            left = have["memory"] - have["reserved"] - have["hugepages"] - have["vms"]
            if kib <= left:
                continue
            short = True
            earlier = bound_to.get(node, [])
            cell = (
                f" (its guest cell on it; its GPUs span nodes {[c.node for c in placement.cells]})"
                if placement.cells
                else ""
            )
            plan.refusals.append(
                Refusal(
                    f"VM {vm.name}: memory oversubscribed on NUMA node {node}: {_mib(kib)} bound there{cell}, "
                    f"the node has {_mib(max(left, 0))} left ({_mib(have['memory'])}, {_mib(have['reserved'])} of it "
                    f"kept for the host, {_mib(have['hugepages'])} reserved as hugepages, {_mib(have['vms'])} bound to "
                    f"earlier VMs{' ' + ', '.join(earlier) if earlier else ''})",
                    f"fewer or smaller VMs on node {node}, reserve fewer hugepages there, or place the VM on another "
                    "node (numa_node)",
                )
            )
        if short:
            continue
        for node, kib in wants:
            if node in nodes:
                nodes[node]["vms"] += kib
                bound_to.setdefault(node, []).append(vm.name)
    plan.resources["memory"]["nodes"] = [
        {
            "node": node,
            "host_mib": have["memory"] // 1024,
            "reserved_for_host_mib": have["reserved"] // 1024,
            "hugepages_reserved_mib": have["hugepages"] // 1024,
            "vms_bound_mib": have["vms"] // 1024,
        }
        for node, have in nodes.items()
    ]
