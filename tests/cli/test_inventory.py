"""``-i INVENTORY --host HOST``: plan, inspect and init read a host's variables as Ansible sees them
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
    assert (vm["name"], vm["memory_mib"]) == ("<vaulted>", 2048), err  # planned with it, never shown
    assert code in (0, 3)  # planned (this capture's IOMMU is off: a refusal, not an input error)


def test_the_vault_password_file_ansible_reads_from_the_environment(capsys, inventory: Path, monkeypatch) -> None:
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(inventory / "pw"))
    monkeypatch.setattr("ansible.constants.DEFAULT_VAULT_PASSWORD_FILE", str(inventory / "pw"), raising=False)
    _, report, err = plan_json(capsys, "-i", str(inventory), "--host", "node1")
    assert report and report["vms"][0]["name"] == "<vaulted>", err


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


def test_without_ansible_the_message_says_how_to_get_it(capsys, monkeypatch, tmp_path: Path) -> None:
    # Ansible's loader runs in a child: an ``ansible`` first on its path that cannot be imported.
    (tmp_path / "ansible").mkdir()
    (tmp_path / "ansible" / "__init__.py").write_text("raise ImportError('no ansible here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
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


# ---------------------------------------------------------------- init -i INVENTORY --host HOST


def init_doc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict, str, str]:
    """init's document, a ``!vault`` value read as its ciphertext."""
    import yaml

    assert main(["init", "--root", str(H100), *args]) == 0
    out, err = capsys.readouterr()
    return yaml.safe_load(out.replace("!vault |", "!!str |")), out, err


def resolved(doc: dict):
    from gpuprov.cli.common import host_root
    from gpuprov.facts.host import gather
    from gpuprov.facts.sysfs import Sysfs
    from gpuprov.inputs.declaration import check
    from gpuprov.model.resolve import resolve

    assert not check(doc, "init")  # the declaration's schema
    with host_root(str(H100)) as root:
        return resolve(doc, gather(Sysfs(root)))


def test_init_starts_from_the_inventory_declaration_layout_vault_and_jinja(capsys, inventory: Path, tmp_path) -> None:
    pw = str(inventory / "pw")
    doc, out, _ = init_doc(capsys, "-i", str(inventory), "--host", "node1", "--vault-password-file", pw)
    host = doc["gpuprov_host"]
    assert "layout" not in host and host["version"] == 1  # group_vars' layout written into the host's own gpus
    assert host["gpus"] == [{"name": "train", "use": "passthrough", "address": "0000:00:06.0"}]
    assert "gpuprov_layouts.one-gpu.gpus[0] 'train'" in out and "on this host: 0000:00:06.0" in out
    (vm,) = host["vms"]  # the vaulted name written back vaulted: its ciphertext, never the name
    assert vm["name"].startswith("$ANSIBLE_VAULT;") and str(vm["memory_mib"]) == "2048"
    assert "vault-named-vm" not in out
    vm["name"] = "vault-named-vm"  # as Ansible decrypts it
    model = resolved(doc)
    assert model.problems == [] and model.declared["0000:00:06.0"]["use"] == "passthrough"
    # The file stands alone: as the host's host_vars (no group_vars), plan -i reads it as the inventory.
    alone = tmp_path / "alone"
    (alone / "host_vars").mkdir(parents=True)
    (alone / "hosts.yml").write_text((inventory / "hosts.yml").read_text())
    (alone / "host_vars" / "node1.yml").write_text(out)
    from ansible.parsing.vault import VaultSecretsContext

    _, by_file, _ = plan_json(capsys, "-i", str(alone), "--host", "node1", "--vault-password-file", pw)
    VaultSecretsContext._current = None  # a second inventory read, as a second gpuprov run would be
    _, by_inventory, _ = plan_json(capsys, "-i", str(inventory), "--host", "node1", "--vault-password-file", pw)
    assert by_file["vms"] == by_inventory["vms"] and by_file["vms"][0]["name"] == "<vaulted>"


def test_init_from_the_example_inventory_names_what_the_host_refuses(capsys) -> None:
    doc, out, err = init_doc(capsys, "-i", str(EXAMPLE), "--host", "gpu-node-01")
    names = [g["name"] for g in doc["gpuprov_host"]["gpus"]]
    assert names == ["console", "big", "v100", "gpu0"]  # declared entries kept, then the GPU none covers
    assert "not declared in the inventory" in out and [vm["name"] for vm in doc["gpuprov_host"]["vms"]] == [
        "trainer",
        "notebook-1",
        "notebook-2",
    ]
    assert "no device 0000:41:00.0 on this host" in err and "# REFUSED on this host:" in out


def test_init_converts_a_host_with_the_old_variables(capsys, inventory: Path) -> None:
    (inventory / "host_vars" / "node1.yml").write_text(
        'vfio_host_devices: ["0000:00:06.0"]\ngpu_vms_list:\n  - {name: old-vm, memory_mib: 1024, vcpus: 1, '
        'gpus: ["0000:00:06.0"]}\n'
    )
    doc, out, _ = init_doc(capsys, "-i", str(inventory), "--host", "node1")
    assert "converted as `gpuprov convert` does" in out
    (gpu,) = doc["gpuprov_host"]["gpus"]
    assert (gpu["address"], gpu["use"]) == ("0000:00:06.0", "passthrough")
    assert [vm["name"] for vm in doc["gpuprov_host"]["vms"]] == ["old-vm"]
    assert resolved(doc).problems == []


def test_init_for_an_undeclared_host_starts_from_its_facts_and_names_the_layouts(capsys, inventory: Path) -> None:
    (inventory / "host_vars" / "node1.yml").unlink()
    doc, out, _ = init_doc(capsys, "-i", str(inventory), "--host", "node1")
    assert "declares no gpuprov_host" in out
    assert "layouts it offers (gpuprov_host.layout: NAME picks one): one-gpu" in out
    assert [g["address"] for g in doc["gpuprov_host"]["gpus"]] == ["0000:00:06.0"]
    assert doc["gpuprov_host"]["vms"] == []
    main(["init", "--root", str(H100)])
    plain = capsys.readouterr().out
    assert out.split("\n\n", 1)[1] == plain.split("\n\n", 1)[1]  # the same start as without -i


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--host", "node1"], "-i INVENTORY and --host HOST go together"),
        (["-i", "INV"], "-i INVENTORY and --host HOST go together"),
        (["-i", "INV", "--host", "nosuch"], "has no host 'nosuch'"),
        (["-i", "INV", "--host", "node1"], "no vault secrets"),
    ],
)
def test_init_inventory_misuse_is_exit_2(capsys, inventory: Path, args: list[str], said: str) -> None:
    args = [str(inventory) if a == "INV" else a for a in args]
    assert main(["init", "--root", str(H100), *args]) == 2
    captured = capsys.readouterr()
    assert said in captured.err and captured.out == ""
