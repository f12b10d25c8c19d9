#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module apt_components: add archive components to the distribution's apt entries."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_components
short_description: Add archive components (contrib, non-free, restricted...) to a guest's own apt entries
description:
  - Adds O(components) to every apt entry of the distribution's release O(codename) (suite C(codename)
    or C(codename-*), carrying C(main)), in place, in whichever format the guest has, one-line
    C(/etc/apt/sources.list) and C(*.list) files or deb822 C(*.sources) files (Debian 12's
    C(debian.sources), Ubuntu 24.04's C(ubuntu.sources)).
  - Third-party entries, disabled stanzas, comments and options are left as they are.
  - Refuses, changing nothing, when no entry of the release is found.
  - Does not run C(apt-get update); the role does when a file changed.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  codename:
    description: The release's codename (C(ansible_facts.distribution_release)), e.g. C(bookworm), C(noble).
    type: str
    required: true
  components:
    description: Components the release's entries must carry, e.g. C([contrib, non-free, non-free-firmware]).
    type: list
    elements: str
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpuprov.kvm.plan
  - gpuprov.kvm.root
attributes:
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: The NVIDIA driver is in contrib and non-free on Debian
  gpuprov.kvm.apt_components:
    codename: "{{ ansible_facts['distribution_release'] }}"
    components: [contrib, non-free, non-free-firmware]
"""

RETURN = r"""
entries:
  description: The release's entries found, with the components they had and those added.
  returned: success
  type: list
  elements: dict
  sample: [{"path": "/etc/apt/sources.list.d/debian.sources", "suites": ["bookworm", "bookworm-updates"],
            "components": ["main"], "added": ["contrib", "non-free", "non-free-firmware"]}]
plan:
  description: Every action, as text, in order (also in check mode).
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
not_run:
  description: Live actions (sysfs writes, commands) not run because O(root) is not C(/).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import apt_components
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.common import finish, refuse_bad_root


def main() -> None:
    module = AnsibleModule(argument_spec=apt_components.ARGUMENT_SPEC, supports_check_mode=True)
    refuse_bad_root(module, host=False)
    plan, extra = apt_components.plan(module.params)
    finish(module, plan, module.params["root"], **extra)


if __name__ == "__main__":
    main()
