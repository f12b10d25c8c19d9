"""Run a module of plugins/modules in this process, for the many hostile cases a subprocess per case
would make slow: its ``ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov`` imports resolve to this checkout's
gpuprov (what AnsiballZ ships), its arguments come through Ansible's own test hook, so
the argument spec's type coercion applies as on a target. tests/modules/test_modules.py runs
modules for real through ansible."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import pkgutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gpuprov
from gpuprov.apply import lock

REPO = Path(__file__).resolve().parent.parent


UTILS = "ansible_collections.gpuprov.kvm.plugins.module_utils"


def _alias_gpuprov() -> None:
    """``<collection module_utils>.gpuprov.X`` is ``gpuprov.X``: one module object each."""
    if f"{UTILS}.gpuprov" in sys.modules:
        return
    import ansible_collections

    for info in pkgutil.walk_packages(gpuprov.__path__, "gpuprov."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    # The collection's packages above module_utils, as empty packages (nothing else is in them here).
    parent: Any = ansible_collections
    for part in UTILS.split(".")[1:]:
        name = f"{parent.__name__}.{part}"
        package = sys.modules.get(name) or types.ModuleType(name)
        package.__path__ = []
        sys.modules[name] = package
        setattr(parent, part, package)
        parent = package
    for name, module in list(sys.modules.items()):
        if name == "gpuprov" or name.startswith("gpuprov."):
            sys.modules[f"{UTILS}.{name}"] = module
    parent.gpuprov = gpuprov


@contextlib.contextmanager
def _as_a_target() -> Iterator[None]:
    """The module runs as on a target, whatever ran before in this process: an earlier test that
    loaded Ansible's controller (an inventory read, ansible-doc) makes ``warn()`` print to the
    controller's display instead of returning warnings with the result, and warnings left by an
    earlier module would come back with this one's."""
    from ansible.module_utils.common import warnings

    try:  # ansible-core 2.19 on; before it (3.9's 2.15) a module never took the controller's path
        from ansible.module_utils import _internal
    except ImportError:
        _internal = types.SimpleNamespace(is_controller=False)
    controller = _internal.is_controller
    _internal.is_controller = False
    warnings._global_warnings.clear()  # a dict from 2.19, a list before: both clear()
    warnings._global_deprecations.clear()
    try:
        yield
    finally:
        _internal.is_controller = controller


def run_in_process(module: str, args: dict[str, Any], *, check: bool = False) -> dict[str, Any]:
    """The module's result (``failed`` always set), as ``ansible -m module -a args`` would give it."""
    from ansible.module_utils.testing import patch_module_args

    _alias_gpuprov()
    spec = importlib.util.spec_from_file_location(
        f"gpuprov_library_{module}", REPO / "plugins" / "modules" / f"{module}.py"
    )
    assert spec is not None and spec.loader is not None
    code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code)
    out = io.StringIO()
    params = {**args, "_ansible_check_mode": check, "_ansible_diff": True}
    with contextlib.ExitStack() as stack:
        stack.callback(lock.release)  # a module's process ends and lets go of its locks; this one goes on
        stack.enter_context(_as_a_target())
        stack.enter_context(patch_module_args(params))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.suppress(SystemExit))
        code.main()
    result = json.loads(out.getvalue())
    result.setdefault("failed", False)
    # Warnings as their text (in process they come as ansible-core's WarningSummary objects).
    result["warnings"] = [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]
    return result
