"""The nvidia-smi MIG parsers on the documented output formats, and the placement fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.facts.mig import (
    COMMANDS,
    MigProfile,
    parse_compute_instances,
    parse_gpu_instances,
    parse_mig,
    parse_placements,
    parse_profiles,
    parse_query,
    read_mig,
    smi_address,
)
from gpuprov.facts.sysfs import Sysfs
from gpuprov.plan.vgpu import fit
from tests import vgpuhosts as vh


def test_query_gives_address_and_modes_by_index() -> None:
    gpus = parse_query(vh.mig_outputs()["query"])
    assert {i: (g.address, g.mode_current, g.mode_pending) for i, g in gpus.items()} == {
        0: ("0000:41:00.0", None, None),
        1: ("0000:81:00.0", None, None),
        2: ("0000:c1:00.0", "disabled", "disabled"),
        3: ("0000:e1:00.0", "enabled", "enabled"),
    }
    assert not gpus[0].supported and gpus[2].supported


def test_smi_bus_ids_become_sysfs_addresses() -> None:
    assert smi_address("00000000:E1:00.0") == "0000:e1:00.0"
    assert smi_address("00000001:0A:00.1") == "0001:0a:00.1"


def test_profiles_and_placements_of_an_a100_80gb() -> None:
    out = vh.mig_outputs()
    profiles = {p.name: (p.profile_id, p.free, p.total, p.memory_gib) for p in parse_profiles(out["lgip"])[3]}
    assert profiles == {
        "1g.10gb": (19, 7, 7, 9.75),
        "1g.10gb+me": (20, 1, 1, 9.75),
        "1g.20gb": (15, 4, 4, 19.62),
        "2g.20gb": (14, 3, 3, 19.62),
        "3g.40gb": (9, 2, 2, 39.5),
        "4g.40gb": (5, 1, 1, 39.5),
        "7g.80gb": (0, 1, 1, 79.25),
    }
    placements = parse_placements(out["lgipp"])[3]
    assert placements[9] == ([0, 4], 4) and placements[5] == ([0], 4) and placements[19] == (list(range(7)), 1)


def test_gpu_and_compute_instances() -> None:
    out = vh.mig_outputs()
    gis = parse_gpu_instances(out["lgi"])[3]
    assert [(g.gi_id, g.name, g.profile_id, g.start, g.size) for g in gis] == [
        (13, "1g.10gb", 19, 6, 1),
        (2, "3g.40gb", 9, 0, 4),
    ]
    assert parse_compute_instances(out["lci"]) == {(3, 13): 1, (3, 2): 1}


def test_the_test_renderers_print_what_the_parsers_read() -> None:
    # vgpuhosts renders variants of -lgi/-lci: they must read like the captured format.
    fixture = parse_gpu_instances(vh.mig_outputs()["lgi"])
    rendered = parse_gpu_instances(vh.render_lgi(3, [("1g.10gb", 19, 13, 6, 1), ("3g.40gb", 9, 2, 0, 4)]))
    assert fixture == rendered
    assert parse_compute_instances(vh.render_lci(3, [(13, "1g.10gb"), (2, "3g.40gb")])) == parse_compute_instances(
        vh.mig_outputs()["lci"]
    )
    assert parse_gpu_instances(vh.render_lgi(3, [])) == {} and parse_compute_instances(vh.render_lci(3, [])) == {}


def test_noise_is_skipped() -> None:
    facts = parse_mig({"query": "No devices were found\n", "lgi": "No MIG-enabled devices found.\n", "lgip": ""})
    assert facts.gpus == {} and facts.error is None


def test_profile_lookup_by_name_prefix_or_id() -> None:
    gpu = parse_mig(vh.mig_outputs()).gpus["0000:e1:00.0"]
    assert gpu.profile("3g.40gb") is gpu.profile("MIG 3g.40gb") is gpu.profile(9) is gpu.profile("9")
    assert gpu.profile("3G.40GB") is gpu.profile("3g.40gb") and gpu.profile("5g.50gb") is None
    assert [g.compute_instances for g in gpu.instances] == [1, 1]


def test_processes_are_read_per_gpu() -> None:
    facts = parse_mig(vh.mig_outputs(apps="00000000:E1:00.0, 4242, python3\n00000000:C1:00.0, 7, x\n"))
    assert facts.gpus["0000:e1:00.0"].processes == ["python3 (pid 4242)"]


def test_read_mig_runs_the_commands_or_reads_the_capture(tmp_path) -> None:
    outputs = vh.mig_outputs()
    seen = []

    def run(argv: list[str]) -> str:
        seen.append(argv)
        key = next(k for k, a in COMMANDS.items() if a == argv)
        return outputs[key]

    facts = read_mig(Sysfs(str(tmp_path)), run)
    assert len(seen) == 6 and facts.gpus["0000:e1:00.0"].mode_current == "enabled"
    missing = read_mig(Sysfs(str(tmp_path)))
    assert missing.error and "capture/nvidia-smi-mig-query" in missing.error

    def broken(argv: list[str]) -> str:
        raise OSError("no such file")

    assert "failed: no such file" in (read_mig(Sysfs(str(tmp_path)), broken).error or "")


def _p(name: str, starts: list[int], size: int) -> MigProfile:
    return MigProfile(profile_id=0, name=name, free=1, total=7, memory_gib=0, placements=starts, size=size)


@pytest.mark.parametrize(
    ("wanted", "occupied", "fits"),
    [
        ([("3g", [0, 4], 4), ("3g", [0, 4], 4)], [], True),
        ([("4g", [0], 4), ("3g", [0, 4], 4)], [], True),
        ([("4g", [0], 4), ("3g", [0, 4], 4), ("1g", list(range(7)), 1)], [], False),
        ([("3g", [0, 4], 4), ("2g", [0, 2, 4], 2), ("1g", list(range(7)), 1), ("1g", list(range(7)), 1)], [], True),
        ([("2g", [0, 2, 4], 2), ("1g", list(range(7)), 1)], [(6, 1), (0, 4)], False),
        ([("1g", list(range(7)), 1)] * 7, [], True),
        ([("1g", list(range(7)), 1)] * 8, [], False),
        ([("7g", [0], 8)], [(6, 1)], False),
    ],
)
def test_fit_follows_the_placements(wanted, occupied, fits) -> None:
    profiles = [_p(*w) for w in wanted]
    starts = fit(profiles, occupied)
    assert (starts is not None) == fits
    if starts is not None:
        assert len(starts) == len(profiles)
        spans = [(s, s + p.size) for s, p in zip(starts, profiles)] + [(a, a + n) for a, n in occupied]
        for i, (a, b) in enumerate(spans):
            assert all(b <= c or d <= a for c, d in spans[i + 1 :])


# ------------------------------------------------------------------ real drivers' outputs

REAL = Path(__file__).parents[1] / "fixtures" / "vgpu"


def test_a_real_h200s_outputs(tmp_path) -> None:
    outputs = {p.name: p.read_text() for p in (REAL / "h200-mig-disabled").iterdir() if p.name in COMMANDS}
    gpu = parse_mig(outputs).gpus["0000:00:06.0"]
    assert (gpu.index, gpu.mode_current, gpu.mode_pending, gpu.instances) == (0, "disabled", "disabled", [])
    assert sorted(gpu.profiles) == ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]
    big = gpu.profiles["7g.141gb"]
    assert (big.profile_id, big.total, big.placements, big.size) == (0, 1, [0], 8)
    assert gpu.profiles["1g.35gb"].placements == [0, 2, 4, 6]


def test_a_real_h100s_outputs_with_a_header_and_a_name_column() -> None:
    # Captured by hand with `--query-gpu=index,name,pci.bus_id,...` and "rc=N" lines appended.
    d = REAL / "h100-mig-disabled"
    outputs = {
        k: (d / f).read_text()
        for k, f in (
            ("query", "mig-mode.csv"),
            ("lgip", "mig-lgip.txt"),
            ("lgipp", "mig-lgipp.txt"),
            ("lgi", "mig-lgi.txt"),
            ("lci", "mig-lci.txt"),
        )
    }
    gpu = parse_mig(outputs).gpus["0000:00:06.0"]
    assert gpu.mode_current == "disabled" and gpu.instances == []
    assert [(p.name, p.profile_id, p.total, p.size) for p in gpu.profiles.values()] == [
        ("1g.10gb", 19, 7, 1),
        ("1g.10gb+me", 20, 1, 1),
        ("1g.20gb", 15, 4, 2),
        ("2g.20gb", 14, 3, 2),
        ("3g.40gb", 9, 2, 4),
        ("4g.40gb", 5, 1, 4),
        ("7g.80gb", 0, 1, 8),
    ]


def test_the_molecule_tarball_is_the_synthetic_host(tmp_path) -> None:
    """molecule/vgpu_host lays out tests/fixtures/vgpu/nvidia-vgpu-host.tar.gz: it must not drift from the builder
    (rebuild with `python -m tests.vgpuhosts`)."""
    from gpuprov.cli.rootfs import unpack
    from tests.conftest import tree_digest

    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    unpack(str(vh.TARBALL), str(unpacked))
    built = tmp_path / "built"
    vh.build(built).finish()
    assert tree_digest(unpacked) == tree_digest(built)
