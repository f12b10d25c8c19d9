#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module apt_keyring: a binary OpenPGP keyring for apt's signed-by, from a URL or given bytes."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_keyring
short_description: Write a repository's signing key as a binary keyring for apt's signed-by
description:
  - Fetches the key from O(url) (on the target) or takes it from O(data), dearmors it when it is ASCII-armored
    (as C(gpg --dearmor) does, without gpg on the target) and writes it to O(dest) when it differs.
  - With O(fingerprint), refuses a key whose primary key has another fingerprint, writing nothing.
  - Refuses data that is not an OpenPGP public key (an HTML error page, a truncated download), writing nothing.
  - Writes through the plan like every gpuprov module (one file action; RV(plan) names it).
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  dest:
    description: The keyring file on the host, e.g. C(/etc/apt/keyrings/nvidia-container-toolkit.gpg) (below O(root)).
    type: path
    required: true
  url:
    description: Where to fetch the key from (C(https://), C(http://) or C(file://)). One of O(url), O(data).
    type: str
  data:
    description: The key itself, base64-encoded (armored or binary), e.g. from C(slurp) of a file on the controller.
    type: str
  fingerprint:
    description: The primary key's expected fingerprint (hex, spaces allowed). Empty for no check.
    type: str
    default: ""
  mode:
    description: The keyring's file mode.
    type: str
    default: "0644"
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpuprov.kvm.plan
  - gpuprov.kvm.root
attributes:
  check_mode:
    support: full
    details: Reports whether the keyring would change and writes nothing.
  diff_mode:
    support: full
    details: Names the keyring and the fingerprints it would hold.
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: NVIDIA's container toolkit key
  gpuprov.kvm.apt_keyring:
    url: https://nvidia.github.io/libnvidia-container/gpgkey
    dest: /etc/apt/keyrings/nvidia-container-toolkit.gpg
"""

RETURN = r"""
fingerprints:
  description: The primary keys' fingerprints in the keyring.
  returned: success
  type: list
  elements: str
  sample: ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"]
dest:
  description: The keyring written.
  returned: always
  type: str
plan:
  description: Every action, as text, in order (also in check mode).
  returned: always
  type: list
  elements: str
not_run:
  description: Live actions (sysfs writes, commands) not run because O(root) is not C(/).
  returned: always
  type: list
  elements: str
refusals:
  description: Why the module refused, one entry per problem; nothing was changed.
  returned: failed
  type: list
  elements: dict
  contains:
    message:
      description: The problem.
      type: str
      returned: always
    fix:
      description: How to fix it (null when the message says it).
      type: str
      returned: always
    device:
      description: The PCI address the problem concerns (null for none).
      type: str
      returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import apt_keyring
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.common import (
    finish,
    refuse_bad_root,
    url_fetcher,
)


def main() -> None:
    module = AnsibleModule(argument_spec=apt_keyring.ARGUMENT_SPEC, supports_check_mode=True, **apt_keyring.RULES)
    refuse_bad_root(module, host=False)
    plan, extra = apt_keyring.plan(module, url_fetcher(module, fetch_url))
    finish(module, plan, module.params["root"], **extra)


if __name__ == "__main__":
    main()
