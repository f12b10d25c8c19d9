"""A host's variables as Ansible sees them: ``-i INVENTORY --host HOST`` for ``gpuprov plan``,
``inspect --declaration`` and ``init``; and the check every inventory passes before Ansible reads it
(``gpuprov fleet`` too). docs/reference/inputs.md, "Ansible inventories".

Read through Ansible's own loader (ansible-core: group_vars and host_vars, ``gpuprov_layouts`` in a
group, vault-encrypted values with the vault secrets ansible-playbook would use, Jinja templated as
the play will template it), so what gpuprov checks is what the play will do. Only the variables
gpuprov reads are templated; the result is plain data (no Ansible types) handed to the same input
boundary as a host_vars file. Nothing is written.

An inventory is untrusted input:

- :func:`check_sources` walks every file Ansible would read (the inventory, its ``group_vars`` and
  ``host_vars``) before Ansible does: a FIFO, socket or device (Ansible would block on it), a link
  loop, a folder linked below itself, too many files or bytes, and YAML that is not valid or is an
  alias bomb (the project's bounded YAML reader, :mod:`gpuprov.cli.yamlread`) are refused, naming the
  file and the fix;
- Ansible's loader then runs in a child process (:mod:`gpuprov.cli.bounded`): killed past
  :data:`READ_TIME_LIMIT` seconds or :data:`READ_MEMORY` bytes;
- a dry run or a starting point runs nothing the inventory says: lookups other than the pure ones of
  :data:`PURE_LOOKUPS` (``pipe`` runs a command, ``file`` reads outside the inventory) are refused
  naming the variable, and inventory scripts are not run, unless ``--trust-inventory`` asks for the
  play's full templating.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import sys
from pathlib import Path
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

# Bounds of an inventory (docs/reference/inputs.md, "Ansible inventories").
MAX_FILES = 20_000
MAX_FILE_BYTES = 16 << 20
MAX_TOTAL_BYTES = 256 << 20
MAX_DEPTH = 16
READ_TIME_LIMIT = 120  # seconds for Ansible's loader to read one host's variables
READ_MEMORY = 2 << 30
# Ansible reads these as YAML in group_vars and host_vars (C.YAML_FILENAME_EXTENSIONS, and no extension).
VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")
YAML_EXTENSIONS = (".yml", ".yaml", ".json")
VARS_FOLDERS = ("group_vars", "host_vars")
# Lookups that compute from their terms and the variables alone: no command, file, network or environment.
PURE_LOOKUPS = frozenset(
    {"vars", "varnames", "dict", "items", "indexed_items", "list", "nested", "sequence", "subelements", "together"}
    | {"flattened", "cartesian"}
)
TRUST_FIX = (
    "put the value itself in the inventory, or pass --trust-inventory to template it as the play does "
    "(lookups run, inventory scripts run)"
)


class _Walk:
    """Every file of one inventory check, counted against the bounds."""

    def __init__(self) -> None:
        self.files = 0
        self.bytes = 0
        self.vaulted: list[str] = []  # whole files vault-encrypted: every value in them is a secret

    def refuse(self, path: str, problem: str, fix: str) -> UsageError:
        return UsageError(f"inventory file {path}: {problem}; {fix}")

    def file(self, path: str, info: os.stat_result, yaml_file: bool) -> None:
        self.files += 1
        self.bytes += info.st_size
        if self.files > MAX_FILES:
            raise self.refuse(path, f"more than {MAX_FILES} files in the inventory", "give the inventory's own folder")
        if info.st_size > MAX_FILE_BYTES or self.bytes > MAX_TOTAL_BYTES:
            raise self.refuse(
                path,
                f"over {MAX_FILE_BYTES} bytes, or the inventory over {MAX_TOTAL_BYTES} in all",
                "give the inventory's own files",
            )
        if yaml_file:
            self._yaml(path)

    def _yaml(self, path: str) -> None:
        from .yamlread import YamlInputError, read_yaml

        try:
            with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NONBLOCK)) as f:
                if f.read(14) == b"$ANSIBLE_VAULT":  # a vaulted file: its text is Ansible's to decrypt
                    self.vaulted.append(os.path.realpath(path))
                    return
        except OSError as exc:
            raise self.refuse(path, f"cannot be read ({exc.strerror})", "make it readable") from None
        try:
            read_yaml(path, max_bytes=MAX_FILE_BYTES, inventory=True)
        except YamlInputError as exc:
            raise UsageError(f"inventory file {exc}") from None

    def entry(self, path: str, *, vars_file: bool, above: tuple[str, ...], depth: int) -> None:
        """``path`` and, for a folder, everything below it Ansible would read."""
        try:
            info = os.stat(path)  # links followed, as Ansible follows them
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self.refuse(path, "a link loop", "remove the link or point it at a file") from None
            raise self.refuse(path, f"cannot be read ({exc.strerror})", "fix or remove it") from None
        if stat.S_ISDIR(info.st_mode):
            real = os.path.realpath(path)
            if real in above:
                raise self.refuse(path, "a link to a folder above it (a loop)", "remove the link")
            if depth > MAX_DEPTH:
                raise self.refuse(path, f"nested more than {MAX_DEPTH} folders deep", "flatten the inventory")
            try:
                names = sorted(os.listdir(path))
            except OSError as exc:
                raise self.refuse(path, f"cannot be listed ({exc.strerror})", "make it readable") from None
            for name in names:
                if name.startswith(".") or name.endswith("~"):
                    continue  # Ansible skips hidden files and backups
                child = os.path.join(path, name)
                in_vars = vars_file or name in VARS_FOLDERS
                self.entry(child, vars_file=in_vars, above=(*above, real), depth=depth + 1)
            return
        if not stat.S_ISREG(info.st_mode):
            raise self.refuse(
                path,
                "not a regular file (a FIFO, socket or device): Ansible would block reading it",
                "remove it from the inventory",
            )
        ext = os.path.splitext(path)[1]
        yaml_file = ext in VARS_EXTENSIONS if vars_file else ext in YAML_EXTENSIONS
        self.file(path, info, yaml_file)


def check_sources(sources: list[str], playbook_dirs: tuple[str, ...] = ()) -> list[str]:
    """Refuse (UsageError) an inventory Ansible could not read in bounded time and memory: every file
    of each source, and of the ``group_vars``/``host_vars`` beside each source file and playbook.
    Returns the vault-encrypted files found (their real paths)."""
    walk = _Walk()
    for source in sources:
        if "," in source and not os.path.exists(source):
            continue  # a host list (-i host1,host2,): no file
        if not os.path.lexists(source):
            raise UsageError(f"-i {source}: no such inventory file or directory")
        walk.entry(source, vars_file=False, above=(), depth=0)
        if not os.path.isdir(source):
            playbook_dirs = (*playbook_dirs, os.path.dirname(os.path.abspath(source)))
    for folder in dict.fromkeys(playbook_dirs):
        for name in VARS_FOLDERS:
            beside = os.path.join(folder, name)
            if os.path.lexists(beside):
                walk.entry(beside, vars_file=True, above=(), depth=0)
    return walk.vaulted


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``-i/--inventory``, ``--host``, the vault options of ansible-playbook and ``--trust-inventory``."""
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
    p.add_argument(
        "--trust-inventory",
        action="store_true",
        help="template HOST's variables as the play does: lookups that run commands or read files (pipe, file, "
        "env...) and inventory scripts run; without it they are refused",
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
    from .secrets import mark, redact_output

    variables, secrets = host_variables(
        inventory, host, args.vault_id, args.vault_password_file, trust=getattr(args, "trust_inventory", False)
    )
    redact_output(list(secrets))  # no vaulted value is shown by anything this run prints
    return f"{inventory} (host {host})", mark(variables, {k: v for k, v in secrets.items() if v is not None})


def host_variables(
    inventory: str,
    host: str,
    vault_ids: list[str] | None = None,
    vault_password_files: list[str] | None = None,
    *,
    trust: bool = False,
) -> tuple[dict[str, Any], dict[str, str | None]]:
    """The variables of :data:`READ` that ``host`` has in ``inventory``, templated, as plain data, and
    the host's vaulted values (decrypted -> the ciphertext of a ``!vault`` value, None for one from a
    vault-encrypted file): the inventory checked (:func:`check_sources`), then read by Ansible in a
    bounded child."""
    from .bounded import OutputTooLarge, TimedOut, run_bounded

    vaulted_files = check_sources([inventory])
    request = {
        "vaulted_files": vaulted_files,
        "inventory": inventory,
        "host": host,
        "vault_ids": list(vault_ids or []),
        "vault_password_files": list(vault_password_files or []),
        "trust": trust,
    }
    package_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    try:
        done = run_bounded(
            [sys.executable, "-c", "from gpuprov.cli.inventory import child_main; child_main()"],
            stdin=json.dumps(request).encode(),
            env=env,
            time_limit=READ_TIME_LIMIT,
            memory_bytes=READ_MEMORY,
            output_bytes=MAX_TOTAL_BYTES,
        )
    except TimedOut:
        raise UsageError(
            f"{inventory}: Ansible did not finish reading host {host}'s variables in {READ_TIME_LIMIT} s (an "
            "inventory that expands without end, or a script that hangs); fix the inventory"
        ) from None
    except OutputTooLarge:
        raise UsageError(f"{inventory}: host {host}'s variables are more than {MAX_TOTAL_BYTES} bytes") from None
    except OSError as exc:
        raise UsageError(f"cannot start Python to read the inventory: {exc.strerror}") from None
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        why = said[-1][:500] if said else f"exit status {done.returncode}"
        if "MemoryError" in why or done.returncode == -9:
            why = f"it took more than {READ_MEMORY >> 20} MiB (an inventory that expands without end)"
        raise UsageError(f"{inventory}: Ansible could not read host {host}'s variables: {why}") from None
    if "error" in answer:
        raise UsageError(str(answer["error"]))
    return answer["variables"], {plain: ciphertext for plain, ciphertext in answer["secrets"]}


# ---------------------------------------------------------------- the child: Ansible's loader


class _LookupRefused(Exception):
    """A lookup the guard refused (its name is in the guard's list, for the message)."""


def _guard_lookups() -> list[str]:
    """Refuse every lookup but the pure ones, in this process (ansible-core 2.19's one lookup loader);
    returns the list the refused names are put in. Fails closed: a loader it cannot guard is an error."""
    from ansible._internal._templating import _jinja_plugins  # type: ignore[import-not-found]

    real = _jinja_plugins.lookup_loader
    refused: list[str] = []

    class Guarded:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def get(self, name: str, *args: Any, **kwargs: Any) -> Any:
            short = name.rsplit(".", 1)[-1] if name.startswith("ansible.builtin.") or "." not in name else name
            if short not in PURE_LOOKUPS:
                refused.append(name)
                raise _LookupRefused(f"lookup {name!r} refused")
            return real.get(name, *args, **kwargs)

    _jinja_plugins.lookup_loader = Guarded()
    return refused


def _read_in_child(request: dict[str, Any]) -> dict[str, Any]:
    inventory, host, trust = request["inventory"], request["host"], request["trust"]
    if not trust:
        # No inventory script is run: the plugins that parse files, and a host list.
        os.environ["ANSIBLE_INVENTORY_ENABLED"] = "host_list,yaml,ini,toml"
    try:
        from ansible import constants as C
        from ansible.cli import CLI
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar
        from ansible.vars.manager import VariableManager
    except ImportError:
        return {
            "error": "reading an inventory needs ansible-core in gpuprov's environment: install it beside gpuprov "
            "(pipx inject gpuprov ansible-core, or pip install ansible-core in gpuprov's venv), or give the "
            "host_vars file"
        }
    try:
        refused = [] if trust else _guard_lookups()
    except (ImportError, AttributeError):
        return {
            "error": f"this ansible-core cannot be kept from running the inventory's lookups: {TRUST_FIX}; "
            "or install the ansible-core gpuprov is tested with (2.19)"
        }
    name = ""
    try:
        loader = DataLoader()
        vault_ids = request["vault_ids"] or list(C.DEFAULT_VAULT_IDENTITY_LIST)
        files = request["vault_password_files"]
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
            hint = "" if trust else f"; if the inventory is a script, {TRUST_FIX}"
            return {"error": f"{inventory} has no host {host!r} (its hosts: {shown or 'none'}){hint}"}
        variables = VariableManager(loader=loader, inventory=hosts).get_vars(host=found, include_hostvars=False)
        templar = Templar(loader=loader, variables=variables)
        read = {}
        for name in READ:
            if name in variables:
                read[name] = templar.template(variables[name])
    except AnsibleError as exc:  # a vaulted value without its secret, a template that fails, a broken file
        if refused:
            return _lookup_refused(inventory, host, name, refused[0])
        message = " ".join(str(exc).split())[:2000]
        fix = ""
        if "vault" in message.lower():
            fix = " (give the vault's secret as to ansible-playbook: --vault-password-file FILE or --vault-id ID@FILE)"
        return {"error": f"{inventory}: Ansible could not read host {host}'s variables: {message}{fix}"}
    if refused:  # refused, then swallowed by the template (a default, errors='ignore'): still refused
        return _lookup_refused(inventory, host, name, refused[0])
    # Plain data: the input boundary takes what a YAML file gives, never Ansible's tagged types.
    plain = json.loads(json.dumps(read, default=str))
    return {"variables": plain, "secrets": _secrets(variables, set(request["vaulted_files"]))}


def _secrets(variables: dict[str, Any], vaulted_files: set[str]) -> list[tuple[str, str | None]]:
    """Every vaulted value of the host, decrypted where its secret was given: a ``!vault`` value with
    its ciphertext, each string read from a vault-encrypted file with None."""
    from ansible._internal._datatag._tags import Origin  # type: ignore[import-not-found]
    from ansible.parsing.vault import EncryptedString

    found: dict[str, str | None] = {}
    budget = [1_000_000]  # values looked at: the inventory was bounded, this walk is too

    def walk(value: Any, depth: int) -> None:
        budget[0] -= 1
        if budget[0] < 0 or depth > 64:
            return
        if isinstance(value, EncryptedString):
            try:
                found[str(value._decrypt())] = value._ciphertext
            except Exception:  # noqa: BLE001 - no secret for it: nothing decrypted, nothing to hide
                pass
        elif isinstance(value, str):
            origin = Origin.get_tag(value)
            if origin is not None and origin.path is not None and os.path.realpath(origin.path) in vaulted_files:
                found.setdefault(str(value), None)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item, depth + 1)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item, depth + 1)

    walk(variables, 0)
    return [(plain, ciphertext) for plain, ciphertext in found.items() if plain]


def _lookup_refused(inventory: str, host: str, variable: str, lookup: str) -> dict[str, str]:
    return {
        "error": f"{inventory}: host {host}'s variable {variable} uses lookup {lookup!r}: gpuprov reads an inventory "
        f"without running lookups that run commands or read files; {TRUST_FIX}"
    }


def child_main() -> None:  # pragma: no cover - the child's entry point, run by host_variables
    """Read one request on stdin, print the answer on stdout (JSON); whatever Ansible prints goes to stderr."""
    request = json.loads(sys.stdin.read())
    answer = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    json.dump(_read_in_child(request), answer)
    answer.close()
