"""The guest declaration (``gpuprov_guest``), raw -> typed: how each GPU of a guest is shared.

The schema's rules (:mod:`gpuprov.inputs.sharing_schema`) are checked first, through the one
declaration validator (:func:`gpuprov.inputs.declaration.check`); then what JSON Schema cannot say:
an entry names its GPU once (``address`` or ``uuid``), names are unique, ``tenants`` and the other MPS
keys only under ``sharing: mps`` (and MPS needs them), SM shares add up to 100 at most, and unequal
shares only with ``advisory_shares: true``. Why unequal shares are advice: an MPS server's limits
bind all its clients alike, a client may lower its own but never raise them, and one Linux user's
server is served at a time (docs/guides/sharing.md, measured on an H200), so a share below the
largest cannot be held against a tenant's own code.

Standard library only (ships to targets with the modules).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.plan import Refusal
from ..facts.pci import PciAddressError, normalize_address
from .declaration import check
from .sharing_schema import DEFAULT_MPS_ROOT, DEFAULT_RESERVE_MIB
from .validate import Problems


@dataclass(frozen=True)
class Tenant:
    name: str
    sm_percent: int
    memory_mib: int | None  # None: an equal share of what the GPU has less its reserve (known to the planner)


@dataclass
class GpuSharing:
    name: str
    sharing: str  # exclusive | shared | mps
    address: str | None = None  # normalized full PCI address
    uuid: str | None = None
    equal_tenants: int | None = None  # tenants: N
    tenants: list[Tenant] = field(default_factory=list)  # tenants: [{name, sm_percent, memory_mib}]
    memory_reserve_mib: int = DEFAULT_RESERVE_MIB
    compute_mode: str = "exclusive_process"
    advisory_shares: bool = False
    clients_group: str | None = None  # who may connect: the pipe and shm folders' group (None: anyone)

    @property
    def selector(self) -> str:
        return self.address or self.uuid or ""

    @property
    def equal(self) -> bool:
        """Every tenant gets the same share: what an MPS server's limits can hold for each."""
        shares = {(t.sm_percent, t.memory_mib) for t in self.tenants}
        return self.equal_tenants is not None or len(shares) <= 1


@dataclass
class GuestSharing:
    gpus: list[GpuSharing] = field(default_factory=list)
    mps_root: str = DEFAULT_MPS_ROOT

    def as_dict(self) -> dict[str, Any]:
        """The declaration as gpuprov keeps it in the guest (what ``gpuprov verify`` checks against)."""
        out: list[dict[str, Any]] = []
        for g in self.gpus:
            entry: dict[str, Any] = {"name": g.name, "sharing": g.sharing}
            entry.update({"address": g.address} if g.address else {"uuid": g.uuid})
            if g.sharing == "mps":
                entry["tenants"] = g.equal_tenants or [
                    {"name": t.name, "sm_percent": t.sm_percent, "memory_mib": t.memory_mib} for t in g.tenants
                ]
                entry.update(
                    memory_reserve_mib=g.memory_reserve_mib,
                    compute_mode=g.compute_mode,
                    advisory_shares=g.advisory_shares,
                    clients_group=g.clients_group,
                )
            out.append(entry)
        return {"version": 1, "gpus": out, "mps_root": self.mps_root}


MPS_ONLY = ("tenants", "memory_reserve_mib", "compute_mode", "advisory_shares", "clients_group")


def parse_guest(value: Any, path: str = "gpuprov_guest") -> tuple[GuestSharing | None, list[Refusal]]:
    """``gpuprov_guest`` -> the typed declaration, or every problem (each with its field path and fix)."""
    if value is None:
        return GuestSharing(), []
    p = check(value, path, "guest")
    if p:
        return None, p.items
    out = GuestSharing(mps_root=value.get("mps_root") or DEFAULT_MPS_ROOT)
    names: set[str] = set()
    gpus_seen: set[str] = set()
    for i, raw in enumerate(value.get("gpus") or []):
        gpu = _gpu(p, f"{path}.gpus[{i}]", raw)
        if gpu is None:
            continue
        if gpu.name in names:
            p.add(f"{path}.gpus[{i}].name", f"{gpu.name} names two entries", "give each GPU entry its own name")
        if gpu.selector.lower() in gpus_seen:
            p.add(f"{path}.gpus[{i}]", f"{gpu.selector} is declared twice", "declare each GPU once")
        names.add(gpu.name)
        gpus_seen.add(gpu.selector.lower())
        out.gpus.append(gpu)
    return (None, p.items) if p else (out, [])


def _gpu(p: Problems, where: str, raw: dict[str, Any]) -> GpuSharing | None:
    before = len(p.items)
    if ("address" in raw) == ("uuid" in raw):
        p.add(where, "names its GPU by neither or both of address and uuid", "give one: address (full PCI) or uuid")
    address = None
    if "address" in raw:
        try:
            address = normalize_address(raw["address"])
        except PciAddressError as exc:
            p.add(f"{where}.address", str(exc), "give the full PCI address (nvidia-smi --query-gpu=pci.bus_id)")
    sharing = raw["sharing"]
    if sharing != "mps":
        for key in MPS_ONLY:
            if key in raw:
                p.add(f"{where}.{key}", f"is for sharing: mps, not {sharing}", f"remove {key}, or set sharing: mps")
    elif "tenants" not in raw:
        p.add(f"{where}.tenants", "is required with sharing: mps", "give a number of equal tenants, or the tenants")
    gpu = GpuSharing(
        name=raw["name"],
        sharing=sharing,
        address=address,
        uuid=raw.get("uuid"),
        memory_reserve_mib=raw.get("memory_reserve_mib", DEFAULT_RESERVE_MIB),
        compute_mode=raw.get("compute_mode", "exclusive_process"),
        advisory_shares=bool(raw.get("advisory_shares", False)),
        clients_group=raw.get("clients_group"),
    )
    tenants = raw.get("tenants")
    if isinstance(tenants, int):
        gpu.equal_tenants = tenants
    elif isinstance(tenants, list):
        gpu.tenants = [Tenant(t["name"], t["sm_percent"], t["memory_mib"]) for t in tenants]
        _tenants(p, f"{where}.tenants", gpu)
    return gpu if len(p.items) == before else None


def _tenants(p: Problems, where: str, gpu: GpuSharing) -> None:
    names = [t.name for t in gpu.tenants]
    for name in sorted({n for n in names if names.count(n) > 1}):
        p.add(where, f"names tenant {name} twice", "give each tenant its own name")
    total = sum(t.sm_percent for t in gpu.tenants)
    if total > 100:
        p.add(where, f"SM shares add up to {total}%, more than the whole GPU", "lower the shares to 100% in all")
    if not gpu.equal and not gpu.advisory_shares:
        shares = ", ".join(f"{t.name} {t.sm_percent}% / {t.memory_mib} MiB" for t in gpu.tenants)
        p.add(
            where,
            f"unequal shares ({shares}) cannot be enforced by MPS: its server's limits bind every client alike, "
            "and a client can lower its own but never raise them",
            "give every tenant the same share (enforced), or set advisory_shares: true to hold every tenant to the "
            "largest share and set each one's own in its container's environment (advice, reported as such)",
        )
