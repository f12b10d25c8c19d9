# Copyright: gpuprov contributors
# Apache License 2.0
"""Callback fleet_json: the play's results as one JSON document on stdout, for ``gpuprov fleet``."""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: fleet_json
type: stdout
short_description: The play's results as one JSON document, for gpuprov fleet
description:
  - Prints nothing while the play runs, then one JSON document - C(plays), each with its C(tasks) and each task's
    result per host (C(failed), C(skipped) or C(unreachable) set where the host's result was one), and C(stats),
    each host's counts.
  - C(gpuprov fleet) runs the playbook C(gpuprov.kvm.fleet_report) with it, so that the report needs ansible-core and
    this collection alone. The form is that of C(ansible.posix.json) for these keys.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
"""

import json

from ansible.module_utils.common.json import AnsibleJSONEncoder
from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    """Collect every task's result per host; print them with the stats at the end."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "gpuprov.kvm.fleet_json"

    def __init__(self, display=None):
        super().__init__(display)
        self.plays = []
        self.tasks = {}  # task uuid -> its entry in the current play

    def v2_playbook_on_play_start(self, play):
        self.plays.append({"play": {"name": play.get_name()}, "tasks": []})
        self.tasks = {}

    def _entry(self, task):
        key = task._uuid
        if key not in self.tasks:
            if not self.plays:
                self.plays.append({"play": {"name": ""}, "tasks": []})
            self.tasks[key] = {"task": {"name": task.get_name(), "action": task.action}, "hosts": {}}
            self.plays[-1]["tasks"].append(self.tasks[key])
        return self.tasks[key]

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._entry(task)

    def _record(self, result, **what):
        answer = dict(result._result)
        answer.update(what)
        self._entry(result._task)["hosts"][result._host.get_name()] = answer

    def v2_runner_on_ok(self, result, **kwargs):
        self._record(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, failed=True)

    def v2_runner_on_skipped(self, result):
        self._record(result, skipped=True)

    def v2_runner_on_unreachable(self, result):
        self._record(result, unreachable=True)

    def v2_playbook_on_stats(self, stats):
        summary = {host: stats.summarize(host) for host in sorted(stats.processed)}
        document = {"plays": self.plays, "stats": summary}
        self._display.display(json.dumps(document, cls=AnsibleJSONEncoder, sort_keys=True))
