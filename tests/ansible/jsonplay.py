"""The environment of an ``ansible-playbook`` whose standard output a test reads as one JSON
document (``ansible.posix.json``): this checkout's ansible.cfg, no colour, and no other callback
writing there (one enabled from the caller's environment, such as ``profile_tasks`` to time a run,
breaks the document). molecule/conftest.py's ``run_converge`` does the same for the lab scenarios."""

from __future__ import annotations

import os

from tests.conftest import REPO

CALLBACKS_ENABLED = ("ANSIBLE_CALLBACKS_ENABLED", "ANSIBLE_CALLBACK_WHITELIST")


def json_playbook_env() -> dict[str, str]:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCALHOST_WARNING": "0",
    }
    for name in CALLBACKS_ENABLED:
        env.pop(name, None)
    return env
