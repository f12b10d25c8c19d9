"""The house's rules in one place (docs/development/layout.md, generated from them): the layers
of the gpuprov package in import order, and who may write. tests/house/test_layers.py checks the tree
against them; dev/tools/gen_reference.py writes layout.md from them and the tree's docstrings."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "gpuprov"

# Bottom to top: a module may import its own layer and the ones before it, never one after.
LAYERS = ("core", "facts", "rules", "inputs", "verify", "plan", "model", "apply", "report", "modules", "cli")
# Modules of the package's top: the interpreter's entry and the import-time bytecode cache.
TOP = {"gpuprov", "gpuprov.__main__", "gpuprov.bytecode_cache"}

# Calls that change the file system or run a command. Reads (open for reading, listdir, lstat) are not.
WRITE_CALLS = {
    "os.write",
    "os.replace",
    "os.rename",
    "os.unlink",
    "os.remove",
    "os.rmdir",
    "os.makedirs",
    "os.mkdir",
    "os.symlink",
    "os.chmod",
    "os.chown",
    "os.truncate",
    "shutil.rmtree",
    "shutil.copy",
    "shutil.copy2",
    "shutil.copyfile",
    "shutil.copytree",
    "shutil.move",
    "tempfile.mkstemp",
    "tempfile.mkdtemp",
    "subprocess.run",
    "subprocess.Popen",
    "subprocess.check_output",
    "subprocess.check_call",
    "subprocess.call",
}
WRITE_METHODS = {"write_text", "write_bytes", "mkdir", "unlink", "rmdir", "touch", "symlink_to"}

# Writers outside apply/, each with why it may. A file that no longer writes must leave this list.
ALLOWED_WRITERS = {
    # Reading commands: each runs a read-only tool (its argv is fixed in the file) and parses it.
    "gpuprov/facts/boot.py": "runs `grubby --info=DEFAULT` (a read) on RHEL-like hosts",
    "gpuprov/facts/bootloader.py": "runs the trial record's check command (a read) and nothing else",
    "gpuprov/facts/mig.py": "runs `nvidia-smi mig -lgi/-lci` (reads) through one runner",
    "gpuprov/facts/gpus.py": "runs `nvidia-smi -q -x` (a read)",
    "gpuprov/facts/mps.py": "runs `nvidia-smi --query-gpu` and the MPS control daemon's get_* queries (reads; "
    "facts.mps.QUERIES is the whole list, any other refused)",
    "gpuprov/cli/bounded.py": "runs a reader of untrusted input (Ansible's loader, ansible-playbook over a fleet) as a "
    "child bounded in time, memory and output; the child writes only its own temporary stdout and stderr",
    "gpuprov/cli/capture.py": "runs the capture's read-only commands (lspci, dmesg...) into the tarball it writes",
    # The command line's own output, where the user asked for it.
    "gpuprov/cli/topology.py": "writes the SVG picture to the path given with --svg",
    "gpuprov/cli/fleet.py": "runs ansible-playbook (the fleet report's play, read-only on the hosts) and writes "
    "the page and the metrics to the paths given with --html and --prom (each whole, through a temporary file)",
    "gpuprov/cli/rootfs.py": "unpacks a capture into a private (0700) temporary directory it removes after",
    # Scratch of one process.
    "gpuprov/bytecode_cache.py": "caches compiled bytecode in its own cache directory (import time)",
    "gpuprov/verify/container.py": "stages the bench script for its short-lived container in a private temp dir",
    "gpuprov/verify/sharing_bench.py": "stages the tenant load script for its short-lived containers in a private "
    "temp dir",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def imports(module: str) -> list[tuple[str, int]]:
    """(gpuprov module imported, line) for every import in ``module``, relative ones resolved."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [f"{target}.{a.name}" for a in node.names] + [target]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        for name in candidates:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.append((name, node.lineno))
                break
    return found


def writes(path: Path) -> list[str]:
    """``line: call`` for every call in ``path`` that changes files or runs a command."""
    aliases = {}
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil", "tempfile", "subprocess"):
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            name = f"{func.value.id}.{func.attr}"
        elif isinstance(func, ast.Name):
            name = aliases.get(func.id)
        if name in WRITE_CALLS:
            found.append(f"{node.lineno}: {name}")
        elif isinstance(func, ast.Attribute) and func.attr in WRITE_METHODS:
            found.append(f"{node.lineno}: .{func.attr}()")
        elif isinstance(func, ast.Name) and func.id == "open" and _open_mode(node) not in ("r", "rb", "rt"):
            found.append(f"{node.lineno}: open(..., {_open_mode(node)!r})")
    return found


def _open_mode(call: ast.Call) -> str:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        return "r"
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "<computed>"
