"""mig-parted's and vgpu-device-manager's config files read as gpuprov layouts
(gpuprov/model/formats.py, docs/reference/formats.md).

The examples are modelled on NVIDIA/mig-parted's examples/config.yaml and the GPU
Operator's default config (device-filter lists), and on NVIDIA/vgpu-device-manager's
examples/config-example.yaml. The hostile table: wrong types, huge counts, booleans as
counts, nested junk, and lists and mappings of a million entries that must be refused by
their length before anything iterates them."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuprov.model.formats import (
    MAX_CONFIGS,
    MAX_ENTRIES,
    is_mig_parted,
    is_vgpu_device_manager,
    layouts_from_mig_parted,
    layouts_from_vgpu_device_manager,
)

GPU_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")  # the host model's rule for a GPU entry's name

MIG_PARTED_EXAMPLE = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false

  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}

  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7

  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "3g.40gb": 1

  custom-config:
    - devices: [0,1,2,3]
      mig-enabled: false
    - devices: [4]
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
    - devices: [5]
      mig-enabled: true
      mig-devices:
        "2g.20gb": 3
    - devices: [6]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
    - devices: [7]
      mig-enabled: true
      mig-devices:
        "1g.10gb+me": 1
        "2c.2g.20gb": 1
"""

# The GPU Operator's default config: one config for a mixed fleet, by device id.
MIG_PARTED_FILTERS = """
version: v1
mig-configs:
  all-1g.10gb:
    # H100-80GB, A100-80GB
    - device-filter: ["0x233010DE", "0x20B210DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
    # A100-40GB
    - device-filter: "0x20B010DE"
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 4
"""

VGPU_DM_EXAMPLE = """
version: v1
vgpu-configs:
  A100-4C:
    - devices: all
      vgpu-devices:
        A100-4C: 10
  A100-1-5C:
    - devices: all
      vgpu-devices:
        A100-1-5C: 7
  A10-24Q:
    - devices: all
      vgpu-devices:
        A10-24Q: 1
  custom:
    - devices: [0, 1]
      vgpu-devices:
        A100-4C: 10
    - devices: [2]
      vgpu-devices:
        A100-8C: 4
        A100-4C: 2
    - devices: [3]
      vgpu-devices: {}
  by-model:
    - device-filter: "0x20B510DE"
      devices: all
      vgpu-devices:
        A100D-8C: 10
"""


def _mig(**fields: Any) -> dict[str, Any]:
    return {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}} | fields


def _vgpu(**fields: Any) -> dict[str, Any]:
    return {"devices": "all", "vgpu-devices": {"A100-4C": 10}} | fields


def _mig_doc(*entries: Any, name: Any = "cfg") -> dict[str, Any]:
    return {"version": "v1", "mig-configs": {name: list(entries)}}


def _vgpu_doc(*entries: Any, name: Any = "cfg") -> dict[str, Any]:
    return {"version": "v1", "vgpu-configs": {name: list(entries)}}


class NeverIterated(list):  # type: ignore[type-arg]
    """A list that claims a million entries and fails the test if anything iterates it."""

    def __len__(self) -> int:
        return 10**6

    def __iter__(self) -> Any:
        raise AssertionError("iterated a list longer than its bound")

    def __getitem__(self, i: Any) -> Any:
        raise AssertionError("indexed a list longer than its bound")


class NeverIteratedMap(dict):  # type: ignore[type-arg]
    """A mapping that claims a million keys and fails the test if anything iterates it."""

    def __len__(self) -> int:
        return 10**6

    def __iter__(self) -> Any:
        raise AssertionError("iterated a mapping larger than its bound")

    def items(self) -> Any:
        raise AssertionError("iterated a mapping larger than its bound")

    def keys(self) -> Any:
        raise AssertionError("iterated a mapping larger than its bound")


def _names_ok(layouts: dict[str, dict[str, Any]]) -> None:
    for layout in layouts.values():
        names = [gpu["name"] for gpu in layout["gpus"]]
        assert len(set(names)) == len(names), names
        assert all(GPU_NAME.match(n) for n in names), names


# ---------------------------------------------------------------- recognising the formats


