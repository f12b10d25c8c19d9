"""``-i INVENTORY --host HOST``: plan and inspect read a host's variables as Ansible sees them
(group_vars layouts, vault-encrypted values, Jinja), through Ansible's own loader (issue #28
item 2). The repo's example inventory, whose host_vars file alone cannot be planned (its layout
lives in group_vars), and a vaulted inventory written here with ansible-vault's own library."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpuprov.cli.main import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "inventories" / "example"
H100 = REPO / "tests" / "fixtures" / "hosts" / "h100-live.tar.gz"
PASSWORD = "gpuprov-test-vault"


def vaulted(text: str) -> str:
    """``text`` encrypted as ansible-vault encrypt_string does, as a YAML ``!vault`` block."""
    from ansible.parsing.vault import VaultLib, VaultSecret

    blob = VaultLib([("default", VaultSecret(PASSWORD.encode()))]).encrypt(text).decode()
    return "!vault |\n" + "".join(f"    {line}\n" for line in blob.splitlines())


@pytest.fixture(autouse=True)
def fresh_vault_context():
    """ansible-core keeps one vault context per process (the CLI reads one inventory per run); each
    in-process run here is a fresh process's."""
    from ansible.parsing.vault import VaultSecretsContext

    VaultSecretsContext._current = None
    yield
    VaultSecretsContext._current = None


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    """A layout in group_vars, a VM whose name and memory come from a vaulted value and Jinja."""
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "hosts.yml").write_text("all:\n  children:\n    gpu_hosts:\n      hosts:\n        node1: {}\n")
    (tmp_path / "group_vars" / "gpu_hosts.yml").write_text(
        "gpuprov_layouts:\n"
        "  one-gpu:\n"
        "    gpus:\n"
        '      - {name: train, use: passthrough, address: "0000:00:06.0"}\n'
        "vm_memory: 2048\n"
    )
    (tmp_path / "host_vars" / "node1.yml").write_text(
        f"secret_name: {vaulted('vault-named-vm')}"
        "gpuprov_host:\n"
        "  layout: one-gpu\n"
        "  vms:\n"
        '    - {name: "{{ secret_name }}", memory_mib: "{{ vm_memory }}", vcpus: 2, gpus: ["train"]}\n'
    )
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    return tmp_path


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict | None, str]:
    code = main(["plan", "--json", "--root", str(H100), *args])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_the_example_inventory_plans_where_its_host_vars_file_alone_cannot(capsys) -> None:
    alone = main(["plan", "--root", str(H100), str(EXAMPLE / "host_vars" / "gpu-node-02.yml")])
    assert alone == 2 and "no layout 'h100-passthrough'" in capsys.readouterr().err
    code, report, err = plan_json(capsys, "-i", str(EXAMPLE), "--host", "gpu-node-02")
    assert code == 3, err  # planned: this one-GPU capture cannot take two 32 GiB VMs, and says so
    assert [vm["name"] for vm in report["vms"]] == ["train-a", "train-b"]
    assert report["vms"][0]["placement"]["pci_slots"] == [["0000:00:06.0"]]  # train[0] from group_vars' layout


def test_vaulted_values_and_jinja_are_read_as_the_play_reads_them(capsys, inventory: Path) -> None:
    code, report, err = plan_json(
        capsys, "-i", str(inventory / "hosts.yml"), "--host", "node1", "--vault-password-file", str(inventory / "pw")
    )
    assert report, err
    vm = report["vms"][0]
    assert (vm["name"], vm["memory_mib"]) == ("vault-named-vm", 2048), err
    assert code in (0, 3)  # planned (this capture's IOMMU is off: a refusal, not an input error)


def test_the_vault_password_file_ansible_reads_from_the_environment(capsys, inventory: Path, monkeypatch) -> None:
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(inventory / "pw"))
    monkeypatch.setattr("ansible.constants.DEFAULT_VAULT_PASSWORD_FILE", str(inventory / "pw"), raising=False)
    _, report, err = plan_json(capsys, "-i", str(inventory), "--host", "node1")
    assert report and report["vms"][0]["name"] == "vault-named-vm", err


def test_no_vault_secret_is_a_usage_error_naming_the_option_never_a_prompt(capsys, inventory: Path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)  # a prompt would fail differently: there is none
    code, report, err = plan_json(capsys, "-i", str(inventory), "--host", "node1")
    assert code == 2 and report is None
    assert "no vault secrets" in err and "--vault-password-file" in err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--host", "nosuch"], "has no host 'nosuch' (its hosts: gpu-node-01, gpu-node-02)"),
        (["--host", "gpu-node-02", "some.yml"], "not both"),
        ([], "-i INVENTORY and --host HOST go together"),
    ],
)
def test_inventory_misuse_is_exit_2_naming_the_fix(capsys, args: list[str], said: str) -> None:
    assert main(["plan", "--root", str(H100), "-i", str(EXAMPLE), *args]) == 2
    assert said in capsys.readouterr().err


def test_without_ansible_the_message_says_how_to_get_it(capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ansible", None)  # import ansible -> ImportError
    assert main(["plan", "--root", str(H100), "-i", str(EXAMPLE), "--host", "gpu-node-02"]) == 2
    assert "needs ansible-core" in capsys.readouterr().err


def test_inspect_judges_the_inventory_declaration(capsys) -> None:
    code = main(["inspect", "--json", "--root", str(H100), "-i", str(EXAMPLE), "--host", "gpu-node-02"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    (gpu,) = [g for g in report["gpus"] if g["address"] == "0000:00:06.0"]
    assert "passthrough" in json.dumps(gpu)  # judged for the use group_vars' layout gives it


def test_a_vaulted_file_given_alone_points_to_the_inventory(capsys, inventory: Path) -> None:
    assert main(["plan", "--root", str(H100), str(inventory / "host_vars" / "node1.yml")]) == 2
    err = capsys.readouterr().err
    assert "vault-encrypted values" in err and "-i INVENTORY --host HOST" in err
