# Copyright: gpuprov contributors
# Apache License 2.0 (see LICENSE)
"""The option every gpuprov module that reads a host takes: the host's root."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  root:
    description:
      - The host's root directory. Every path the module reads (sysfs, procfs, C(/etc)) and every file it writes
        is below it. C(/) on a real host; a staged root or an unpacked C(gpuprov capture) for dry runs and tests.
      - Live actions (sysfs writes, commands, libvirt, NVML, containers) run only when it is C(/).
    type: path
    default: /
"""
