"""Every module of the collection gpuprov.kvm: DOCUMENTATION, EXAMPLES and RETURN parse;
the documented options, doc fragments merged as ``ansible-doc`` shows them, are exactly the
argument spec's; attributes, FQCN examples, the shared fragments and RETURN entries."""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuprov.core.vm_spec import VM_KEYS
from tests.conftest import collections_path

REPO = Path(__file__).resolve().parents[2]
FQCN = "gpuprov.kvm"
# Every module lives in plugins/modules (the collection's), none in a role's own library/.
MODULE_FILES = {p.stem: p for p in (REPO / "plugins" / "modules").glob("*.py")}
MODULES = sorted(MODULE_FILES)
FRAGMENTS = REPO / "plugins" / "doc_fragments"
ANSIBLE_DOC = shutil.which("ansible-doc", path=str(Path(sys.executable).parent)) or shutil.which("ansible-doc")


def module_parts(name: str) -> tuple[dict[str, str], dict[str, dict[str, Any]], set[str]]:
    """(DOCUMENTATION/EXAMPLES/RETURN texts, argument spec, names of the functions main() calls)."""
    tree = ast.parse(MODULE_FILES[name].read_text())
    docs: dict[str, str] = {}
    calls: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
                    docs[target.id] = node.value.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            calls.add(node.func.id)
    return docs, argument_spec(name), calls


# Run in a fresh interpreter: this one may have imported another ``ansible_collections`` (ansible's
# own, from site-packages) before, which the collection's modules cannot be imported from.
_CAPTURE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import importlib
class Constructed(Exception):
    pass
def capture(**kwargs):
    raise Constructed(kwargs)
specs = {}
for name in sys.argv[2:]:
    module = importlib.import_module("ansible_collections.gpuprov.kvm.plugins.modules." + name)
    module.AnsibleModule = capture
    try:
        module.main()
    except Constructed as built:
        specs[name] = built.args[0]["argument_spec"]
print(json.dumps(specs))
"""


@functools.cache
def argument_specs() -> dict[str, dict[str, dict[str, Any]]]:
    """The spec each module's main() gives AnsibleModule (some keep it in module_utils, shared with
    gpu_host_plan), captured from the built collection as ansible-test's validate-modules does."""
    cmd = [sys.executable, "-c", _CAPTURE, str(collections_path()), *MODULES]
    proc = subprocess.run(cmd, cwd="/", capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def argument_spec(name: str) -> dict[str, dict[str, Any]]:
    specs = argument_specs()
    assert name in specs, f"{name}: main() built no AnsibleModule"
    return specs[name]


def fragment(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"fragment_{name}", FRAGMENTS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ModuleDocFragment


@pytest.fixture(scope="session")
def merged() -> dict[str, dict[str, Any]]:
    """``ansible-doc --json`` of every module from the checkout's collection: name -> doc, fragments merged."""
    assert ANSIBLE_DOC, "ansible-doc is not installed: scripts/test.sh installs the test extra"
    collections_path()
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    cmd = [ANSIBLE_DOC, "--json", "-t", "module", *(f"{FQCN}.{m}" for m in MODULES)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert sorted(data) == [f"{FQCN}.{m}" for m in MODULES]
    return {key.rsplit(".", 1)[1]: value for key, value in data.items()}


def test_there_are_modules() -> None:
    assert MODULES == [
        "apt_components",
        "apt_keyring",
        "gpu_fleet_facts",
        "gpu_host_drain",
        "gpu_host_facts",
        "gpu_host_model",
        "gpu_host_plan",
        "gpu_verify",
        "gpu_vgpu",
        "gpu_vm",
        "gpu_vm_host",
        "guest_driver",
        "guest_sharing",
        "guest_toolkit",
        "iommu_boot",
        "kernel_cmdline",
        "vfio_bind",
    ]
    assert not (REPO / "library").exists(), "modules go in plugins/modules, the collection's"
    assert not list(REPO.glob("roles/*/library")), "modules go in plugins/modules, one place for all"


@pytest.mark.parametrize("name", MODULES)
def test_module_documentation_is_complete(name: str, merged: dict[str, dict[str, Any]]) -> None:
    docs, spec, _calls = module_parts(name)
    assert set(docs) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}
    doc = merged[name]["doc"]
    assert doc["module"] == name and doc["collection"] == FQCN
    assert doc["short_description"] and doc["description"] and doc["author"]
    assert set(doc["options"]) == set(spec)
    for option, body in doc["options"].items():
        assert body.get("description") and body.get("type"), f"{name}: option {option} lacks description or type"
        assert body["type"] == spec[option].get("type", "str"), f"{name}: option {option}: type differs from the spec"
        assert body.get("default") == spec[option].get("default"), f"{name}: option {option}: default differs"
    examples = yaml.safe_load(docs["EXAMPLES"])
    assert examples and any(f"{FQCN}.{name}" in task for task in examples)
    for task in examples:
        modules = [k for k in task if "." in k]
        assert modules and all(m == f"{FQCN}.{name}" or m.startswith("ansible.builtin.") for m in modules), task
    returns = yaml.safe_load(docs["RETURN"])
    assert returns and all(v.get("description") and v.get("returned") and v.get("type") for v in returns.values())
    for see in doc.get("seealso", []):
        assert "module" not in see or see["module"].startswith(f"{FQCN}."), f"{name}: seealso {see} is not FQCN"


@pytest.mark.parametrize("name", MODULES)
def test_attributes_say_check_mode_diff_mode_and_platform(name: str, merged: dict[str, dict[str, Any]]) -> None:
    attributes = merged[name]["doc"]["attributes"]
    assert {"check_mode", "diff_mode", "platform"} <= set(attributes)
    assert attributes["check_mode"]["support"] == "full"  # every module declares supports_check_mode
    assert attributes["diff_mode"]["support"] in ("full", "none")
    assert attributes["platform"]["platforms"] == "posix"
    if name == "gpu_host_facts":
        assert attributes["facts"]["support"] == "full"


@pytest.mark.parametrize("name", MODULES)
def test_shared_options_and_results_come_from_the_fragments(name: str) -> None:
    docs, spec, calls = module_parts(name)
    doc = yaml.safe_load(docs["DOCUMENTATION"])
    extends = doc.get("extends_documentation_fragment", [])
    assert "ansible.builtin.action_common_attributes" in extends
    if "root" in spec:
        assert f"{FQCN}.root" in extends
        # type and default are the fragment's; a module may only say more about what root means to it
        assert set(doc["options"].get("root", {})) <= {"description"}
    if calls & {"finish", "finish_vm"}:  # modules.common.finish / virt.finish_vm: the plan, not_run, refusals result
        assert f"{FQCN}.plan" in extends
        shared = yaml.safe_load(fragment("plan").RETURN)
        returns = yaml.safe_load(docs["RETURN"])
        for key, want in shared.items():
            got = {k: v for k, v in returns[key].items() if k != "sample"}
            assert got == want, f"{name}: RETURN {key} differs from plugins/doc_fragments/plan.py's RETURN"


def test_gpu_vm_documents_every_key_of_a_vm_entry(merged: dict[str, dict[str, Any]]) -> None:
    """The vm suboptions are the keys gpuprov.inputs.vm_list.parse_vm accepts (and so are gpuprov plan's)."""
    suboptions = merged["gpu_vm"]["doc"]["options"]["vm"]["suboptions"]
    assert set(suboptions) == set(VM_KEYS)
    assert all(body.get("description") and body.get("type") for body in suboptions.values())