def test_recognises_each_format_and_nothing_else() -> None:
    mig, vgpu = yaml.safe_load(MIG_PARTED_EXAMPLE), yaml.safe_load(VGPU_DM_EXAMPLE)
    assert is_mig_parted(mig) and not is_vgpu_device_manager(mig)
    assert is_vgpu_device_manager(vgpu) and not is_mig_parted(vgpu)
    for other in (
        None,
        [],
        "version: v1",
        {"gpuprov_host": {"gpus": []}},
        {"version": "v2", "mig-configs": {}},
        {"version": 1, "vgpu-configs": {}},
        {"mig-configs": {}},
        NeverIteratedMap(),
    ):
        assert not is_mig_parted(other) and not is_vgpu_device_manager(other)


# ---------------------------------------------------------------- mig-parted


def test_mig_parted_example() -> None:
    layouts, refusals = layouts_from_mig_parted(yaml.safe_load(MIG_PARTED_EXAMPLE))
    assert refusals == []
    assert list(layouts) == ["all-disabled", "all-enabled", "all-1g.10gb", "all-balanced", "custom-config"]
    assert layouts["all-disabled"] == {"gpus": [{"name": "host-all", "select": "all", "use": "host"}]}
    assert layouts["all-enabled"] == {"gpus": [{"name": "mig-all", "select": "all", "use": "mig", "mig": {}}]}
    assert layouts["all-1g.10gb"]["gpus"] == [{"name": "mig-all", "select": "all", "use": "mig", "mig": {"1g.10gb": 7}}]
    assert layouts["all-balanced"]["gpus"][0]["mig"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert layouts["custom-config"]["gpus"] == [
        {"name": "host-0", "select": {"index": 0}, "use": "host"},
        {"name": "host-1", "select": {"index": 1}, "use": "host"},
        {"name": "host-2", "select": {"index": 2}, "use": "host"},
        {"name": "host-3", "select": {"index": 3}, "use": "host"},
        {"name": "mig-4", "select": {"index": 4}, "use": "mig", "mig": {"1g.10gb": 7}},
        {"name": "mig-5", "select": {"index": 5}, "use": "mig", "mig": {"2g.20gb": 3}},
        {"name": "mig-6", "select": {"index": 6}, "use": "mig", "mig": {"3g.40gb": 2}},
        # "2c.2g.20gb" (a compute instance over the whole GPU instance) is the profile 2g.20gb
        {"name": "mig-7", "select": {"index": 7}, "use": "mig", "mig": {"1g.10gb+me": 1, "2g.20gb": 1}},
    ]
    _names_ok(layouts)


def test_mig_parted_device_filters_select_by_vendor_device() -> None:
    layouts, refusals = layouts_from_mig_parted(yaml.safe_load(MIG_PARTED_FILTERS))
    assert refusals == []
    assert layouts == {
        "all-1g.10gb": {
            "gpus": [
                {"name": "mig-all-10de-2330", "select": "10de:2330", "use": "mig", "mig": {"1g.10gb": 7}},
                {"name": "mig-all-10de-20b2", "select": "10de:20b2", "use": "mig", "mig": {"1g.10gb": 7}},
                {"name": "mig-all-10de-20b0", "select": "10de:20b0", "use": "mig", "mig": {"1g.10gb": 4}},
            ]
        }
    }
    _names_ok(layouts)


def test_mig_parted_empty_filter_is_no_filter() -> None:
    for empty in ("", []):
        layouts, refusals = layouts_from_mig_parted(_mig_doc(_mig(**{"device-filter": empty})))
        assert refusals == [] and layouts["cfg"]["gpus"][0]["select"] == "all"


def test_entries_are_copies() -> None:
    """Two GPUs of one entry never share a mapping: the caller may edit one."""
    layouts, _ = layouts_from_mig_parted(_mig_doc(_mig(devices=[0, 1])))
    first, second = layouts["cfg"]["gpus"]
    assert first["mig"] == second["mig"] and first["mig"] is not second["mig"]


# ---------------------------------------------------------------- vgpu-device-manager


def test_vgpu_device_manager_example() -> None:
    layouts, refusals = layouts_from_vgpu_device_manager(yaml.safe_load(VGPU_DM_EXAMPLE))
    assert refusals == []
    assert layouts["A100-4C"] == {
        "gpus": [{"name": "vgpu-all", "select": "all", "use": "mdev", "instances": {"A100-4C": 10}}]
    }
    assert layouts["A100-1-5C"]["gpus"][0]["instances"] == {"A100-1-5C": 7}
    assert layouts["A10-24Q"]["gpus"][0]["instances"] == {"A10-24Q": 1}
    assert layouts["custom"]["gpus"] == [
        {"name": "vgpu-0", "select": {"index": 0}, "use": "mdev", "instances": {"A100-4C": 10}},
        {"name": "vgpu-1", "select": {"index": 1}, "use": "mdev", "instances": {"A100-4C": 10}},
        {"name": "vgpu-2", "select": {"index": 2}, "use": "mdev", "instances": {"A100-8C": 4, "A100-4C": 2}},
        {"name": "vgpu-3", "select": {"index": 3}, "use": "mdev", "instances": {}},
    ]
    assert layouts["by-model"]["gpus"] == [
        {"name": "vgpu-all-10de-20b5", "select": "10de:20b5", "use": "mdev", "instances": {"A100D-8C": 10}}
    ]
    _names_ok(layouts)


def test_vgpu_device_manager_on_sriov_gpus() -> None:
    layouts, refusals = layouts_from_vgpu_device_manager(yaml.safe_load(VGPU_DM_EXAMPLE), use="sriov_vgpu")
    assert refusals == []
    assert {gpu["use"] for layout in layouts.values() for gpu in layout["gpus"]} == {"sriov_vgpu"}
    with pytest.raises(ValueError, match="use must be one of"):
        layouts_from_vgpu_device_manager(yaml.safe_load(VGPU_DM_EXAMPLE), use="passthrough")


# ---------------------------------------------------------------- hostile files

BIG = 10**6
HOSTILE_MIG: list[tuple[str, Any, str]] = [
    # (id, document, a fragment of the refusal that names the field)
    ("null", None, "(the file): must be a mapping"),
    ("list", [1, 2], "(the file): must be a mapping"),
    ("string", "version: v1", "(the file): must be a mapping"),
    ("no version", {"mig-configs": {"a": [_mig()]}}, "version: must be v1, not null"),
    ("version v2", {"version": "v2", "mig-configs": {"a": [_mig()]}}, "version: must be v1"),
    ("version number", {"version": 1, "mig-configs": {"a": [_mig()]}}, "version: must be v1, not the number 1"),
    ("no configs", {"version": "v1"}, "has no mig-configs"),
    ("unknown top key", {"version": "v1", "mig-configs": {"a": [_mig()]}, "x": 1}, "unknown keys x"),
    ("top million keys", NeverIteratedMap(), "(the file): has 1000000 keys"),
    ("configs a list", {"version": "v1", "mig-configs": [_mig()]}, "mig-configs: must be a mapping"),
    ("configs empty", {"version": "v1", "mig-configs": {}}, "mig-configs: is empty"),
    ("configs million", {"version": "v1", "mig-configs": NeverIteratedMap()}, "mig-configs: has 1000000 keys"),
    (
        "too many configs",
        {"version": "v1", "mig-configs": {f"c{i}": [_mig()] for i in range(MAX_CONFIGS + 1)}},
        f"more than {MAX_CONFIGS}",
    ),
    ("config name number", _mig_doc(_mig(), name=7), "mig-configs[7]: must be a string"),
    ("config name slash", _mig_doc(_mig(), name="a/b"), "is not a valid config name"),
    ("config name control", _mig_doc(_mig(), name="a\x1b[2J"), "non-printable"),
    ("config name long", _mig_doc(_mig(), name="a" * 64), "64 characters long"),
    ("config name jinja", _mig_doc(_mig(), name="{{ evil }}"), "is a Jinja template"),
    ("config a mapping", {"version": "v1", "mig-configs": {"a": _mig()}}, "mig-configs.a: must be a list"),
    ("config empty", {"version": "v1", "mig-configs": {"a": []}}, "mig-configs.a: has no entries"),
    ("config million", {"version": "v1", "mig-configs": {"a": NeverIterated()}}, "mig-configs.a: has 1000000"),
    ("entry a string", _mig_doc("devices: all"), "cfg[0]: must be a mapping"),
    ("entry nested junk", _mig_doc([[[[{"devices": "all"}]]]]), "cfg[0]: must be a mapping"),
    ("entry unknown key", _mig_doc(_mig(evil=1)), "cfg[0]: unknown keys evil"),
    ("entry million keys", _mig_doc(NeverIteratedMap()), "cfg[0]: has 1000000 keys"),
    ("entry no devices", _mig_doc({"mig-enabled": False}), "cfg[0]: has no devices"),
    ("entry no mig-enabled", _mig_doc({"devices": "all"}), "cfg[0]: has no mig-enabled"),
    ("devices ALL", _mig_doc(_mig(devices="ALL")), "devices: must be all or a list of indices, not the string"),
    ("devices number", _mig_doc(_mig(devices=0)), "devices: must be all or a list"),
    ("devices mapping", _mig_doc(_mig(devices={"all": True})), "devices: must be all or a list"),
    ("devices empty", _mig_doc(_mig(devices=[])), "devices: is an empty list"),
    ("devices million", _mig_doc(_mig(devices=NeverIterated())), "devices: has 1000000 entries"),
    ("index negative", _mig_doc(_mig(devices=[-1])), "devices[0]: -1 is out of range"),
    ("index huge", _mig_doc(_mig(devices=[10**100])), "devices[0]: 1000000000"),
    ("index bool", _mig_doc(_mig(devices=[True])), "devices[0]: must be a whole number, not the boolean true"),
    ("index float", _mig_doc(_mig(devices=[1.0])), "devices[0]: must be a whole number, not the number 1.0"),
    ("index string", _mig_doc(_mig(devices=["0"])), "devices[0]: must be a whole number"),
    ("index twice", _mig_doc(_mig(devices=[1, 1])), "takes GPU 1, which an earlier entry"),
    ("all twice", _mig_doc(_mig(), _mig()), "cfg[1]: takes all GPUs"),
    ("all then index", _mig_doc(_mig(), _mig(devices=[3])), "cfg[1]: takes GPU 3"),
    (
        "filter then all",
        _mig_doc(_mig(**{"device-filter": "0x20B010DE"}), _mig()),
        "cfg[1]: takes all GPUs",
    ),
    (
        "filter twice",
        _mig_doc(_mig(**{"device-filter": ["0x20B010DE", "0x20b010de"]})),
        "takes every 10de:20b0 GPU",
    ),
    (
        "filter with indices",
        _mig_doc(_mig(devices=[0], **{"device-filter": "0x20B010DE"})),
        "gives both device-filter and a list of devices",
    ),
    (
        "filter read as a number",
        _mig_doc(_mig(**{"device-filter": 0x20B010DE})),
        "device-filter: must be a string, not the number 548409566 (YAML read it as a number: quote it)",
    ),
    ("filter subsystem", _mig_doc(_mig(**{"device-filter": "0x20B010DE:0x145F10DE"})), "names a subsystem"),
    ("filter not hex", _mig_doc(_mig(**{"device-filter": "0xZZZZ10DE"})), "is not a device id"),
    ("filter short", _mig_doc(_mig(**{"device-filter": "20B010DE"})), "is not a device id"),
    ("filter amd", _mig_doc(_mig(**{"device-filter": "0x740F1002"})), "is vendor 1002, not NVIDIA"),
    ("filter mapping", _mig_doc(_mig(**{"device-filter": {"a": 1}})), "device-filter: must be a string, not a mapping"),
    ("filter million", _mig_doc(_mig(**{"device-filter": NeverIterated()})), "device-filter: has 1000000"),
    ("filter list junk", _mig_doc(_mig(**{"device-filter": [["0x20B010DE"]]})), "device-filter[0]: must be a string"),
    ("enabled string", _mig_doc(_mig(**{"mig-enabled": "true"})), "mig-enabled: must be a boolean"),
    ("enabled number", _mig_doc(_mig(**{"mig-enabled": 1})), "mig-enabled: must be true or false"),
    ("enabled, no devices", _mig_doc({"devices": "all", "mig-enabled": True}), "mig-devices: is missing"),
    (
        "disabled with devices",
        _mig_doc({"devices": "all", "mig-enabled": False, "mig-devices": {"1g.10gb": 1}}),
        "mig-devices: is given but mig-enabled is false",
    ),
    (
        "disabled, million devices",
        _mig_doc({"devices": "all", "mig-enabled": False, "mig-devices": NeverIteratedMap()}),
        "mig-devices: is given but mig-enabled is false",
    ),
    ("mig-devices a list", _mig_doc(_mig(**{"mig-devices": ["1g.10gb"]})), "mig-devices: must be a mapping"),
    ("mig-devices million", _mig_doc(_mig(**{"mig-devices": NeverIteratedMap()})), "mig-devices: has 1000000 keys"),
    ("count 8", _mig_doc(_mig(**{"mig-devices": {"1g.10gb": 8}})), "mig-devices['1g.10gb']: 8 is out of range"),
    ("count negative", _mig_doc(_mig(**{"mig-devices": {"1g.10gb": -1}})), "-1 is out of range"),
    ("count huge", _mig_doc(_mig(**{"mig-devices": {"1g.10gb": 10**18}})), "is out of range"),
    ("count bool", _mig_doc(_mig(**{"mig-devices": {"1g.10gb": True}})), "must be a whole number, not the boolean"),
    ("count float", _mig_doc(_mig(**{"mig-devices": {"1g.10gb": 1.5}})), "must be a whole number, not the number"),
    ("count string", _mig_doc(_mig(**{"mig-devices": {"1g.10gb": "7"}})), "not the string '7'"),
    ("count nested", _mig_doc(_mig(**{"mig-devices": {"1g.10gb": {"a": [1]}}})), "not a mapping"),
    ("profile junk", _mig_doc(_mig(**{"mig-devices": {"bogus": 1}})), "mig-devices['bogus']: is not a MIG profile"),
    ("profile number", _mig_doc(_mig(**{"mig-devices": {19: 1}})), "mig-devices[19]: must be a string"),
    ("profile path", _mig_doc(_mig(**{"mig-devices": {"../1g.10gb": 1}})), "is not a MIG profile"),
    ("profile CI", _mig_doc(_mig(**{"mig-devices": {"1c.2g.20gb": 1}})), "is a compute-instance profile"),
    (
        "profile twice",
        _mig_doc(_mig(**{"mig-devices": {"2g.20gb": 1, "2c.2g.20gb": 1}})),
        "repeats the profile 2g.20gb",
    ),
    (
        "too many entries",
        {"version": "v1", "mig-configs": {f"c{i}": [_mig(devices=list(range(1024)))] for i in range(65)}},
        f"more than {MAX_ENTRIES} GPU entries",
    ),
]

HOSTILE_VGPU: list[tuple[str, Any, str]] = [
    ("null", None, "(the file): must be a mapping"),
    ("mig keys", {"version": "v1", "mig-configs": {"a": [_mig()]}}, "has no vgpu-configs"),
    ("entry no vgpu-devices", _vgpu_doc({"devices": "all"}), "cfg[0]: has no vgpu-devices"),
    ("entry mig key", _vgpu_doc(_vgpu(**{"mig-enabled": True})), "unknown keys mig-enabled"),
    ("vgpu-devices a list", _vgpu_doc(_vgpu(**{"vgpu-devices": ["A100-4C"]})), "vgpu-devices: must be a mapping"),
    ("vgpu-devices million", _vgpu_doc(_vgpu(**{"vgpu-devices": NeverIteratedMap()})), "has 1000000 keys"),
    ("count 257", _vgpu_doc(_vgpu(**{"vgpu-devices": {"A100-4C": 257}})), "257 is out of range"),
    ("count bool", _vgpu_doc(_vgpu(**{"vgpu-devices": {"A100-4C": False}})), "not the boolean false"),
    ("count huge", _vgpu_doc(_vgpu(**{"vgpu-devices": {"A100-4C": 2**64}})), "is out of range"),
    ("count nested", _vgpu_doc(_vgpu(**{"vgpu-devices": {"A100-4C": [[10]]}})), "must be a whole number, not a list"),
    (
        "sum too big",
        _vgpu_doc(_vgpu(**{"vgpu-devices": {"A100-4C": 200, "A100-8C": 100}})),
        "asks 300 vGPUs of one GPU",
    ),
    ("type sysfs", _vgpu_doc(_vgpu(**{"vgpu-devices": {"nvidia-259": 1}})), "is not a vGPU type name"),
    ("type prefixed", _vgpu_doc(_vgpu(**{"vgpu-devices": {"GRID A100-4C": 1}})), "is not a vGPU type name"),
    ("type number", _vgpu_doc(_vgpu(**{"vgpu-devices": {557: 1}})), "vgpu-devices[557]: must be a string"),
    (
        "mixed kinds",
        _vgpu_doc(_vgpu(**{"vgpu-devices": {"A100-4C": 1, "A100-1-5C": 1}})),
        "mixes time-sliced and MIG-backed",
    ),
    ("index twice", _vgpu_doc(_vgpu(devices=[0]), _vgpu(devices=[0])), "cfg[1]: takes GPU 0"),
    ("filter with index", _vgpu_doc(_vgpu(devices=[0], **{"device-filter": "0x20B510DE"})), "gives both"),
]


def _check_refused(refusals: list[Any], layouts: dict[str, Any], fragment: str, started: float) -> None:
    assert layouts == {}, "a refused file gives no layouts"
    assert refusals, "refused nothing"
    messages = [r.message for r in refusals]
    assert any(fragment in m for m in messages), messages
    assert all(r.fix for r in refusals), [r for r in refusals if not r.fix]
    assert all(len(m) < 1000 for m in messages), "a message repeats a huge value"
    # CPU time, not wall time: a loaded CI machine stretches the wall clock, not the work done
    # (nothing here waits: the parsers take Python values).
    assert time.process_time() - started < 5


@pytest.mark.parametrize(("doc", "fragment"), [c[1:] for c in HOSTILE_MIG], ids=[c[0] for c in HOSTILE_MIG])
def test_hostile_mig_parted_file_is_refused_naming_the_field(doc: Any, fragment: str) -> None:
    started = time.process_time()
    layouts, refusals = layouts_from_mig_parted(doc)
    _check_refused(refusals, layouts, fragment, started)


@pytest.mark.parametrize(("doc", "fragment"), [c[1:] for c in HOSTILE_VGPU], ids=[c[0] for c in HOSTILE_VGPU])
def test_hostile_vgpu_device_manager_file_is_refused_naming_the_field(doc: Any, fragment: str) -> None:
    started = time.process_time()
    layouts, refusals = layouts_from_vgpu_device_manager(doc)
    _check_refused(refusals, layouts, fragment, started)


def test_refusals_name_the_config() -> None:
    """A file of several configs: the refusal says which one, and every problem is told at once."""
    doc = yaml.safe_load(MIG_PARTED_EXAMPLE)
    doc["mig-configs"]["all-balanced"][0]["mig-devices"]["3g.40gb"] = 9
    doc["mig-configs"]["custom-config"][1]["devices"] = [4, "five"]
    layouts, refusals = layouts_from_mig_parted(doc)
    assert layouts == {}
    assert [r.message.split(":")[0] for r in refusals] == [
        "mig-configs.all-balanced[0].mig-devices['3g.40gb']",
        "mig-configs.custom-config[1].devices[1]",
    ]


def test_hostile_yaml_text_through_safe_load() -> None:
    """The forms a person writes by mistake, as YAML reads them."""
    text = """
version: v1
mig-configs:
  a:
    - devices: all
      device-filter: 0x20B010DE
      mig-enabled: "true"
      mig-devices:
        1g.10gb: yes
"""
    layouts, refusals = layouts_from_mig_parted(yaml.safe_load(text))
    messages = " | ".join(r.message for r in refusals)
    assert layouts == {}
    assert "device-filter: must be a string" in messages
    assert "mig-enabled: must be a boolean" in messages
    assert "must be a whole number, not the boolean true" in messages


def test_the_reference_page_example_is_what_the_code_makes() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "formats.md").read_text(encoding="utf-8")
    source, expected = (yaml.safe_load(block) for block in re.findall(r"^```yaml\n(.*?)^```", page, re.M | re.S))
    layouts, refusals = layouts_from_mig_parted(source)
    assert refusals == []
    assert layouts == expected["gpuprov_layouts"]


def test_a_repeated_index_list_is_told_once_per_entry() -> None:
    indices = list(range(1024))
    layouts, refusals = layouts_from_mig_parted(_mig_doc(*[_mig(devices=indices) for _ in range(60)]))
    assert layouts == {}
    assert len(refusals) == 59
    assert refusals[0].message.startswith("mig-configs.cfg[1]: takes GPU 0, which an earlier entry")
