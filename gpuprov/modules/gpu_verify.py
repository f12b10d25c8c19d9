"""gpu_verify's options and its run: ``gpuprov verify``'s checks (:mod:`gpuprov.verify`) on the
target, the options meeting the command line's rules (:mod:`gpuprov.verify.options`, in the
module's words), and the result and failure the module reports (:mod:`gpuprov.report.verify`).

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

from typing import Any

from ..facts.sysfs import Sysfs
from ..report.verify import build_report, module_result
from ..verify.checks import evaluate
from ..verify.gather import gather
from ..verify.options import module_words, nvml_for, option_error, root_error

ARGUMENT_SPEC: dict[str, Any] = {
    "root": {"type": "path", "default": "/"},
    "container": {"type": "bool", "default": True},
    "image": {"type": "str"},
    "bench": {"type": "bool", "default": False},
    "gpu_source": {"type": "str", "choices": ["auto", "nvml", "nvidia-smi"], "default": "auto"},
    "fail_on": {
        "type": "list",
        "elements": "str",
        "choices": ["fail", "warn", "skip"],
        "default": ["fail"],
    },
}


def verify(module: Any) -> tuple[dict[str, Any], str | None]:
    """The checks run for ``module``'s params (no container and no bench in check mode): the module's
    result, and why it fails (None: it passes, per ``fail_on``). The module fails, nothing run, on
    options the command line would refuse too."""
    p = module.params
    sysfs = Sysfs(p["root"])
    error = option_error(sysfs.live, bench=p["bench"], image=p["image"], gpu_source=p["gpu_source"])
    if error:
        module.fail_json(msg=f"bad options, nothing was run: {module_words(error)}")
    error = root_error(sysfs, p["root"])
    if error:
        module.fail_json(msg=error)
    nvml = nvml_for(p["gpu_source"])
    if nvml is None:
        module.fail_json(msg="gpu_source nvml: pynvml is not importable on the target; pip install nvidia-ml-py")
    facts = gather(
        sysfs,
        nvml=nvml,
        gpu_source=p["gpu_source"],
        run_container=p["container"] and not module.check_mode,
        image=p["image"],
        bench=p["bench"] and not module.check_mode,
        no_container_reason="not asked to (container: false)"
        if not p["container"]
        else "check mode: no container is started",
    )
    return module_result(build_report(facts, evaluate(facts)), p["fail_on"])
