"""Vaulted values stay secret (issue #50, item 2): given a vaulted inventory, no command prints a
decrypted value on stdout or stderr (plan, plan --json, inspect --declaration, init, and their
refusals), and ``init`` writes a ``!vault`` value back as its own ciphertext, which Ansible reads
back to the same secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.cli.main import main

REPO = Path(__file__).resolve().parents[2]
H100 = REPO / "tests" / "fixtures" / "hosts" / "h100-live.tar.gz"
PASSWORD = "gpuprov-test-vault"
VM_NAME = "vaultedvmname"  # in host_vars as a !vault value
USER = "wholefilesecretuser"  # in group_vars/all/vault.yml, a vault-encrypted file
NETWORK = "nw9"  # a short secret: hidden where it stands as a word


def vault() -> object:
    from ansible.parsing.vault import VaultLib, VaultSecret

    return VaultLib([("default", VaultSecret(PASSWORD.encode()))])


def vaulted(text: str) -> str:
    blob = vault().encrypt(text).decode()  # type: ignore[attr-defined]
    return "!vault |\n" + "".join(f"    {line}\n" for line in blob.splitlines())


@pytest.fixture(autouse=True)
def fresh_vault_context():
    from ansible.parsing.vault import VaultSecretsContext

    VaultSecretsContext._current = None
    yield
    VaultSecretsContext._current = None


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    node1: {}\n")
    secret_file = f"vault_user: {USER}\nvault_network: {NETWORK}\n"
    (tmp_path / "group_vars" / "all" / "vault.yml").write_bytes(vault().encrypt(secret_file))  # type: ignore[attr-defined]
    (tmp_path / "host_vars" / "node1.yml").write_text(
        f"secret_name: {vaulted(VM_NAME)}"
        "gpuprov_host:\n"
        "  version: 1\n"
        "  gpus:\n"
        '    - {name: train, use: passthrough, address: "0000:00:06.0"}\n'
        "  vms:\n"
        '    - name: "{{ secret_name }}"\n'
        "      memory_mib: 2048\n"
        "      vcpus: 2\n"
        '      gpus: ["train"]\n'
        '      network: "{{ vault_network }}"\n'
        '      cloud_init: {user: "{{ vault_user }}"}\n'
    )
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    return tmp_path


COMMANDS = {
    "plan": ["plan", "--root", str(H100)],
    "plan --json": ["plan", "--json", "--root", str(H100)],
    "inspect": ["inspect", "--root", str(H100)],
    "inspect --json": ["inspect", "--json", "--root", str(H100)],
    "init": ["init", "--root", str(H100)],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_command_prints_a_vaulted_value(capsys, inventory: Path, command: str) -> None:
    args = [*COMMANDS[command], "-i", str(inventory / "hosts.yml"), "--host", "node1"]
    args += ["--vault-password-file", str(inventory / "pw")]
    code = main(args)
    out, err = capsys.readouterr()
    assert code in (0, 3), err
    for secret in (VM_NAME, USER):
        assert secret not in out and secret not in err, (command, out[-2000:], err[-2000:])
    assert f" {NETWORK} " not in out + err and f"'{NETWORK}'" not in out + err and f'"{NETWORK}"' not in out + err
    if command == "plan":
        assert "<vaulted>" in out  # the VM is planned, under its name hidden


def test_init_writes_a_vaulted_value_back_as_its_ciphertext(capsys, inventory: Path) -> None:
    import yaml
    from ansible.parsing.dataloader import DataLoader

    inv, password = str(inventory / "hosts.yml"), str(inventory / "pw")
    code = main(["init", "--root", str(H100), "-i", inv, "--host", "node1", "--vault-password-file", password])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "!vault" in out and VM_NAME not in out
    # What init printed, read as Ansible reads a host_vars file: the VM's name decrypts to the secret.
    written = inventory / "written.yml"
    written.write_text(out)
    doc = DataLoader().load_from_file(str(written))
    name = doc["gpuprov_host"]["vms"][0]["name"]
    assert vault().decrypt(name._ciphertext).decode() == VM_NAME  # type: ignore[attr-defined]
    # A value read from a vault-encrypted file has no ciphertext of its own: hidden, never shown.
    assert yaml.safe_load(out.replace("!vault", "!!str"))["gpuprov_host"]["vms"][0]["cloud_init"]["user"] == (
        "<vaulted>"
    )
