"""The adapters (gpuprov/modules/NAME.py) where a plugin's body went (issue #27): the fetch a plugin
passes in (Ansible's fetch_url), and the PCI addresses of module options through the one rule
(gpuprov.inputs.validate.pci_address): normalised where they are addresses, each bad one named."""

from __future__ import annotations

import io
from typing import Any

from gpuprov.modules.common import url_fetcher
from tests.conftest import tree_digest
from tests.modrun import run_in_process


def test_url_fetcher_gives_the_bytes_or_ansibles_words_for_why_not() -> None:
    answers: dict[str, tuple[Any, dict[str, Any]]] = {
        "https://ok": (io.BytesIO(b"key"), {"status": 200}),
        "https://gone": (io.BytesIO(b"<html>"), {"status": 404, "msg": "HTTP Error 404: Not Found"}),
        "https://down": (None, {"status": -1, "msg": "Request failed: <urlopen error refused>"}),
        "https://silent": (None, {}),
    }
    asked: list[tuple[Any, str, str]] = []

    def fetch_url(module: Any, url: str, method: str) -> tuple[Any, dict[str, Any]]:
        asked.append((module, url, method))
        return answers[url]

    fetch = url_fetcher("the module", fetch_url)
    assert fetch("https://ok") == (b"key", "")
    assert fetch("https://gone") == (None, "HTTP Error 404: Not Found")
    assert fetch("https://down") == (None, "Request failed: <urlopen error refused>")
    assert fetch("https://silent") == (None, "no answer")
    assert {(m, method) for m, _url, method in asked} == {("the module", "GET")}


def test_gpu_host_facts_takes_an_address_in_any_form_and_names_every_bad_one(host_root) -> None:
    root = host_root("gpu-alone")
    before = tree_digest(root)
    result = run_in_process("gpu_host_facts", {"root": str(root), "devices": ["00:1F.3"]})
    assert not result["failed"], result.get("msg")
    gpus = result["ansible_facts"]["gpuprov"]["gpus"]
    assert "0000:00:1f.3" in [g["address"] for g in gpus]
    bad = run_in_process("gpu_host_facts", {"root": str(root), "devices": ["10de:2330", "0000:00:1f.3", "41:00"]})
    assert bad["failed"] and "ansible_facts" not in bad
    assert bad["msg"].startswith("devices[0]: '10de:2330' is not a PCI address: use the full form")
    assert "; devices[2]: '41:00' is not a PCI address" in bad["msg"] and "devices[1]" not in bad["msg"]
    missing = run_in_process("gpu_host_facts", {"root": str(root), "devices": ["0000:41:00.0"]})
    assert missing["failed"] and missing["msg"].startswith("devices: no PCI device 0000:41:00.0 on this host")
    assert tree_digest(root) == before


def test_iommu_boot_reads_and_checks_expect_vfio_normalised(tmp_path) -> None:
    """The short form is the address (it used to be refused); a bad one is refused in every input's words."""
    from tests.plan.test_boot_trial import debian

    debian(tmp_path)
    before = tree_digest(tmp_path)
    ok = run_in_process("iommu_boot", {"root": str(tmp_path), "expect_vfio": ["01:00.0"]}, check=True)
    assert not ok["failed"], ok.get("msg")
    bad = run_in_process("iommu_boot", {"root": str(tmp_path), "expect_vfio": ["01:00"]}, check=True)
    assert bad["failed"] and bad["refusals"][0]["message"].startswith("expect_vfio[0]: '01:00' is not a PCI address")
    assert tree_digest(tmp_path) == before
