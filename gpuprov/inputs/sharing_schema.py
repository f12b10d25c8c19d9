"""The guest declaration's schema (``gpuprov_guest``): how each GPU of a guest is shared among tenants.

Plain JSON Schema data, part of the one declaration schema (:data:`gpuprov.inputs.declaration.SCHEMA`
takes these ``$defs``), so ``gpuprov schema``, docs/reference/gpuprov-host.schema.json and the validator
read one text. What the schema cannot say (one of address or uuid, tenants only under MPS, unequal shares
only as advice) is :func:`gpuprov.inputs.sharing.parse_guest`'s; what needs the guest's GPUs (a memory
share above the GPU's memory less its reserve, MPS where the driver lacks it) is the planner's
(:mod:`gpuprov.plan.guest.sharing`). docs/guides/sharing.md says what each mode isolates.

Standard library only (ships to targets with the modules).
"""

from __future__ import annotations

from typing import Any

MODES = ("exclusive", "shared", "mps")
COMPUTE_MODES = ("leave", "exclusive_process")
MAX_GUEST_GPUS = 64
MAX_TENANTS = 48  # an MPS server's client limit on Volta and later (CUDA's MPS documentation)
MAX_GPU_MEMORY_MIB = 1 << 20  # 1 TiB: above any GPU's memory
DEFAULT_RESERVE_MIB = 2048  # kept back from the tenants: the MPS server's and each client's context
DEFAULT_MPS_ROOT = "/run/gpuprov/mps"  # per GPU: pipe/, log/, shm/ (the daemon's /dev/shm)
# A unix socket's path has at most 107 bytes (sun_path): ROOT/NAME/pipe/control_privileged, NAME 32 at most.
MAX_MPS_ROOT = 107 - 1 - 32 - len("/pipe/control_privileged")

_NAME = "^[a-z][a-z0-9_-]{0,31}$(?!\\n)"
_PCI = "^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[01][0-9a-fA-F]\\.[0-7]$(?!\\n)"
_GPU_UUID = "^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$(?!\\n)"
# A directory for the daemons' pipes and logs: absolute, plain characters only (it goes into a
# generated script and a CDI spec), no `..`, no trailing slash.
_MPS_ROOT = "^(?:/(?!\\.\\.?(?:/|$))[A-Za-z0-9_.-]+)+$(?!\\n)"


def _closed(properties: dict[str, Any], description: str, **more: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "maxProperties": 16,
        "additionalProperties": False,
        "properties": properties,
        "description": description,
        **more,
    }


GUEST_DEFS: dict[str, Any] = {
    "guest": _closed(
        {
            "version": {"$ref": "#/$defs/version"},
            "gpus": {
                "type": "array",
                "maxItems": MAX_GUEST_GPUS,
                "items": {"$ref": "#/$defs/guest_gpu"},
                "description": "how each GPU of the guest is shared, at most 64 entries",
            },
            "mps_root": {
                "type": "string",
                "maxLength": MAX_MPS_ROOT,
                "pattern": _MPS_ROOT,
                "description": "where the MPS daemons keep their pipes, logs and shared memory (a folder per GPU "
                f"entry), an absolute path of letters, digits, _ . -, at most {MAX_MPS_ROOT} characters (the "
                f"daemon's sockets go below it, and a socket's path has at most 107); default {DEFAULT_MPS_ROOT}",
            },
        },
        "a guest's declaration: gpuprov_guest {version, gpus, mps_root}",
    ),
    "guest_gpu": _closed(
        {
            "name": {
                "type": "string",
                "pattern": _NAME,
                "description": "the entry's name (lower-case letters, digits, _ and -, 32 at most): it names the "
                "daemon's folder and the tenants' CDI devices",
            },
            "address": {
                "type": "string",
                "pattern": _PCI,
                "description": "the GPU's full PCI address as the guest sees it (nvidia-smi's pci.bus_id)",
            },
            "uuid": {"type": "string", "pattern": _GPU_UUID, "description": "the GPU's UUID (GPU-...)"},
            "sharing": {
                "enum": list(MODES),
                "description": "exclusive (one user at a time, nothing set up), shared (time-sliced, no limits) or "
                "mps (tenants side by side, each held to its share)",
            },
            "tenants": {
                "type": ["integer", "array"],
                "minimum": 2,
                "maximum": MAX_TENANTS,
                "minItems": 1,
                "maxItems": MAX_TENANTS,
                "items": {"$ref": "#/$defs/tenant"},
                "description": "mps only: a number of equal tenants (2 to 48), or the tenants by name with their "
                "shares (1 to 48)",
            },
            "memory_reserve_mib": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_GPU_MEMORY_MIB,
                "description": f"mps only: GPU memory no tenant gets (MiB; default {DEFAULT_RESERVE_MIB})",
            },
            "compute_mode": {
                "enum": list(COMPUTE_MODES),
                "description": "mps only: exclusive_process (the default: the GPU takes only the MPS server, so a "
                "process that leaves MPS is refused) or leave (the compute mode as it is)",
            },
            "clients_group": {
                "type": "string",
                "pattern": "^[a-z_][a-z0-9_-]{0,31}$(?!\\n)",
                "description": "mps only: who may connect - the pipe and shared memory folders belong to this "
                "group, closed to others (root and the group's members, e.g. containers run with --group-add); "
                "without it, anyone on the guest may connect, as MPS's own default",
            },
            "advisory_shares": {
                "type": "boolean",
                "description": "mps only: accept unequal shares as advice (MPS holds every client to the largest "
                "share; a tenant's own smaller share is set in its container's environment)",
            },
        },
        "one GPU of the guest and how it is shared",
        required=["name", "sharing"],
    ),
    "tenant": _closed(
        {
            "name": {"type": "string", "pattern": _NAME, "description": "the tenant's name (as a GPU entry's)"},
            "sm_percent": {
                "type": "integer",
                "minimum": 1,
                "maximum": 100,
                "description": "the tenant's share of the GPU's SMs, 1 to 100 percent",
            },
            "memory_mib": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_GPU_MEMORY_MIB,
                "description": "the tenant's share of GPU memory, in MiB",
            },
        },
        "a tenant: {name, sm_percent, memory_mib}",
        required=["name", "sm_percent", "memory_mib"],
    ),
}
