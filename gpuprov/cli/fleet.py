"""``gpuprov fleet``: every host of an Ansible inventory against its declaration, in one document
(schema ``gpuprov.fleet/v1``) and one page (docs/guides/fleet.md).

    gpuprov fleet -i inventory.yml                     # a summary: each host's status and why
    gpuprov fleet -i inventory.yml --json              # the document
    gpuprov fleet -i inventory.yml -f 50 --html fleet.html --prom /var/lib/node_exporter/gpuprov.prom

It runs ``ansible-playbook`` on the playbook ``gpuprov.kvm.fleet_report`` (one module run per host,
:mod:`gpuprov.report.fleet`'s :func:`host_record` on the host) with the collection's
``fleet_json`` callback, at the forks the user gives (else Ansible's own setting), and puts the results
together: each host's record, and each host that gave none listed as ``unreachable`` or
``failed`` with Ansible's message, never dropped. A host with ``gpuprov_root`` (a staged root
of a capture, ``ansible_connection: local``) is read below that root: a dry-run member.

Bounded: the inventory is checked before Ansible reads it (:func:`gpuprov.cli.inventory.check_sources`),
ansible-playbook runs in its own process group, killed past ``--time-limit``, each host's task past
``ANSIBLE_TASK_TIMEOUT`` (:data:`TASK_TIMEOUT` unless set: that host is ``failed``, the others are
reported), its output read up to :data:`MAX_OUTPUT` bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from .common import EXIT_NOT_READY, EXIT_OK, UsageError, add_json_arguments

PLAYBOOK = "gpuprov.kvm.fleet_report"
CALLBACK = "gpuprov.kvm.fleet_json"  # the collection's own: the report needs ansible-core and gpuprov.kvm alone
# A checkout's own collection (dev/tools/build_collection.py assembles it there).
CHECKOUT_COLLECTIONS = Path(__file__).resolve().parents[2] / "build" / "collections"
TIME_LIMIT = 3600  # seconds for the whole play (--time-limit)
TASK_TIMEOUT = 600  # seconds for one host's reading task, unless ANSIBLE_TASK_TIMEOUT says otherwise
MAX_OUTPUT = 1 << 30
MEMORY = 8 << 30  # address space of each Ansible process
STDERR_SHOWN = 4000


def ansible_playbook() -> str:
    """The ansible-playbook beside this Python (a venv's), else on the PATH."""
    found = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) or shutil.which("ansible-playbook")
    if found is None:
        raise UsageError(
            "ansible-playbook is not installed: put ansible-core beside gpuprov or on the PATH: pipx install "
            "ansible-core (README, Install), or pip install ansible-core in gpuprov's venv"
        )
    return found


def environment() -> dict[str, str]:
    """ansible-playbook's environment: the json stdout callback; a checkout's collection found too."""
    env = dict(os.environ)
    env["ANSIBLE_STDOUT_CALLBACK"] = CALLBACK
    env.setdefault("ANSIBLE_NOCOLOR", "1")
    env.setdefault("ANSIBLE_RETRY_FILES_ENABLED", "False")
    env.setdefault("ANSIBLE_TASK_TIMEOUT", str(TASK_TIMEOUT))
    if (
        "ANSIBLE_COLLECTIONS_PATH" not in env
        and (CHECKOUT_COLLECTIONS / "ansible_collections" / "gpuprov" / "kvm").is_dir()
    ):
        defaults = ["~/.ansible/collections", "/usr/share/ansible/collections"]
        env["ANSIBLE_COLLECTIONS_PATH"] = os.pathsep.join([str(CHECKOUT_COLLECTIONS), *defaults])
    return env


def command(args: argparse.Namespace) -> list[str]:
    cmd = [ansible_playbook(), *(a for path in args.inventory for a in ("-i", path))]
    if args.forks is not None:
        cmd += ["-f", str(args.forks)]
    if args.limit:
        cmd += ["-l", args.limit]
    if args.become:
        cmd.append("--become")
    for value in args.extra_vars:
        cmd += ["-e", value]
    for value in args.vault_id:
        cmd += ["--vault-id", value]
    for value in args.vault_password_file:
        cmd += ["--vault-password-file", value]
    return [*cmd, args.playbook]


def parse_output(stdout: str) -> dict[str, Any]:
    """The json callback's document (whatever Ansible printed before it is skipped)."""
    start = stdout.find("{")
    while start >= 0:
        try:
            doc = json.loads(stdout[start:])
        except json.JSONDecodeError:
            start = stdout.find("\n{", start + 1)
            start = start + 1 if start >= 0 else -1
            continue
        if isinstance(doc, dict) and "stats" in doc:
            return doc
        break
    raise ValueError("no JSON document of the json callback in ansible-playbook's output")


