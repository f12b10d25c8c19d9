"""A host's variables as Ansible sees them: ``-i INVENTORY --host HOST`` for ``gpuprov plan``,
``inspect --declaration`` and ``init``.

Read through Ansible's own loader (ansible-core: group_vars and host_vars, ``gpuprov_layouts`` in a
group, vault-encrypted values with the vault secrets ansible-playbook would use, Jinja templated as
the play will template it), so what gpuprov checks is what the play will do. Only the variables
gpuprov reads are templated; the result is plain data (no Ansible types) handed to the same input
boundary as a host_vars file. Nothing is written and no inventory script is given anything but the
command line Ansible itself would give it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import UsageError

# The variables gpuprov reads from a host (docs/reference/host-model.md, docs/reference/inputs.md).
READ = (
    "gpuprov_host",
    "gpuprov_layouts",
    "gpuprov_gpus",
    "gpu_vms_list",
    "gpu_vms_defaults",
    "gpu_vms_reserved_memory_mib",
    "gpu_vms_reserved_cpus",
    "gpu_vms_mixed_vgpu_types",
    "vfio_host_devices",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``-i/--inventory``, ``--host`` and the vault options of ansible-playbook."""
    p.add_argument(
        "-i",
        "--inventory",
        metavar="INVENTORY",
        help="read HOST's variables from this Ansible inventory (group_vars, host_vars, vaulted values; "
        "needs ansible-core) instead of a file",
    )
    p.add_argument("--host", metavar="HOST", help="the inventory host whose variables to read (with -i)")
    p.add_argument("--vault-id", action="append", default=[], metavar="ID", help="as ansible-playbook's (repeatable)")
    p.add_argument(
        "--vault-password-file",
        action="append",
        default=[],
        metavar="FILE",
        help="as ansible-playbook's (repeatable; ANSIBLE_VAULT_PASSWORD_FILE is read as Ansible reads it)",
    )


def wanted(args: argparse.Namespace, path: str | None, option: str) -> tuple[str, Any] | None:
    """(how messages name the input, the document) from ``-i``/``--host`` or from ``path``; None
    when neither was given. Both at once, or one of -i and --host alone, is a usage error."""
    inventory, host = getattr(args, "inventory", None), getattr(args, "host", None)
    if inventory is None and host is None:
        return None
    if path is not None:
        raise UsageError(f"give {option} or -i INVENTORY --host HOST, not both")
    if not inventory or not host:
        raise UsageError("-i INVENTORY and --host HOST go together: name the inventory and the host in it")
    return f"{inventory} (host {host})", host_variables(inventory, host, args.vault_id, args.vault_password_file)


def host_variables(
    inventory: str, host: str, vault_ids: list[str] | None = None, vault_password_files: list[str] | None = None
) -> dict[str, Any]:
    """The variables of :data:`READ` that ``host`` has in ``inventory``, templated, as plain data."""
    try:
        from ansible import constants as C
        from ansible.cli import CLI
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar
        from ansible.vars.manager import VariableManager
    except ImportError:
        raise UsageError(
            "reading an inventory needs ansible-core in gpuprov's environment: install it beside gpuprov (pipx "
            "inject gpuprov ansible-core, or pip install ansible-core in gpuprov's venv), or give the host_vars file"
        ) from None
    try:
        loader = DataLoader()
        vault_ids = list(vault_ids or []) or list(C.DEFAULT_VAULT_IDENTITY_LIST)
        files = list(vault_password_files or [])
        if not files and C.DEFAULT_VAULT_PASSWORD_FILE:
            files = [C.DEFAULT_VAULT_PASSWORD_FILE]
        # Never a prompt: gpuprov runs unattended as often as not (CI, a fleet report).
        secrets = CLI.setup_vault_secrets(
            loader, vault_ids=vault_ids, vault_password_files=files, ask_vault_pass=False, auto_prompt=False
        )
        loader.set_vault_secrets(secrets)
        hosts = InventoryManager(loader=loader, sources=[inventory])
        found = hosts.get_host(host)
        if found is None:
            names = sorted(h.name for h in hosts.get_hosts())
            shown = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
            raise UsageError(f"{inventory} has no host {host!r} (its hosts: {shown or 'none'})")
        variables = VariableManager(loader=loader, inventory=hosts).get_vars(host=found, include_hostvars=False)
        templar = Templar(loader=loader, variables=variables)
        read = {name: templar.template(variables[name]) for name in READ if name in variables}
    except UsageError:
        raise
    except AnsibleError as exc:  # a vaulted value without its secret, a template that fails, a broken file
        message = " ".join(str(exc).split())[:2000]
        fix = ""
        if "vault" in message.lower():
            fix = " (give the vault's secret as to ansible-playbook: --vault-password-file FILE or --vault-id ID@FILE)"
        raise UsageError(f"{inventory}: Ansible could not read host {host}'s variables: {message}{fix}") from None
    # Plain data: the input boundary takes what a YAML file gives, never Ansible's tagged types.
    return json.loads(json.dumps(read, default=str))
