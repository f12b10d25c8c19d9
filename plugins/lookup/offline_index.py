# Copyright: gpuprov contributors
# Apache License 2.0
"""Lookup offline_index: an offline directory's apt index, read on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: offline_index
short_description: The apt Packages index of a directory of .deb files on the controller
description:
  - Reads each C(.deb) of the directory as data (its C(ar) archive and the C(control) file of its C(control.tar)),
    never through a link and never a FIFO or device, each file capped in size, and returns one dictionary - C(index),
    the apt C(Packages) text (control fields, C(Filename), C(Size), C(SHA256)); C(files), the package file names; and
    C(problems), what could not be read (a link, a FIFO, a name that is not a package file's, a package that does not
    read).
  - The role C(guest_container_toolkit) hands it to the module C(guest_toolkit), which checks it against the guest's
    dpkg status before anything is copied or written.
  - A package compressed with zstd (Ubuntu's) is read with C(dpkg-deb -f) when the controller has it.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  _terms:
    description: The directory (one).
    required: true
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Index the offline directory
  ansible.builtin.set_fact:
    offline: "{{ lookup('gpuprov.kvm.offline_index', '/srv/offline-debs') }}"
"""

RETURN = r"""
_raw:
  description: One dictionary with C(index) (str), C(files) (list of str) and C(problems) (list of str).
  type: list
  elements: dict
"""

import shutil
import subprocess

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.facts.debindex import (
    DebError,
    offline_index,
    package_file_ok,
)


def _dpkg_deb(path: str) -> str:
    if shutil.which("dpkg-deb") is None:
        raise DebError(f"{path} is compressed with zstd and the controller has no dpkg-deb to read it")
    done = subprocess.run(["dpkg-deb", "-f", "--", path], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise DebError(f"{path}: dpkg-deb -f failed ({done.stderr.strip()[-300:]})")
    return done.stdout


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if len(terms) != 1 or not isinstance(terms[0], str) or not terms[0]:
            raise AnsibleLookupError("offline_index takes one directory")
        index, problems = offline_index(terms[0], control=_dpkg_deb)
        files = [line.split("./", 1)[1] for line in index.splitlines() if line.startswith("Filename: ./")]
        files = [name for name in files if package_file_ok(name)]  # what the role copies: a plain name only
        return [{"index": index, "files": files, "problems": problems}]
