"""gpuprov fleet: a held-out fleet of staged roots built from the captures (tests/fleethosts.py), some
changed (a GPU moved to another slot, a driver unbound, an mdev removed, a GPU off the bus, Xids,
a failed reset and fatal AER errors in the kernel log), run through ansible-playbook with local
connections, plus a host that cannot be reached: each change is reported as the right finding on
the right host, nothing on the unchanged ones, the unreachable host listed; the document matches
its schema, the metrics are Prometheus text, the page escapes what hosts say."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import gpuprov
from gpuprov.cli import fleet as cli_fleet
from gpuprov.cli.fleet_html import render_html
from gpuprov.report.fleet import fleet_document, prometheus_text, unanswered
from tests import fleethosts
from tests.conftest import REPO, collections_path

SCHEMA = json.loads((Path(gpuprov.__file__).parent / "schemas" / "fleet.v1.json").read_text())
UNREACHABLE = "far-away"
ENTRY = "gpuprov_host.gpus[0] 'gpu'"

# What the report must say of each host: status, drift codes, not-ready codes.
EXPECTED: dict[str, tuple[str, list[str], list[str]]] = {
    "pt-ok": ("converged", [], []),
    "pt-moved": ("drifted", ["gpu-missing"], []),
    "pt-unbound": ("drifted", ["driver"], []),
    "mdev-ok": ("converged", [], []),
    "mdev-gone": ("drifted", ["mdev-missing"], []),
    "h100-ok": ("converged", [], []),
    "h100-off-bus": ("not ready", [], ["health:off-the-bus"]),
    "h100-log": ("not ready", [], ["health:aer-fatal", "health:reset-failed", "health:xid-hardware"]),
    UNREACHABLE: ("unreachable", [], []),
}


def run_fleet(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections_path()), PYTHONPATH=str(REPO), ANSIBLE_LOCALHOST_WARNING="0")
    return subprocess.run(
        [sys.executable, "-m", "gpuprov", "fleet", *extra],
        cwd=tmp,  # not the checkout: its ansible.cfg is not what a user has
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("fleet")
    hosts = fleethosts.stage_fleet(tmp / "roots")
    # Refused at once: nothing listens on port 1.
    hosts[UNREACHABLE] = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 1}
    inventory = tmp / "inventory.yml"
    inventory.write_text(json.dumps({"all": {"hosts": hosts}}))
    page, metrics = tmp / "fleet.html", tmp / "fleet.prom"
    proc = run_fleet(tmp, "-i", str(inventory), "-f", "4", "--json", "--html", str(page), "--prom", str(metrics))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    document = json.loads(proc.stdout)
    return {"document": document, "page": page.read_text(), "metrics": metrics.read_text(), "tmp": tmp}


def by_host(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in document["hosts"]}


def test_every_host_is_listed_and_matches_the_schema(fleet: dict[str, Any]) -> None:
    document = fleet["document"]
    jsonschema.validate(document, SCHEMA)
    assert sorted(by_host(document)) == sorted(EXPECTED)
    assert document["forks"] == 4
    s = document["summary"]
    assert (s["hosts"], s["converged"], s["drifted"], s["not_ready"], s["unreachable"], s["failed"]) == (
        9,
        3,
        3,
        2,
        1,
        0,
    )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_change_is_reported_on_its_host_and_nothing_else(fleet: dict[str, Any], name: str) -> None:
    host = by_host(fleet["document"])[name]
    status, drift, not_ready = EXPECTED[name]
    assert host["status"] == status, host
    assert sorted(d["code"] for d in host["drift"]) == drift, host["drift"]
    assert sorted(r["code"] for r in host["not_ready"]) == not_ready, host["not_ready"]
    if status == "converged":
        assert all(g["health"]["status"] == "ok" for g in host["gpus"]), host["gpus"]
        assert all(g["ready"] for g in host["gpus"])


def test_the_moved_gpu_names_its_entry_and_where_it_went(fleet: dict[str, Any]) -> None:
    (d,) = by_host(fleet["document"])["pt-moved"]["drift"]
    assert d["entry"] == ENTRY and d["device"] == fleethosts.EDU
    assert fleethosts.MOVED_TO in d["message"] and "1234:11e8" in d["message"]


def test_the_unbound_driver_and_the_missing_mdev_name_their_entries(fleet: dict[str, Any]) -> None:
    hosts = by_host(fleet["document"])
    (d,) = hosts["pt-unbound"]["drift"]
    assert (d["entry"], d["device"]) == (ENTRY, fleethosts.EDU)
    assert "passthrough" in d["message"] and "vfio-pci" in d["message"] and "no driver" in d["message"]
    (gpu,) = hosts["pt-unbound"]["gpus"]
    assert gpu["driver"] is None and gpu["use"] == "passthrough"
    (d,) = hosts["mdev-gone"]["drift"]
    assert d["entry"] == "gpuprov_host.gpus[0] 'serial'" and fleethosts.MTTY_UUID in d["message"]


def test_a_gpu_off_the_bus_and_a_bad_kernel_log_are_its_health(fleet: dict[str, Any]) -> None:
    hosts = by_host(fleet["document"])
    (gpu,) = hosts["h100-off-bus"]["gpus"]
    assert gpu["address"] == fleethosts.H100 and gpu["health"]["config"] == "all-ones"
    assert gpu["health"]["status"] == "fail" and gpu["use"] == "host"
    (gpu,) = hosts["h100-log"]["gpus"]
    h = gpu["health"]
    assert [e["xid"] for e in h["xids"]] == [79]
    assert [r["what"] for r in h["resets"]] == ["FLR"]
    assert h["aer"] == {"correctable": 0, "nonfatal": 0, "fatal": 2} and h["aer_errors"] == {
        "fatal": {"SurpriseDown": 2}
    }
    assert hosts["h100-log"]["health"]["log_source"] == "/var/log/kern.log"
    # ECC and remapped rows from the capture's nvidia-smi -q -x (no NVML below a staged root)
    assert h["ecc"] == {
        "volatile_corrected": 0,
        "volatile_uncorrected": 0,
        "aggregate_corrected": 0,
        "aggregate_uncorrected": 0,
    }
    assert h["remapped_rows"] == {"corrected": 0, "uncorrected": 0, "pending": False, "failure": False}


def test_the_unreachable_host_says_why(fleet: dict[str, Any]) -> None:
    host = by_host(fleet["document"])[UNREACHABLE]
    assert host["status"] == "unreachable" and "port 1" in host["message"]


SAMPLE = re.compile(r'^([a-z_]+)\{((?:[a-z_]+="(?:[^"\\\n]|\\[\\"n])*",?)*)\} (-?[0-9]+(?:\.[0-9]+)?)$')


def parse_prometheus(text: str) -> dict[str, dict[str, Any]]:
    """metric -> {"help", "type", "samples": [(labels dict, value)]}; every sample after its HELP and TYPE."""
    metrics: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _sep, text_ = line[7:].partition(" ")
            metrics[name] = {"help": text_, "type": None, "samples": []}
        elif line.startswith("# TYPE "):
            name, _sep, kind = line[7:].partition(" ")
            assert name in metrics and kind in ("gauge", "counter"), line
            metrics[name]["type"] = kind
        else:
            m = SAMPLE.match(line)
            assert m, f"not a Prometheus sample: {line!r}"
            assert metrics.get(m.group(1), {}).get("type"), f"{m.group(1)} has no HELP/TYPE before it"
            labels = dict(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', m.group(2)))
            metrics[m.group(1)]["samples"].append((labels, float(m.group(3))))
    return metrics


def test_the_metrics_are_prometheus_text_of_the_same(fleet: dict[str, Any]) -> None:
    metrics = parse_prometheus(fleet["metrics"])
    status = {s[0]["host"]: s[0]["status"] for s in metrics["gpuprov_fleet_host_status"]["samples"] if s[1] == 1}
    assert status == {name: want[0] for name, want in EXPECTED.items()}
    off = {(s[0]["host"], s[0]["gpu"]): s[1] for s in metrics["gpuprov_gpu_config_all_ones"]["samples"]}
    assert off[("h100-off-bus", fleethosts.H100)] == 1 and off[("h100-ok", fleethosts.H100)] == 0
    xids = metrics["gpuprov_gpu_xid_events"]["samples"]
    assert xids == [({"host": "h100-log", "gpu": fleethosts.H100, "xid": "79"}, 1.0)]
    aer = {(s[0]["host"], s[0]["severity"]): s[1] for s in metrics["gpuprov_gpu_aer_errors"]["samples"]}
    assert aer[("h100-log", "fatal")] == 2
    resets = {s[0]["host"]: s[1] for s in metrics["gpuprov_gpu_reset_failures"]["samples"]}
    assert resets == {"h100-log": 1}  # only where a kernel log was read
    ecc = [s for s in metrics["gpuprov_gpu_ecc_errors"]["samples"] if s[0]["host"] == "h100-ok"]
    assert {(s[0]["counter"], s[0]["type"]) for s in ecc} == {
        ("volatile", "corrected"),
        ("volatile", "uncorrected"),
        ("aggregate", "corrected"),
        ("aggregate", "uncorrected"),
    }


def test_the_page_lists_every_host_with_its_status(fleet: dict[str, Any]) -> None:
    page = fleet["page"]
    for name, (status, _drift, _not_ready) in EXPECTED.items():
        assert f'{name}</a></td><td><span class="badge"' in page and f">{status}</span>" in page
    assert "<script" not in page


def test_the_summary_names_each_host_and_why(fleet: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    cli_fleet.print_summary(fleet["document"])
    out = capsys.readouterr().out
    assert out.startswith("9 host(s): 3 converged, 3 drifted, 0 unknown, 2 not ready, 1 unreachable, 0 failed")
    assert "pt-moved: drifted\n" in out  # a host without a GPU to show: no count
    assert f"drift: declared at {fleethosts.EDU}, but there is no device there" in out
    assert "not ready: its PCI config space reads all ones" in out


# ---------------------------------------------------------------- without ansible


def test_records_keep_failed_and_silent_hosts() -> None:
    output = {
        "plays": [
            {
                "tasks": [
                    {
                        "hosts": {
                            "ok": {"action": "gpuprov.kvm.gpu_fleet_facts", "fleet": {"status": "converged"}},
                            "broken": {
                                "failed": True,
                                "msg": "MODULE FAILURE",
                                "module_stderr": "line\n/usr/bin/python3: not found",
                            },
                            "gone": {"unreachable": True, "msg": "Failed to connect"},
                        }
                    }
                ]
            }
        ],
        "stats": {"ok": {}, "broken": {"failures": 1}, "gone": {"unreachable": 1}, "silent": {"unreachable": 1}},
    }
    got = cli_fleet.records(output)
    assert got["ok"] == {"status": "converged"}
    assert (
        got["broken"]["status"] == "failed"
        and got["broken"]["message"] == "MODULE FAILURE: /usr/bin/python3: not found"
    )
    assert (got["gone"]["status"], got["gone"]["message"]) == ("unreachable", "Failed to connect")
    assert got["silent"]["status"] == "unreachable"


def test_the_json_callback_output_is_found_after_other_text() -> None:
    text = 'something {not json\n{"plays": [], "stats": {"a": {}}}\n'
    assert cli_fleet.parse_output(text) == {"plays": [], "stats": {"a": {}}}
    with pytest.raises(ValueError):
        cli_fleet.parse_output("ERROR! the playbook could not be found")


def test_require_converged_exits_3_naming_the_hosts(fleet: dict[str, Any]) -> None:
    inventory = fleet["tmp"] / "inventory.yml"
    proc = run_fleet(fleet["tmp"], "-i", str(inventory), "-l", "pt-ok,mdev-ok", "--require-converged")
    assert proc.returncode == 0, proc.stderr
    proc = run_fleet(fleet["tmp"], "-i", str(inventory), "-l", "pt-ok,pt-moved", "--require-converged")
    assert proc.returncode == 3 and "gpuprov: not converged: pt-moved (drifted)" in proc.stderr


def test_bad_forks_and_a_missing_inventory_are_usage_errors(tmp_path: Path) -> None:
    from gpuprov.cli.main import main

    assert main(["fleet", "-i", str(tmp_path / "nope.yml")]) == 2
    (tmp_path / "inv.yml").write_text("all: {}\n")
    assert main(["fleet", "-i", str(tmp_path / "inv.yml"), "-f", "0"]) == 2


HOSTILE = "<script>alert(1)</script>\x1b[2J&amp;"


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs |= {a for a, _v in attrs}


def hostile_document() -> dict[str, Any]:
    gpu = {
        "address": "0000:01:00.0",
        "name": HOSTILE,
        "vendor_device": "1234:11e8",
        "driver": HOSTILE,
        "iommu_group": "6",
        "use": "passthrough",
        "entry": f"gpuprov_host.gpus[0] '{HOSTILE}'",
        "ready": True,
        "verdict": "passthrough-ready",
        "state": None,
        "findings": [],
        "health": {
            "status": "warn",
            "findings": [{"code": "xid", "severity": "warn", "message": HOSTILE, "fix": HOSTILE}],
            "address": "0000:01:00.0",
            "present": True,
            "power_state": None,
            "config": "ok",
            "aer": None,
            "aer_errors": {},
            "xids": [{"xid": 13, "line": HOSTILE}],
            "resets": [],
            "driver_events": [],
            "ecc": None,
            "remapped_rows": None,
        },
    }
    record = {
        "status": "drifted",
        "root": "/",
        "kernel": HOSTILE,
        "os": HOSTILE,
        "declaration": {"given": True, "legacy": False, "warnings": []},
        "gpus": [gpu],
        "drift": [{"code": "driver", "entry": HOSTILE, "device": "0000:01:00.0", "message": HOSTILE, "fix": HOSTILE}],
        "not_ready": [],
        "unknown": [{"what": HOSTILE, "why": HOSTILE}],
        "health": {"log_source": "/dev/kmsg", "log_error": None, "memory_source": None, "memory_error": None},
    }
    return fleet_document({f'host"{HOSTILE}': record, "x\ny": unanswered("x\ny", "unreachable", HOSTILE)})


def test_host_values_never_become_markup_or_break_the_metrics() -> None:
    document = hostile_document()
    jsonschema.validate(document, SCHEMA)
    page = render_html(document)
    assert "<script>" not in page and "\x1b" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b[2J&amp;amp;" in page
    parser = Tags()
    parser.feed(page)
    assert parser.tags <= {
        "html",
        "head",
        "meta",
        "title",
        "style",
        "body",
        "h1",
        "h2",
        "h3",
        "p",
        "table",
        "tr",
        "th",
        "td",
        "a",
        "span",
        "ul",
        "li",
        "code",
        "br",
    }
    assert not {a for a in parser.attrs if a.startswith("on")} and "src" not in parser.attrs
    metrics = parse_prometheus(prometheus_text(document))
    hosts = {s[0]["host"] for s in metrics["gpuprov_fleet_host_status"]["samples"]}
    assert hosts == {'host\\"<script>alert(1)</script>\x1b[2J&amp;', "x\\ny"}  # escaped as the format says


def _forged(record: dict[str, Any], where: str, value: Any) -> dict[str, Any]:
    """``record`` with the value at ``where`` (dotted, list indexes as numbers) replaced, or deleted for DELETE."""
    out = json.loads(json.dumps(record))
    *parents, last = [int(k) if k.isdigit() else k for k in where.split(".")]
    node = out
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return out


DELETE = object()
FORGED = {
    "gpus missing": ("gpus", DELETE),
    "gpus a string": ("gpus", "<script>"),
    "a gpu without its health": ("gpus.0.health", DELETE),
    "health findings not a list": ("gpus.0.health.findings", 7),
    "an xid as text with a newline": ("gpus.0.health.xids.0.xid", '1\ngpuprov_gpu_ready{host="other"} 1'),
    "an ECC count as text": ("gpus.0.health.ecc", {"volatile_corrected": "0\nforeign_metric 1"}),
    "an AER total that is a list": ("gpus.0.health.aer", {"fatal": [1]}),
    "a status of its own": ("status", "fine"),
    "unknown items of the wrong type": ("unknown", [{"what": 1, "why": None}]),
    "a drift finding without its message": ("drift", [{"code": "x", "entry": None, "device": None, "fix": None}]),
    "the declaration a string": ("declaration", "yes"),
    "no root": ("root", DELETE),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_a_forged_answer_makes_its_host_unknown_and_the_others_are_reported(case: str) -> None:
    where, value = FORGED[case]
    good = hostile_document()["hosts"][0]
    record = {k: v for k, v in good.items() if k != "host"}
    records = {"good": record, "forged": _forged(record, where, value), "notadict": ["x"]}
    document = fleet_document(records)  # type: ignore[arg-type]
    jsonschema.validate(document, SCHEMA)
    hosts = by_host(document)
    assert hosts["good"]["status"] == "drifted" and hosts["good"]["gpus"]
    assert hosts["forged"]["status"] == "unknown" and hosts["notadict"]["status"] == "unknown"
    assert hosts["forged"]["message"].startswith("its answer is not a fleet record: host forged")
    assert document["summary"]["unknown"] == 2
    render_html(document)
    metrics = parse_prometheus(prometheus_text(document))  # every line a sample of ours, after its HELP
    assert {s[0]["host"] for m in metrics.values() for s in m["samples"]} == {"good", "forged", "notadict"}
    assert "foreign_metric" not in metrics


def test_the_status_comes_from_the_lists_never_from_the_host() -> None:
    record = {k: v for k, v in hostile_document()["hosts"][0].items() if k != "host"}
    claimed = {**record, "status": "converged", "drift": []}
    assert by_host(fleet_document({"h": claimed}))["h"]["status"] == "unknown"  # its unknown list stands
    claimed["unknown"] = []
    assert by_host(fleet_document({"h": claimed}))["h"]["status"] == "converged"
    claimed["not_ready"] = [{"code": "x", "device": None, "entry": None, "message": "m", "fix": None}]
    assert by_host(fleet_document({"h": claimed}))["h"]["status"] == "not ready"


def test_a_metric_value_is_written_only_when_it_is_a_number() -> None:
    document = hostile_document()
    gpu = document["hosts"][0]["gpus"][0]
    gpu["health"]["aer"] = {"fatal": "1\nforeign_metric 1", "nonfatal": float("nan"), "correctable": 3}
    text = prometheus_text(document)
    assert "foreign_metric" not in text and "nan" not in text.lower()
    aer = parse_prometheus(text)["gpuprov_gpu_aer_errors"]["samples"]
    assert [(labels["severity"], value) for labels, value in aer] == [("correctable", 3.0)]


def test_a_live_h200_guest_as_a_member_matches_the_schema() -> None:
    """host_record on the H200 device machine (a Firecracker guest, driver 580, nvidia-ml-py), as root:
    /dev/kmsg read, ECC and remapped rows through NVML (tests/fixtures/outputs/h200-live.fleet.json)."""
    document = json.loads((REPO / "tests/fixtures/outputs/h200-live.fleet.json").read_text())
    jsonschema.validate(document, SCHEMA)
    (host,) = document["hosts"]
    assert host["status"] == "converged" and host["health"]["log_source"] == "/dev/kmsg"
    assert host["health"]["memory_source"] == "nvml"
    (gpu,) = host["gpus"]
    assert gpu["driver"] == "nvidia" and gpu["health"]["config"] == "ok" and gpu["health"]["power_state"] == "D0"
    assert gpu["health"]["remapped_rows"] == {"corrected": 0, "uncorrected": 0, "pending": False, "failure": False}
    assert parse_prometheus(prometheus_text(document))["gpuprov_gpu_ecc_errors"]["samples"]