def _message(result: dict[str, Any]) -> str:
    said = str(result.get("msg") or "").strip()
    detail = str(result.get("module_stderr") or result.get("stderr") or "").strip()
    if detail:
        said = f"{said}: {detail.splitlines()[-1]}" if said else detail.splitlines()[-1]
    return said[:2000] or "no message"


def records(output: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Host -> its record, from the json callback's document: the task's result where the host
    answered, ``unreachable``/``failed`` (with Ansible's message) where it did not. Every host of
    the stats is there, and every host any task of the play named."""
    from ..report.fleet import unanswered

    results: dict[str, dict[str, Any]] = {}
    for play in output.get("plays") or []:
        for task in play.get("tasks") or []:
            for host, result in (task.get("hosts") or {}).items():
                if isinstance(result, dict) and (host not in results or isinstance(result.get("fleet"), dict)):
                    results[host] = result  # the reading task's result wins over any other task's
    out: dict[str, dict[str, Any]] = {}
    for host in sorted(set(results) | set(output.get("stats") or {})):
        result = results.get(host)
        stats = (output.get("stats") or {}).get(host) or {}
        if result is None:
            why = "unreachable" if stats.get("unreachable") else "failed"
            out[host] = unanswered(host, why, "Ansible gave no result for this host")
        elif result.get("unreachable"):
            out[host] = unanswered(host, "unreachable", _message(result))
        elif result.get("failed") or not isinstance(result.get("fleet"), dict):
            out[host] = unanswered(host, "failed", _message(result))
        else:
            out[host] = result["fleet"]
    return out


def run_play(args: argparse.Namespace) -> dict[str, Any]:
    from .bounded import OutputTooLarge, TimedOut, run_bounded

    cmd = command(args)
    try:
        done = run_bounded(
            cmd, env=environment(), time_limit=args.time_limit, memory_bytes=MEMORY, output_bytes=MAX_OUTPUT
        )
    except TimedOut:
        raise UsageError(
            f"ansible-playbook did not finish in {args.time_limit} s and was stopped: give --time-limit more "
            "seconds for a fleet this large, or fewer hosts (-l)"
        ) from None
    except OutputTooLarge:
        raise UsageError(
            f"ansible-playbook printed more than {MAX_OUTPUT} bytes: report fewer hosts at once (-l)"
        ) from None
    except OSError as exc:
        raise UsageError(f"ansible-playbook could not run: {exc}") from None
    stdout = done.stdout.decode("utf-8", "replace")
    stderr = done.stderr.decode("utf-8", "replace")
    try:
        return parse_output(stdout)
    except ValueError:
        said = (stderr.strip() or stdout.strip()[-STDERR_SHOWN:] or f"exit status {done.returncode}").splitlines()
        hint = ""
        if any("could not be found" in line or "unknown playbook" in line.lower() for line in said):
            hint = "; install the collection gpuprov.kvm (ansible-galaxy collection install) or give --playbook"
        if any(CALLBACK in line for line in said):
            hint = "; the callback is the collection's: install the collection gpuprov.kvm (README, Install)"
        raise UsageError(
            f"ansible-playbook failed (exit {done.returncode}): {said[-1][:500] if said else ''}{hint}"
        ) from None


def write_file(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a textfile collector never reads half a file)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".gpuprov-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}; give a path in a writable directory") from None


def print_summary(document: dict[str, Any]) -> None:
    from .textsafe import safe_text

    s = document["summary"]
    print(
        f"{s['hosts']} host(s): {s['converged']} converged, {s['drifted']} drifted, {s['unknown']} unknown, "
        f"{s['not_ready']} not ready, "
        f"{s['unreachable']} unreachable, {s['failed']} failed; {s['gpus']} GPU(s), {s['gpus_not_ready']} not ready, "
        f"{s['gpus_failing']} failing"
    )
    for h in document["hosts"]:
        gpus = h.get("gpus") or []
        print(
            f"{safe_text(h['host'])}: {h['status']}" + (f" ({len(gpus)} GPU{'s' * (len(gpus) != 1)})" if gpus else "")
        )
        if h.get("message"):
            print(f"  {safe_text(h['message'])}")
        for r in h["not_ready"]:
            where = f" [{r['entry']}]" if r.get("entry") else ""
            print(f"  not ready: {safe_text(r['message'])}{safe_text(where)}")
        for d in h["drift"]:
            where = f" [{d['entry']}]" if d.get("entry") else ""
            print(f"  drift: {safe_text(d['message'])}{safe_text(where)}")
        for u in h["unknown"]:
            print(f"  unknown: {safe_text(u['what'])}: {safe_text(u['why'])}")


def cmd_fleet(args: argparse.Namespace) -> int:
    from ..report import write_json
    from ..report.fleet import fleet_document, prometheus_text
    from .inventory import check_sources

    if args.forks is not None and args.forks < 1:
        raise UsageError(f"-f/--forks {args.forks}: give a positive number of forks")
    if args.time_limit <= 0:
        raise UsageError(f"--time-limit {args.time_limit}: give a positive number of seconds")
    playbook_dir = (os.path.dirname(os.path.abspath(args.playbook)),) if os.path.isfile(args.playbook) else ()
    check_sources(args.inventory, playbook_dir)
    output = run_play(args)
    document = fleet_document(records(output), inventory=", ".join(args.inventory), forks=args.forks)
    if args.html:
        from .fleet_html import render_html

        write_file(args.html, render_html(document))
    if args.prom:
        write_file(args.prom, prometheus_text(document))
    if args.json:
        write_json(document, sys.stdout, compact=args.compact)
    else:
        print_summary(document)
    behind = [h for h in document["hosts"] if h["status"] != "converged"]
    if args.require_converged and behind:
        from .textsafe import safe_text

        said = ", ".join(f"{safe_text(h['host'])} ({h['status']})" for h in behind[:20])
        more = f" and {len(behind) - 20} more" if len(behind) > 20 else ""
        print(f"gpuprov: not converged: {said}{more}", file=sys.stderr)
        return EXIT_NOT_READY
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``gpuprov fleet``."""
    p = sub.add_parser(
        "fleet",
        help="every host of an inventory against its declaration: converged, drifted, not ready, unreachable",
        description="Run the playbook gpuprov.kvm.fleet_report over an Ansible inventory (one module run per "
        "host) and put the hosts together: per host converged, drifted (what, against which declared entry), not "
        "ready (each reason) or unreachable; per GPU its use, verdict and health (off the bus, AER, Xid, failed "
        "resets, ECC, remapped rows). A host with gpuprov_root is read below that root (a staged capture). "
        "Read-only on the hosts.",
    )
    p.add_argument(
        "-i",
        "--inventory",
        required=True,
        action="append",
        metavar="INVENTORY",
        help="the Ansible inventory (repeatable)",
    )
    p.add_argument("-l", "--limit", metavar="PATTERN", help="only these hosts (ansible-playbook's --limit)")
    p.add_argument("-f", "--forks", type=int, metavar="N", help="hosts read at once (default: Ansible's forks setting)")
    p.add_argument(
        "-b", "--become", action="store_true", help="read as root (the kernel log, libvirt's and GRUB's files)"
    )
    p.add_argument(
        "-e", "--extra-vars", action="append", default=[], metavar="VARS", help="as ansible-playbook's (repeatable)"
    )
    p.add_argument("--vault-id", action="append", default=[], metavar="ID", help="as ansible-playbook's (repeatable)")
    p.add_argument(
        "--vault-password-file", action="append", default=[], metavar="FILE", help="as ansible-playbook's (repeatable)"
    )
    p.add_argument("--playbook", default=PLAYBOOK, help=f"the play to run (default {PLAYBOOK}; a path to a copy of it)")
    p.add_argument(
        "--time-limit",
        type=float,
        default=TIME_LIMIT,
        metavar="SECONDS",
        help=f"stop ansible-playbook after this long (default {TIME_LIMIT}); one host's reading task is stopped "
        f"after ANSIBLE_TASK_TIMEOUT seconds (default {TASK_TIMEOUT}) and reported failed",
    )
    add_json_arguments(p, "the document", "gpuprov.fleet/v1")
    p.add_argument("--html", metavar="FILE", help="write the report as one self-contained HTML page to FILE")
    p.add_argument(
        "--prom",
        metavar="FILE",
        help="write the hosts' and GPUs' state as Prometheus metrics to FILE (node_exporter's textfile collector)",
    )
    p.add_argument(
        "--require-converged",
        action="store_true",
        help="exit 3 unless every host is converged (for monitoring and CI gates); which are not goes to stderr",
    )
    p.set_defaults(func=cmd_fleet)
