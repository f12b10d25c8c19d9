"""The saved vGPU layout (/etc/gpuprov/vgpu.json): what gpuprov made before."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ...core.plan import (
    Plan,
)
from ...facts.vgpu_inputs import STATE_FILE

STATE_SCHEMA = "gpuprov.vgpu-state/v1"


@dataclass
class Managed:
    """What gpuprov made before, from the saved layout."""

    mdevs: dict[str, tuple[str, str]] = field(default_factory=dict)  # uuid -> (parent, type)
    vfs: dict[str, int] = field(default_factory=dict)  # VF -> type ID
    type_names: dict[int, str] = field(default_factory=dict)


def parse_state(text: str | None, plan: Plan) -> tuple[dict[str, Any], Managed]:
    """The saved layout and what it says gpuprov made; a garbled file is reported and taken as empty."""
    managed = Managed()
    if not text:
        return {}, managed
    try:
        state = json.loads(text)
        if not isinstance(state, dict) or state.get("schema") != STATE_SCHEMA:
            raise ValueError(f"not a {STATE_SCHEMA} document")
        gpus = state.get("gpus") or {}
        for key, entry in gpus.items():
            if entry.get("use") == "mdev":
                for m in entry.get("mdevs") or []:
                    if m.get("uuid"):
                        managed.mdevs[str(m["uuid"])] = (key, str(m["type"]))
            elif entry.get("use") == "sriov_vgpu":
                for v in entry.get("vgpus") or []:
                    if v.get("vf") and isinstance(v.get("type"), int):
                        managed.vfs[str(v["vf"])] = int(v["type"])
        for k, v in (state.get("vgpu_type_names") or {}).items():
            managed.type_names[int(k)] = str(v)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        plan.warnings.append(
            f"/{STATE_FILE} is unreadable ({exc}): nothing gpuprov made before is removed this run; "
            "it is rewritten from the config"
        )
        return {}, Managed()
    return state, managed
