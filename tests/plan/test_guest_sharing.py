"""The guest sharing planner (gpuprov.plan.guest.sharing) and its declaration (gpuprov.inputs.sharing):
what a guest is owed for each way its GPUs are shared, what is refused and why, and the CDI spec that
makes the tenants' containers MPS clients."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuprov.core.plan import COMMAND, REMOVE_FILE, WRITE_FILE
from gpuprov.facts.mps import STATE_FILE, GpuRow, MpsState, SharingFacts, mib, parse_gpu_rows, script_path
from gpuprov.inputs.declaration import SCHEMA
from gpuprov.inputs.sharing import parse_guest
from gpuprov.plan.guest.sharing import derive_cdi, plan_sharing, unit_path, wants_path
from gpuprov.plan.guest.toolkit import CDI_STAGING

UUID = "GPU-11111111-2222-3333-4444-555555555555"
ROW = GpuRow(0, UUID, "0000:00:06.0", 143771, "Default", 9.0, "NVIDIA H200", "580.159.04")
CONTROL = "/usr/local/nvidia/bin/nvidia-cuda-mps-control"
BASE = {
    "cdiVersion": "0.5.0",
    "kind": "nvidia.com/gpu",
    "devices": [
        {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
        {"name": UUID, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
        {"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
    ],
    "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
}
FOUR = {"name": "gpu0", "address": "0000:00:06.0", "sharing": "mps", "tenants": 4, "compute_mode": "leave"}


def decl(*gpus: dict[str, Any]):
    parsed, problems = parse_guest({"version": 1, "gpus": list(gpus)})
    assert problems == [] and parsed is not None
    return parsed


def facts(**more: Any) -> SharingFacts:
    files = {CDI_STAGING: json.dumps(BASE), "etc/cdi/nvidia.yaml": "---\nkind: nvidia.com/gpu\n"}
    files.update(more.pop("files", {}))
    return SharingFacts(
        gpus=more.pop("gpus", [ROW]),
        control=more.pop("control", CONTROL),
        server=more.pop("server", CONTROL.replace("control", "server")),
        systemd=more.pop("systemd", False),
        states=more.pop("states", {}),
        files=files,
        **more,
    )


def converge(f: SharingFacts, d) -> SharingFacts:
    """The facts after the plan was applied (files written, the daemon up with its limits)."""
    sp = plan_sharing(f, d, nvidia_ctk="/usr/bin/nvidia-ctk", staged_now=True)
    for a in sp.plan.actions:
        if a.kind == WRITE_FILE:
            f.files[a.path] = a.content
        elif a.kind == REMOVE_FILE:
            f.files[a.path] = None
    for entry in sp.report:
        if entry.get("sharing") == "mps":
            lim = entry["server_limits"]
            f.states[entry["name"]] = MpsState(
                True, True, True, 42, [43], [], float(lim["sm_percent"]), lim["memory_mib"]
            )
    return f


def kinds(sp) -> list[tuple[str, str]]:
    return [(a.kind, a.path or " ".join(a.argv or [])) for a in sp.plan.actions]


def test_four_equal_tenants_on_a_bare_guest_without_systemd() -> None:
    sp = plan_sharing(facts(), decl(FOUR), nvidia_ctk="/usr/bin/nvidia-ctk", staged_now=True)
    assert not sp.plan.refused
    assert kinds(sp) == [
        (WRITE_FILE, script_path("gpu0")),
        (COMMAND, f"setsid -f /{script_path('gpu0')} run"),
        (WRITE_FILE, "etc/cdi/nvidia.yaml"),
        (WRITE_FILE, STATE_FILE),
    ]
    (entry,) = sp.report
    # 143771 MiB less the 2048 MiB reserve, in four: every tenant held to it by the server.
    assert entry["server_limits"] == {"sm_percent": 25, "memory_mib": 34816}
    assert entry["enforced"] is True and [t["enforced"] for t in entry["tenants"]] == [True] * 4
    script = sp.plan.actions[0].content
    assert "SM=25\nMEM=34G\n" in script and f"CUDA_VISIBLE_DEVICES={UUID}" in script
    assert sp.plan.actions[0].mode == 0o755


def test_a_converged_guest_plans_nothing_and_drift_is_repaired() -> None:
    d = decl(FOUR)
    f = converge(facts(), d)
    assert plan_sharing(f, d, nvidia_ctk="/usr/bin/nvidia-ctk").plan.actions == []
    # Limits changed by hand: applied again, nothing restarted.
    f.states["gpu0"].default_sm = 100.0
    assert kinds(plan_sharing(f, d)) == [(COMMAND, f"/{script_path('gpu0')} limits")]
    f.states["gpu0"].default_sm = 25.0
    f.states["gpu0"].server_limits = {77: (100.0, 35430)}
    assert kinds(plan_sharing(f, d)) == [(COMMAND, f"/{script_path('gpu0')} limits")]
    f.states["gpu0"].server_limits = {}
    # The pipe folder removed: the supervisor restarted.
    f.states["gpu0"].control_socket = False
    assert kinds(plan_sharing(f, d)) == [
        (COMMAND, f"/{script_path('gpu0')} stop"),
        (COMMAND, f"setsid -f /{script_path('gpu0')} run"),
    ]
    # Supervisor and daemon killed: started.
    f.states["gpu0"] = MpsState(folder=True)
    assert kinds(plan_sharing(f, d)) == [(COMMAND, f"setsid -f /{script_path('gpu0')} run")]


def test_systemd_runs_the_supervisor_as_a_unit() -> None:
    sp = plan_sharing(facts(systemd=True), decl(FOUR), nvidia_ctk="/usr/bin/nvidia-ctk", staged_now=True)
    got = kinds(sp)
    assert (WRITE_FILE, unit_path("gpu0")) in got
    assert got.index((COMMAND, "systemctl daemon-reload")) < got.index(
        (COMMAND, "systemctl enable --now gpuprov-mps-gpu0.service")
    )
    unit = next(a.content for a in sp.plan.actions if a.path == unit_path("gpu0"))
    assert f"ExecStart=/{script_path('gpu0')} run" in unit and "Restart=always" in unit
    f = converge(facts(systemd=True), decl(FOUR))
    f.files[wants_path("gpu0")] = f.files[unit_path("gpu0")]
    assert plan_sharing(f, decl(FOUR)).plan.actions == []


def test_back_to_exclusive_stops_and_removes_everything() -> None:
    f = converge(facts(), decl(FOUR))
    ex = decl({"name": "gpu0", "address": "0000:00:06.0", "sharing": "exclusive"})
    sp = plan_sharing(f, ex, nvidia_ctk="/usr/bin/nvidia-ctk", staged_now=True)
    got = kinds(sp)
    assert got[0] == (COMMAND, f"/{script_path('gpu0')} clean")
    assert (REMOVE_FILE, script_path("gpu0")) in got
    cdi = next(a.content for a in sp.plan.actions if a.path == "etc/cdi/nvidia.yaml")
    assert "CUDA_MPS" not in cdi and json.loads(cdi)["devices"] == BASE["devices"]


def test_compute_mode_exclusive_process_is_set_and_put_back() -> None:
    d = decl({**FOUR, "compute_mode": "exclusive_process"})
    sp = plan_sharing(facts(), d, nvidia_ctk="/usr/bin/nvidia-ctk", staged_now=True)
    assert kinds(sp)[0] == (COMMAND, f"nvidia-smi -i {UUID} -c EXCLUSIVE_PROCESS")
    f = converge(facts(), d)
    f.gpus = [GpuRow(**{**ROW.__dict__, "compute_mode": "Exclusive_Process"})]
    assert plan_sharing(f, d, nvidia_ctk="/usr/bin/nvidia-ctk").plan.actions == []
    back = plan_sharing(f, decl({"name": "gpu0", "uuid": UUID, "sharing": "shared"}), staged_now=True)
    assert (COMMAND, f"nvidia-smi -i {UUID} -c DEFAULT") in kinds(back)


def test_unequal_shares_are_advice_and_said_so() -> None:
    tenants = [
        {"name": "big", "sm_percent": 75, "memory_mib": 61440},
        {"name": "small", "sm_percent": 25, "memory_mib": 20480},
    ]
    refused, problems = parse_guest({"gpus": [{**FOUR, "tenants": tenants}]})
    assert (
        refused is None and "cannot be enforced by MPS" in problems[0].message and "advisory_shares" in problems[0].fix
    )
    sp = plan_sharing(facts(), decl({**FOUR, "tenants": tenants, "advisory_shares": True}), staged_now=True)
    (entry,) = sp.report
    assert entry["server_limits"] == {"sm_percent": 75, "memory_mib": 61440} and entry["enforced"] is False
    assert [(t["name"], t["enforced"]) for t in entry["tenants"]] == [("big", True), ("small", False)]
    spec = json.loads(next(a.content for a in sp.plan.actions if a.path == "etc/cdi/nvidia.yaml"))
    small = next(d for d in spec["devices"] if d["name"] == "gpu0-small")["containerEdits"]
    assert (
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in small["env"]
        and "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20G" in small["env"]
    )
    assert small["deviceNodes"] == [{"path": "/dev/nvidia0"}]


def test_the_cdi_spec_makes_every_device_of_the_gpu_a_client() -> None:
    d = decl(FOUR)
    sp = plan_sharing(facts(), d, staged_now=True)
    spec = json.loads(next(a.content for a in sp.plan.actions if a.path == "etc/cdi/nvidia.yaml"))
    assert [x["name"] for x in spec["devices"]] == ["0", UUID, "all"]
    for device in spec["devices"]:
        edits = device["containerEdits"]
        assert "CUDA_MPS_PIPE_DIRECTORY=/run/gpuprov/mps/gpu0/pipe" in edits["env"]
        assert {
            "hostPath": "/run/gpuprov/mps/gpu0/shm",
            "containerPath": "/dev/shm",
            "options": ["rbind", "rw", "nosuid", "nodev"],
        } in edits["mounts"]
    assert spec["containerEdits"] == BASE["containerEdits"]
    # Two GPUs, one shared: "all" would make the other an MPS client of the first's daemon; it goes.
    two = {
        **BASE,
        "devices": [*BASE["devices"], {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}}],
    }
    entry = (d.gpus[0], ROW, __import__("gpuprov.plan.guest.sharing", fromlist=["Limits"]).Limits(25, 100), "/r/gpu0")
    names = [x["name"] for x in json.loads(derive_cdi(two, [entry]))["devices"]]
    assert "all" not in names and "1" in names


def test_the_staged_spec_is_made_first_when_the_spec_is_not_derived_from_it() -> None:
    f = facts(files={CDI_STAGING: None})
    sp = plan_sharing(f, decl(FOUR), nvidia_ctk="/usr/bin/nvidia-ctk")
    assert sp.staging is not None and sp.staging.argv[-1] == f"--output=/{CDI_STAGING}"
    assert not any(a.path == "etc/cdi/nvidia.yaml" for a in sp.plan.actions)
    assert plan_sharing(f, decl(FOUR), nvidia_ctk=None).plan.refusals[0].fix.startswith("run the container toolkit")


@pytest.mark.parametrize(
    ("more", "entry", "words"),
    [
        ({"control": None}, FOUR, "nvidia-cuda-mps-control or nvidia-cuda-mps-server is not installed"),
        ({"gpus": None, "gpus_error": "nvidia-smi is not on the PATH"}, FOUR, "the guest's GPUs are unknown"),
        ({}, {**FOUR, "address": "0000:00:07.0"}, "0000:00:07.0 is not a GPU of this guest"),
        ({"gpus": [GpuRow(**{**ROW.__dict__, "compute_cap": 6.1})]}, FOUR, "compute capability 6.1"),
        ({"gpus": [GpuRow(**{**ROW.__dict__, "compute_cap": None})]}, FOUR, "compute capability unknown"),
        ({}, {**FOUR, "tenants": 48, "memory_reserve_mib": 140000}, "48 tenants get 0 MiB each"),
        (
            {},
            {
                **FOUR,
                "tenants": [
                    {"name": "a", "sm_percent": 50, "memory_mib": 80000},
                    {"name": "b", "sm_percent": 50, "memory_mib": 80000},
                ],
            },
            "add up to 160000 MiB",
        ),
    ],
)
def test_refusals_name_the_problem_and_change_nothing(more: dict[str, Any], entry: dict[str, Any], words: str) -> None:
    sp = plan_sharing(facts(**more), decl(entry), nvidia_ctk="/usr/bin/nvidia-ctk", staged_now=True)
    assert sp.plan.refused and sp.plan.actions == []
    assert any(words in r.message for r in sp.plan.refusals), sp.plan.refusals
    assert all(r.fix for r in sp.plan.refusals)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"gpus": [{"name": "g", "sharing": "mps", "tenants": 2}]}, "neither or both of address and uuid"),
        ({"gpus": [{"name": "g", "uuid": UUID, "sharing": "shared", "tenants": 2}]}, "is for sharing: mps"),
        ({"gpus": [{"name": "g", "uuid": UUID, "sharing": "mps"}]}, "is required with sharing: mps"),
        ({"gpus": [{"name": "g", "uuid": UUID, "sharing": "shared", "clients_group": "t"}]}, "is for sharing: mps"),
        ({"gpus": [{"name": "g", "uuid": UUID, "sharing": "mps", "tenants": 2, "clients_group": "a;b"}]}, "not valid"),
        ({"gpus": [{"name": "g", "uuid": UUID, "sharing": "mps", "tenants": 1}]}, "below 2"),
        ({"gpus": [{"name": "g", "uuid": UUID, "sharing": "mps", "tenants": 49}]}, "above 48"),
        ({"gpus": [{"name": "g", "uuid": UUID, "sharing": "mps", "tenants": 2, "tenant": 1}]}, "not a known key"),
        (
            {"gpus": [{"name": "g", "uuid": UUID, "sharing": "mps", "tenants": 2}], "mps_root": "/run/../etc"},
            "not valid",
        ),
        (
            {"gpus": [{"name": "g", "uuid": UUID, "sharing": "mps", "tenants": 2}], "mps_root": "/run/x;reboot"},
            "not valid",
        ),
        (
            {
                "gpus": [
                    {
                        "name": "g",
                        "uuid": UUID,
                        "sharing": "mps",
                        "tenants": [
                            {"name": "a", "sm_percent": 60, "memory_mib": 1},
                            {"name": "b", "sm_percent": 60, "memory_mib": 1},
                        ],
                    }
                ]
            },
            "add up to 120%",
        ),
        (
            {
                "gpus": [
                    {"name": "g", "uuid": UUID, "sharing": "exclusive"},
                    {"name": "g", "address": "0000:00:07.0", "sharing": "exclusive"},
                ]
            },
            "names two entries",
        ),
        ({"gpus": [{"name": "g", "uuid": UUID, "sharing": "sliced"}]}, "is not one of"),
    ],
)
def test_the_declaration_is_refused_with_its_field(value: dict[str, Any], words: str) -> None:
    parsed, problems = parse_guest(value)
    assert parsed is None
    assert any(words in p.message for p in problems), problems


def test_the_declaration_is_part_of_the_one_schema() -> None:
    assert SCHEMA["properties"]["gpuprov_guest"] == {"$ref": "#/$defs/guest"}
    assert {"guest", "guest_gpu", "tenant"} <= set(SCHEMA["$defs"])


def test_facts_read_nvidia_smi_rows_and_sizes() -> None:
    rows = parse_gpu_rows(f"0, {UUID}, 00000000:00:06.0, 143771, Default, 9.0, NVIDIA H200, 580.159.04\nbad line\n")
    assert rows == [GpuRow(0, UUID, "0000:00:06.0", 143771, "Default", 9.0, "NVIDIA H200", "580.159.04")]
    assert [mib(t) for t in ("4G", "4096M", "35430M", "35430.0M", "1073741824", "junk", "9" * 40)] == [
        4096,
        4096,
        35430,
        35430,
        1024,
        None,
        None,
    ]


def test_a_gpu_uuid_that_is_not_nvidias_form_is_no_gpu() -> None:
    """A UUID from nvidia-smi goes into the supervisor script: anything but NVIDIA's form is skipped."""
    line = "0, GPU-1;reboot, 00000000:00:06.0, 143771, Default, 9.0, H200, 580\n"
    assert parse_gpu_rows(line) == []
