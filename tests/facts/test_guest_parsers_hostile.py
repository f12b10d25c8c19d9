"""Hostile guest files through the guest-side parsers (issue 26, items 2 and 4): daemon.json,
containerd's config.toml and drop-ins, CDI specs (JSON and YAML) and dpkg's status file.

Through their readers (read_docker_config, read_containerd_config, read_cdi_specs,
dpkg_installed), through gpuprov verify's checks (check_docker, check_containerd, check_cdi)
and through the CLI (`gpuprov verify --json --root`). Invariants: nothing raises, each read
ends within TIME_BOUND of CPU, and a file that cannot be read is an error (or unknown) naming its
path. The pathological inputs (100k blank lines, 50k-deep nesting, 10 MB files) are cases of
their own; hypothesis mutates real files on the fixed budget of tests/conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuprov.cli.main import main
from gpuprov.facts.boundedjson import MAX_JSON_DEPTH, BoundedJsonError, json_depth, loads_bounded
from gpuprov.facts.containers import (
    ContainerdConfig,
    DockerConfig,
    read_cdi_specs,
    read_containerd_config,
    read_docker_config,
)
from gpuprov.facts.packages import dpkg_installed
from gpuprov.facts.sysfs import MAX_READ_BYTES, Sysfs
from gpuprov.verify.checks_containers import check_cdi, check_containerd, check_docker
from gpuprov.verify.gather import gather
from tests.conftest import run_timed_by_cpu
from tests.fakehost import FakeHost

REPO = Path(__file__).resolve().parents[2]
# CPU seconds one read may take (each takes milliseconds; the old containerd regex took 44 s on
# 100k blank lines, json.loads raised on 50k-deep nesting), and wall seconds on a loaded CI machine.
TIME_BOUND = 5.0
WAIT_BOUND = 60.0
TEN_MB = 10_000_000

DAEMON = "etc/docker/daemon.json"
CONFIG = "etc/containerd/config.toml"
DROPIN = "etc/containerd/conf.d/99-nvidia.toml"
CDI_YAML = "etc/cdi/nvidia.yaml"
CDI_JSON = "var/run/cdi/nvidia.json"
DPKG = "var/lib/dpkg/status"

DAEMON_SEED = json.dumps(
    {
        "default-runtime": "nvidia",
        "features": {"cdi": True},
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
    },
    indent=4,
)
CONTAINERD_SEED = """version = 2
disabled_plugins = []

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    enable_cdi = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
          BinaryName = "/usr/bin/nvidia-container-runtime"
"""
DROPIN_SEED = """version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
"""
CDI_YAML_SEED = """---
cdiVersion: 0.5.0
containerEdits:
  mounts:
  - containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
    hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04
    options:
    - ro
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: "0"
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: all
kind: nvidia.com/gpu
"""
CDI_JSON_SEED = json.dumps(
    {
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}, {"name": "all"}],
        "containerEdits": {"mounts": [{"hostPath": "/usr/lib/libnvidia-ml.so.580.159.04"}]},
    }
)
DPKG_SEED = """Package: nvidia-container-toolkit
Status: install ok installed
Priority: optional
Version: 1.17.8-1
Description: NVIDIA Container toolkit
 Provides tools and utilities.

Package: docker-ce
Status: deinstall ok config-files
Version: 5:28.0.1-1~debian.12~bookworm

