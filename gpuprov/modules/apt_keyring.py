"""apt_keyring's options and its read-and-plan step: the key, fetched or given, checked against its
fingerprint (:mod:`gpuprov.plan.guest.keyring`), and the keyring file below the root as it is now.

Ships to targets with the modules (``module_utils``); standard library only (the URL is fetched
through the :data:`~gpuprov.modules.common.Fetch` the module passes, Ansible's fetch_url).
"""

from __future__ import annotations

import base64
import os
from typing import Any

from ..core.plan import Plan
from ..facts.files import file_state
from ..facts.sysfs import Sysfs
from ..plan.guest.keyring import KeyDataError, fetch_failed, load_key, plan_keyring
from .common import Fetch

ARGUMENT_SPEC: dict[str, Any] = {
    "dest": {"type": "path", "required": True},
    "url": {"type": "str"},
    "data": {"type": "str", "no_log": False},
    "fingerprint": {"type": "str", "default": ""},
    "mode": {"type": "str", "default": "0644"},
    "root": {"type": "path", "default": "/"},
}
RULES: dict[str, Any] = {"required_one_of": [["url", "data"]], "mutually_exclusive": [["url", "data"]]}


def plan(module: Any, fetch: Fetch) -> tuple[Plan, dict[str, Any]]:
    """The keyring's plan for ``module``'s params, and what the module returns besides it; the module
    fails, nothing changed, when the key cannot be had, is not the one expected, or the mode is no mode."""
    p = module.params
    source = p["url"] or "data"
    if p["url"]:
        raw, why = fetch(p["url"])
        if raw is None:
            module.fail_json(msg=fetch_failed(p["url"], why), dest=p["dest"])
    else:
        try:
            raw = base64.b64decode(p["data"], validate=True)
        except ValueError:
            module.fail_json(msg="data is not base64 (give the key's bytes base64-encoded), nothing changed")
    try:
        mode = int(p["mode"], 8)
    except ValueError:
        module.fail_json(msg=f"mode {p['mode']!r} is not an octal file mode such as 0644, nothing changed")
    try:
        binary, found = load_key(raw, source, p["fingerprint"])
    except KeyDataError as exc:
        module.fail_json(msg=str(exc), fingerprints=exc.found, dest=p["dest"])
    dest = os.path.abspath(p["dest"]).lstrip("/")
    current, current_mode = file_state(Sysfs(p["root"]), dest)
    return plan_keyring(dest, binary, found, mode, current, current_mode), {"fingerprints": found, "dest": p["dest"]}
