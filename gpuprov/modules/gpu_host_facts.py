"""gpu_host_facts's options and its read step: the host's facts below the root, assessed, as the
``gpuprov inspect`` report (:mod:`gpuprov.report.inspect`), the devices named checked first.

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

from typing import Any

from ..facts.host import gather
from ..facts.sysfs import Sysfs
from ..inputs.hostroot import root_problem
from ..inputs.validate import Problems, pci_address
from ..report.inspect import build_report
from ..rules.assess import assess

ARGUMENT_SPEC: dict[str, Any] = {
    "root": {"type": "path", "default": "/"},
    "devices": {"type": "list", "elements": "str", "default": []},
}


def report(module: Any) -> dict[str, Any]:
    """The inspect report for ``module``'s params; the module fails, nothing read, when the root is
    no host (the CLI's --root check: no root is no evidence) or a device is no PCI address (the one
    rule, :func:`gpuprov.inputs.validate.pci_address`), and when a device is not on the host."""
    root = module.params["root"]
    problem = root_problem(root, "root", captures=False)
    if problem is not None:
        module.fail_json(msg=problem, refusals=[{"message": problem, "fix": None, "device": None}])
    problems = Problems()
    given = enumerate(module.params["devices"])
    extra = [a for i, d in given if (a := pci_address(problems, f"devices[{i}]", d)) is not None]
    if problems:
        module.fail_json(msg="; ".join(r.describe() for r in problems.items))
    facts = gather(Sysfs(root))
    missing = [a for a in extra if a not in facts.pci]
    if missing:
        module.fail_json(msg=f"devices: no PCI device {', '.join(missing)} on this host; check with `lspci -D`")
    return build_report(facts, assess(facts, extra=extra))