Package: containerd.io
Status: install ok installed
Version: 1.7.25-1
"""

_CDI_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_CDI_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


# ---------------------------------------------------------------- helpers


def timed(call: Callable[[], Any]) -> Any:
    # The work bounded in CPU time (a loaded CI machine stretches the wall clock, not the work
    # done), a wait on something that never answers in wall time, far above it.
    cpu, wall = time.process_time(), time.monotonic()
    result = call()
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    assert cpu < TIME_BOUND, f"{cpu:.1f} s of CPU"
    assert wall < WAIT_BOUND, f"{wall:.1f} s"
    return result


def guest_root(root: Path) -> FakeHost:
    """A guest root with Docker, containerd and the toolkit installed and no GPU (the checks
    judge the files alone)."""
    fake = FakeHost(root)
    for binary in ("dockerd", "containerd", "nvidia-ctk"):
        fake.write(f"usr/bin/{binary}", "")
    return fake


def reset(fake: FakeHost) -> None:
    for d in ("etc/docker", "etc/containerd", "etc/cdi", "var/run/cdi", "var/lib/dpkg"):
        shutil.rmtree(fake.root / d, ignore_errors=True)


def as_bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")


def json_parses_to_object(text: str) -> bool:
    """The oracle: what plain json.loads says (a RecursionError is "no")."""
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def check_docker_invariants(fake: FakeHost, raw: bytes) -> DockerConfig:
    cfg = timed(lambda: read_docker_config(Sysfs(str(fake.root))))
    path = "/" + DAEMON
    assert cfg.installed and cfg.daemon_json == path
    text = raw.decode("utf-8", "replace").strip()
    if cfg.error is not None:
        assert path in cfg.error and "dockerd" in cfg.error
        assert cfg.nvidia_runtime is None and cfg.cdi is False
    elif text:
        assert json_parses_to_object(text), "a daemon.json that does not parse was taken"
    for value in (cfg.nvidia_runtime, cfg.default_runtime):
        assert value is None or isinstance(value, str)
    return cfg


def check_containerd_invariants(fake: FakeHost, texts: dict[str, bytes]) -> ContainerdConfig:
    cfg = timed(lambda: read_containerd_config(Sysfs(str(fake.root))))
    assert cfg.installed
    assert sorted(cfg.files) == sorted("/" + rel for rel in texts)
    whole = b"\n".join(texts.values())
    if b"nvidia" not in whole:
        assert not cfg.nvidia_runtime
    if b"enable_cdi" not in whole:
        assert not cfg.cdi
    if b"cri" not in whole:
        assert not cfg.cri_disabled
    if cfg.error is not None:
        assert any(f"/{rel}" in cfg.error for rel in texts) or "/etc/containerd/conf.d" in cfg.error
    return cfg


def check_cdi_invariants(fake: FakeHost, files: dict[str, bytes]) -> list:
    specs = timed(lambda: read_cdi_specs(Sysfs(str(fake.root))))
    assert sorted(s.path for s in specs) == sorted("/" + rel for rel in files)
    for spec in specs:
        if spec.error is not None:
            assert isinstance(spec.error, str) and spec.error
            assert spec.kind is None and spec.devices == []
            continue
        assert spec.kind is None or (isinstance(spec.kind, str) and _CDI_KIND.fullmatch(spec.kind))
        assert all(isinstance(n, str) and _CDI_NAME.fullmatch(n) for n in spec.devices)
        text = files[spec.path[1:]].decode("utf-8", "replace").strip()
        if text.startswith("{"):
            assert json_parses_to_object(text), "a JSON spec that does not parse was taken"
    return specs


def check_dpkg_invariants(fake: FakeHost, raw: bytes) -> dict[str, str] | None:
    found = timed(lambda: dpkg_installed(Sysfs(str(fake.root))))
    if len(raw) >= MAX_READ_BYTES:
        assert found is None
        return found
    assert isinstance(found, dict)
    for name, version in found.items():
        assert isinstance(name, str) and name and "\n" not in name
        assert isinstance(version, str) and "\n" not in version
    return found


def checks(fake: FakeHost) -> dict[str, Any]:
    """check_docker, check_containerd and check_cdi on what gather read (nothing imported or run:
    the root is not /)."""
    facts = timed(lambda: gather(Sysfs(str(fake.root))))
    return {c.id: c for c in (check_docker(facts), check_containerd(facts), check_cdi(facts))}


def check_verdicts(fake: FakeHost) -> None:
    facts = timed(lambda: gather(Sysfs(str(fake.root))))
    docker, containerd, cdi = check_docker(facts), check_containerd(facts), check_cdi(facts)
    for c in (docker, containerd, cdi):
        assert c.status in ("ok", "warn", "fail", "skip")
    if facts.docker.error:
        assert docker.status == "fail" and "/" + DAEMON in docker.message
    broken = [s for s in facts.cdi if s.error]
    if broken:
        assert cdi.status == "fail" and broken[0].path in cdi.message
    if facts.containerd.error and not facts.containerd.cri_disabled:
        assert containerd.status in ("warn", "skip")
        if containerd.status == "warn":
            assert any(f in containerd.message for f in facts.containerd.files)


# ---------------------------------------------------------------- mutations (hypothesis)

_JUNK_CHARS = st.characters(blacklist_categories=("Cs",))
_SYNTAX = st.sampled_from([*list("[]{}\",:=#\n\t \\'-"), "\x00", "\x1b[31m", "\r\n", "- name:", "kind:", "\u2028"])
_FRAGMENT = st.lists(st.one_of(_SYNTAX, st.text(_JUNK_CHARS, max_size=6)), max_size=12).map("".join)


@st.composite
def mutation(draw: st.DrawFn) -> tuple:
    op = draw(st.sampled_from(["insert", "delete", "repeat", "blank", "nest", "truncate"]))
    a, b = draw(st.floats(0, 1)), draw(st.floats(0, 1))
    if op == "insert":
        return (op, a, draw(_FRAGMENT))
    if op == "repeat":
        return (op, a, b, draw(st.integers(2, 2000)))
    if op == "blank":
        return (op, a, draw(st.sampled_from(["\n", "\n  \n", "\r\n", " \n\t\n"])), draw(st.integers(1, 50_000)))
    if op == "nest":
        return (op, a, draw(st.sampled_from(["[", "{", '{"a":', "- ", "  "])), draw(st.integers(1, 60_000)))
    return (op, a, b)


def mutate(seed: str, ops: list[tuple]) -> str:
    text = seed
    for op in ops:
        i = int(op[1] * len(text))
        if op[0] == "insert":
            text = text[:i] + op[2] + text[i:]
        elif op[0] == "delete":
            j = int(op[2] * len(text))
            text = text[: min(i, j)] + text[max(i, j) :]
        elif op[0] == "repeat":
            j = int(op[2] * len(text))
            piece = text[min(i, j) : max(i, j)][:200]
            text = text[:i] + piece * op[3] + text[i:]
        elif op[0] == "blank":
            text = text[:i] + op[2] * op[3] + text[i:]
        elif op[0] == "nest":
            text = text[:i] + op[2] * op[3] + text[i:]
        else:
            text = text[:i]
    return text


_JSON_JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(_JUNK_CHARS, max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def json_with_junk(draw: st.DrawFn, seed: str) -> str:
    """The seed document with one value somewhere in it replaced by a value of any type."""
    data = json.loads(seed)
    node: Any = data
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = draw(st.sampled_from(keys))
        child = node[key]
        if isinstance(child, (dict, list)) and draw(st.booleans()):
            node = child
            continue
        node[key] = draw(_JSON_JUNK)
        break
    return json.dumps(data)


def text_from(seed: str) -> st.SearchStrategy[str]:
    return st.lists(mutation(), min_size=1, max_size=4).map(lambda ops: mutate(seed, ops))


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return guest_root(tmp_path / "root")


@given(st.one_of(text_from(DAEMON_SEED), json_with_junk(DAEMON_SEED)))
def test_mutated_daemon_json(host, text) -> None:
    reset(host)
    raw = as_bytes(text)
    host.write(DAEMON, raw)
    check_docker_invariants(host, raw)
    check_verdicts(host)


@given(text_from(CONTAINERD_SEED), st.none() | text_from(DROPIN_SEED))
def test_mutated_containerd_config(host, config, dropin) -> None:
    reset(host)
    texts = {CONFIG: as_bytes(config)}
    if dropin is not None:
        texts[DROPIN] = as_bytes(dropin)
    for rel, raw in texts.items():
        host.write(rel, raw)
    check_containerd_invariants(host, texts)
    check_verdicts(host)


@given(
    st.one_of(text_from(CDI_YAML_SEED), st.just(CDI_YAML_SEED)),
    st.one_of(text_from(CDI_JSON_SEED), json_with_junk(CDI_JSON_SEED)),
)
def test_mutated_cdi_specs(host, yaml_text, json_text) -> None:
    reset(host)
    files = {CDI_YAML: as_bytes(yaml_text), CDI_JSON: as_bytes(json_text)}
    for rel, raw in files.items():
        host.write(rel, raw)
    check_cdi_invariants(host, files)
    check_verdicts(host)


@given(text_from(DPKG_SEED))
def test_mutated_dpkg_status(host, text) -> None:
    reset(host)
    raw = as_bytes(text)
    host.write(DPKG, raw)
    check_dpkg_invariants(host, raw)


@given(st.one_of(_FRAGMENT, text_from(DAEMON_SEED), text_from(CDI_JSON_SEED)))
def test_loads_bounded_agrees_with_json_or_refuses(text) -> None:
    try:
        value = timed(lambda: loads_bounded(text))
    except BoundedJsonError:
        return
    assert json.dumps(value) == json.dumps(json.loads(text))
    assert json_depth(text) <= MAX_JSON_DEPTH


# ---------------------------------------------------------------- the pathological cases, each on its own

DEEP_ARRAY = "[" * 50_000 + "]" * 50_000
DEEP_OBJECT = '{"a":' * 50_000 + "1" + "}" * 50_000
BLANKS = "\n" * 100_000

DAEMON_CASES = {
    "50k-deep array": DEEP_ARRAY,
    "50k-deep object": DEEP_OBJECT,
    "50k-deep inside runtimes": '{"runtimes": ' + DEEP_ARRAY + "}",
    "10 MB string": '{"a": "' + "x" * TEN_MB + '"}',
    "100k blank lines inside": '{"runtimes":' + BLANKS + '{"nvidia": ' + BLANKS + '{"path": 5}}}',
    "unterminated escapes": '{"a": "' + '\\"' * 500_000,
    "a million-digit number": '{"a": ' + "9" * 1_000_000 + "}",
    "an array": "[1, 2]",
    "runtimes a number": '{"runtimes": 5}',
    "runtimes.nvidia a list": '{"runtimes": {"nvidia": [1]}}',
    "path a number": '{"runtimes": {"nvidia": {"path": 5}}}',
    "features.cdi a string": '{"features": {"cdi": "yes"}}',
    "default-runtime an object": '{"default-runtime": {}}',
    "not UTF-8": b'{"runtimes": {"nvidia": {"path": "\xff\xfe"}}',
}


@pytest.mark.parametrize("text", list(DAEMON_CASES.values()), ids=list(DAEMON_CASES))
def test_hostile_daemon_json(host, text) -> None:
    raw = as_bytes(text)
    host.write(DAEMON, raw)
    cfg = check_docker_invariants(host, raw)
    assert cfg.error is not None and cfg.error.startswith("/etc/docker/daemon.json ")
    assert "dockerd" in cfg.error
    docker = checks(host)["docker-runtime"]
    assert docker.status == "fail" and "/etc/docker/daemon.json" in docker.message


def containerd_blank_lines() -> dict[str, str]:
    return {CONFIG: "version = 2\n" + BLANKS + "enable_cdi = true\n" + BLANKS + "[plugins]\n"}


CONTAINERD_CASES: dict[str, Callable[[], dict[str, str | bytes]]] = {
    "100k blank lines": containerd_blank_lines,
    "100k blank lines in a drop-in": lambda: {CONFIG: "version = 3\n", DROPIN: BLANKS + DROPIN_SEED + BLANKS},
    "1M lines of spaces": lambda: {CONFIG: "version = 2\n" + " \n" * 500_000 + "x = 1\n"},
    "10 MB": lambda: {CONFIG: "version = 2\n" + "#" * TEN_MB + "\nenable_cdi = true\n"},
    "a 1 MB table header": lambda: {CONFIG: "[plugins" + ".runtimes.nvidia" * 65_000 + "\n"},
    "disabled_plugins never closed": lambda: {CONFIG: "disabled_plugins = [\n" + '  "x",\n' * 100_000},
    "50k-deep arrays": lambda: {CONFIG: "a = " + DEEP_ARRAY + "\n"},
    "not UTF-8": lambda: {CONFIG: b"version = 2\n\xff\xfe[plugins\x00]\n"},
}


@pytest.mark.parametrize("make", list(CONTAINERD_CASES.values()), ids=list(CONTAINERD_CASES))
def test_hostile_containerd_config(host, make) -> None:
    texts = {rel: as_bytes(t) for rel, t in make().items()}
    for rel, raw in texts.items():
        host.write(rel, raw)
    check_containerd_invariants(host, texts)
    check = checks(host)["containerd-runtime"]
    assert check.status in ("ok", "warn", "skip")
    if check.status == "warn":
        assert "/etc/containerd/config.toml" in check.message


def test_containerd_blank_lines_keep_their_meaning(host) -> None:
    host.write(CONFIG, containerd_blank_lines()[CONFIG])
    assert read_containerd_config(Sysfs(str(host.root))).cdi is True
    host.write(CONFIG, "version = 2\n" + BLANKS + 'disabled_plugins = [\n  "io.containerd.grpc.v1.cri",\n]\n')
    assert read_containerd_config(Sysfs(str(host.root))).cri_disabled is True
    host.write(DROPIN, BLANKS + DROPIN_SEED)
    assert read_containerd_config(Sysfs(str(host.root))).nvidia_runtime is True


def test_an_oversized_containerd_config_is_an_error_naming_it(host) -> None:
    host.write(CONFIG, "version = 2\n" + "#" * TEN_MB + "\nenable_cdi = true\n")
    cfg = read_containerd_config(Sysfs(str(host.root)))
    assert cfg.error and cfg.error.startswith("/etc/containerd/config.toml is not read")
    assert not cfg.cdi  # unknown reads as "not configured"
    check = checks(host)["containerd-runtime"]
    assert check.status == "warn" and "/etc/containerd/config.toml" in check.message


def test_too_many_containerd_dropins(host) -> None:
    for i in range(70):
        host.write(f"etc/containerd/conf.d/{i:02}.toml", "version = 3\n")
    cfg = timed(lambda: read_containerd_config(Sysfs(str(host.root))))
    assert cfg.error and "/etc/containerd/conf.d has 70 drop-in files" in cfg.error
    assert len(cfg.files) == 64


def yaml_spec(devices: str, kind: str = "nvidia.com/gpu") -> str:
    return f"cdiVersion: 0.5.0\nkind: {kind}\ndevices:\n{devices}"


CDI_CASES: dict[str, tuple[str, str | bytes]] = {
    "devices a number": (CDI_JSON, '{"kind": "nvidia.com/gpu", "devices": 5}'),
    "devices an object": (CDI_JSON, '{"kind": "nvidia.com/gpu", "devices": {"name": "0"}}'),
    "a device a string": (CDI_JSON, '{"kind": "nvidia.com/gpu", "devices": ["0"]}'),
    "a name a number": (CDI_JSON, '{"kind": "nvidia.com/gpu", "devices": [{"name": 0}]}'),
    "a name missing": (CDI_JSON, '{"kind": "nvidia.com/gpu", "devices": [{"containerEdits": {}}]}'),
    "a name with an escape": (CDI_JSON, '{"kind": "nvidia.com/gpu", "devices": [{"name": "0\\u001b[2J"}]}'),
    "kind a number": (CDI_JSON, '{"kind": 5, "devices": [{"name": "0"}]}'),
    "kind a list": (CDI_JSON, '{"kind": ["nvidia.com/gpu"], "devices": []}'),
    "kind without a class": (CDI_JSON, '{"kind": "nvidia.com", "devices": [{"name": "0"}]}'),
    "not an object": (CDI_JSON, '["nvidia.com/gpu"]'),
    "an empty object": (CDI_JSON, "{}"),
    "50k-deep JSON": (CDI_JSON, '{"kind": "nvidia.com/gpu", "containerEdits": ' + DEEP_ARRAY + "}"),
    "50k-deep JSON devices": (CDI_JSON, '{"devices": ' + DEEP_OBJECT + "}"),
    "10 MB JSON": (CDI_JSON, '{"kind": "nvidia.com/gpu", "a": "' + "x" * TEN_MB + '"}'),
    "9000 devices": (CDI_JSON, json.dumps({"kind": "nvidia.com/gpu", "devices": [{"name": "0"}] * 9000})),
    "YAML kind a flow list": (CDI_YAML, yaml_spec('- name: "0"\n', kind="[nvidia.com/gpu]")),
    "YAML kind empty": (CDI_YAML, yaml_spec('- name: "0"\n', kind="")),
    "YAML name a mapping": (CDI_YAML, yaml_spec("- name: {a: 1}\n")),
    "YAML name with a control character": (CDI_YAML, yaml_spec('- name: "a\x1b[31m"\n')),
    "YAML 10 MB": (CDI_YAML, yaml_spec("- name: x" + "y" * TEN_MB + "\n")),
    "YAML 100k blank lines, then a bad name": (CDI_YAML, yaml_spec(BLANKS + "- name: a b\n" + BLANKS)),
    "YAML 50k-deep indentation": (
        CDI_YAML,
        yaml_spec("".join(" " * i + "- name: a:\n" for i in range(0, 3000, 1)) + "- name: ''\n"),
    ),
    "YAML not UTF-8": (CDI_YAML, b"kind: nvidia.com/gpu\ndevices:\n- name: \xff\xfe\n"),
    "YAML no kind and no devices": (CDI_YAML, BLANKS + "hello: world\n" * 1000),
}


@pytest.mark.parametrize(("rel", "text"), list(CDI_CASES.values()), ids=list(CDI_CASES))
def test_hostile_cdi_spec(host, rel, text) -> None:
    raw = as_bytes(text)
    host.write(rel, raw)
    (spec,) = check_cdi_invariants(host, {rel: raw})
    assert spec.path == "/" + rel and spec.error, spec
    cdi = checks(host)["cdi-spec"]
    assert cdi.status == "fail" and cdi.message.startswith(f"/{rel}: ")
    assert "\x1b" not in cdi.message


def test_a_cdi_spec_after_100k_blank_lines_is_still_read(host) -> None:
    host.write(CDI_YAML, yaml_spec(BLANKS + '- name: "0"\n' + BLANKS + "- name: all\n"))
    (spec,) = read_cdi_specs(Sysfs(str(host.root)))
    assert spec.error is None and spec.devices == ["0", "all"]


def test_too_many_cdi_specs(host) -> None:
    for i in range(70):
        host.write(f"etc/cdi/s{i:02}.yaml", yaml_spec(f"- name: '{i}'\n"))
    specs = timed(lambda: read_cdi_specs(Sysfs(str(host.root))))
    assert specs[0].path == "/etc/cdi" and "70 spec files" in (specs[0].error or "")
    assert len(specs) == 65


def over_the_read() -> bytes:
    return DPKG_SEED.encode() + b"\n" * MAX_READ_BYTES


DPKG_CASES: dict[str, Callable[[], str | bytes]] = {
    "100k blank lines": lambda: BLANKS + DPKG_SEED + BLANKS,
    "10 MB of blank lines": lambda: "\n" * TEN_MB + DPKG_SEED,
    "10 MB of one-line stanzas": lambda: "x\n\n" * (TEN_MB // 3) + DPKG_SEED,
    "10 MB of Package lines": lambda: "Package: a\n" * (TEN_MB // 11),
    "one 10 MB line": lambda: "Package: " + "a" * TEN_MB + "\nStatus: install ok installed\n",
    "larger than a read": over_the_read,
    "binary junk": lambda: bytes(range(256)) * 1000,
    "stanzas without Package": lambda: "Status: install ok installed\nVersion: 1\n\n" * 1000,
    "CRLF": lambda: DPKG_SEED.replace("\n", "\r\n"),
}


@pytest.mark.parametrize("make", list(DPKG_CASES.values()), ids=list(DPKG_CASES))
def test_hostile_dpkg_status(host, make) -> None:
    raw = as_bytes(make())
    host.write(DPKG, raw)
    check_dpkg_invariants(host, raw)


def test_dpkg_status_meaning_survives_blank_lines(host) -> None:
    expected = {"nvidia-container-toolkit": "1.17.8-1", "containerd.io": "1.7.25-1"}
    for text in (DPKG_SEED, BLANKS + DPKG_SEED.replace("\n\n", "\n \t\n" + BLANKS) + BLANKS):
        host.write(DPKG, text)
        assert dpkg_installed(Sysfs(str(host.root))) == expected
    host.write(DPKG, over_the_read())
    assert dpkg_installed(Sysfs(str(host.root))) is None  # unknown, not a partial list


# ---------------------------------------------------------------- the CLI


def hostile_guest(fake: FakeHost, files: dict[str, str | bytes]) -> Path:
    for rel, text in files.items():
        fake.write(rel, text)
    return fake.root


CLI_CASES: dict[str, tuple[dict[str, str | bytes], str, str]] = {
    "50k-deep daemon.json": ({DAEMON: DEEP_ARRAY}, "docker-runtime", "/etc/docker/daemon.json"),
    "10 MB daemon.json": ({DAEMON: '{"a": "' + "x" * TEN_MB + '"}'}, "docker-runtime", "/etc/docker/daemon.json"),
    "daemon.json path a number": (
        {DAEMON: '{"runtimes": {"nvidia": {"path": 5}}}'},
        "docker-runtime",
        "/etc/docker/daemon.json",
    ),
    "containerd 100k blank lines": (
        {CONFIG: "version = 2\n" + BLANKS + "[plugins]\n"},
        "containerd-runtime",
        "/etc/containerd/config.toml",
    ),
    "containerd 10 MB": ({CONFIG: "#" * TEN_MB}, "containerd-runtime", "/etc/containerd/config.toml"),
    "CDI devices 5": ({CDI_JSON: '{"kind": "nvidia.com/gpu", "devices": 5}'}, "cdi-spec", "/var/run/cdi/nvidia.json"),
    "CDI 50k deep": ({CDI_JSON: '{"devices": ' + DEEP_ARRAY + "}"}, "cdi-spec", "/var/run/cdi/nvidia.json"),
    "CDI YAML kind a list": ({CDI_YAML: yaml_spec("- name: '0'\n", kind="[a]")}, "cdi-spec", "/etc/cdi/nvidia.yaml"),
}


@pytest.mark.parametrize(("files", "check_id", "path"), list(CLI_CASES.values()), ids=list(CLI_CASES))
def test_verify_cli_on_a_hostile_guest(host, files, check_id, path, capsys) -> None:
    root = hostile_guest(host, files)
    rc = timed(lambda: main(["verify", "--json", "--root", str(root)]))
    out, err = capsys.readouterr()
    assert rc in (0, 1), err
    assert "Traceback" not in out + err and "unexpected" not in err
    report = json.loads(out)
    (check,) = [c for c in report["checks"] if c["id"] == check_id]
    assert check["status"] in ("fail", "warn") and path in check["message"], check


def test_verify_cli_subprocess_on_every_hostile_file_at_once(host) -> None:
    """As a user runs it: one guest holding a hostile file of each kind, no traceback, exit 1."""
    root = hostile_guest(
        host,
        {
            DAEMON: DEEP_OBJECT,
            CONFIG: "version = 2\n" + BLANKS + "[plugins]\n",
            DROPIN: "#" * TEN_MB,
            CDI_JSON: '{"kind": "nvidia.com/gpu", "devices": 5}',
            CDI_YAML: yaml_spec(BLANKS + "- name: {a: 1}\n"),
            DPKG: "\n" * TEN_MB,
        },
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("GPUPROV_DEBUG", None)
    proc, cpu = run_timed_by_cpu(
        [sys.executable, "-m", "gpuprov", "verify", "--json", "--root", str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=WAIT_BOUND,
    )
    # The parsers' work as timed() bounds it in process, plus a Python start and gpuprov's imports.
    assert cpu < TIME_BOUND + 5, f"{cpu:.1f} s of CPU"
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and "unexpected" not in proc.stderr
    status = {c["id"]: (c["status"], c["message"]) for c in json.loads(proc.stdout)["checks"]}
    assert status["docker-runtime"][0] == "fail" and "/etc/docker/daemon.json" in status["docker-runtime"][1]
    assert status["cdi-spec"][0] == "fail"
    assert status["containerd-runtime"][0] in ("warn", "skip")
