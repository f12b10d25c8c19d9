# Copyright: gpuprov contributors
# Apache License 2.0 (see LICENSE)
"""What every gpuprov module that changes a host shares: plan first, check mode and diff, refusals.

Ansible merges DOCUMENTATION into the modules that name this fragment
(``extends_documentation_fragment: gpuprov.kvm.plan``). RETURN cannot be a
fragment: each such module repeats the RETURN entries below in its own RETURN,
and tests/modules/test_module_docs.py fails when one differs from them.
"""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
    details:
      - Reports the plan (every sysfs write, file and command) and the result it would have; changes nothing.
      - Each RV(plan) line then says what would happen (C(would create /etc/x (why)), C(would run update-grub (why))).
  diff_mode:
    support: full
    details:
      - Shows every file the plan writes, before and after, and every runtime step as an added line (the value
        written to a sysfs attribute, headed by its path; a command line, headed by why it runs), so unbinds and
        other live changes show without C(-v).
notes:
  - The module plans first (facts -> plan), then applies the plan step by step; a second run plans nothing.
    RV(plan) lists every step, also in check mode.
  - A refusal (a safety rule, a malformed or absent input) fails the task before anything changed; RV(refusals)
    names each problem and its fix. RV(not_run) lists the live steps not run because O(root) is not C(/).
"""

    # Not read by Ansible: the RETURN entries every module using this fragment repeats (see above).
    RETURN = r"""
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
