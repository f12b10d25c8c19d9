"""Read a YAML file a person gave gpuprov: safely, and bounded in size, depth and alias expansion.

Every YAML file gpuprov reads itself goes through :func:`read_yaml` (``gpuprov
plan``'s host_vars file; Ansible parses YAML for the modules). The limits
(docs/reference/inputs.md, "YAML files"):

- a regular file of at most :data:`MAX_BYTES` (a FIFO or device is refused, never opened for a read that blocks);
- UTF-8 (a BOM is allowed); anything else is refused naming the byte offset;
- PyYAML's safe loader (plain data: no Python objects), one document;
- at most :data:`MAX_DEPTH` levels of nesting (PyYAML's composer recurses);
- at most :data:`MAX_NODES` nodes *after* aliases are expanded: anchors and
  aliases (``<<: *defaults``) are fine, an alias bomb (a few hundred bytes that
  expand to billions of nodes) is refused while it is being read. A recursive
  alias is refused too;
- integers of at most :data:`MAX_INT_DIGITS` digits, refused before ``int()`` sees them, the
  same on every Python: Python's own limit (3.11, late 3.9 and 3.10 releases) is not in Debian
  11's 3.9.2 or early 3.10s, where ``int()`` of a 1 MiB integer takes seconds (quadratic).

CLI side only: PyYAML is not in the standard library.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..facts.files import NotRegular, TooLarge, read_regular

MAX_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_NODES = 250_000
MAX_INT_DIGITS = 4300  # Python's default int_max_str_digits


class YamlInputError(ValueError):
    """The file cannot be taken: the message names the file, the problem and the fix."""


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts nodes as they would be expanded (an alias counts as its whole
    anchored tree) and the nesting depth, and stops past the limits."""

    max_nodes = MAX_NODES

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._nodes = 0
        self._depth = 0
        self._anchor_sizes: dict[str, int] = {}  # anchor -> expanded node count, once composed

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > self.max_nodes:
            raise yaml.YAMLError(
                f"more than {self.max_nodes} values once aliases are expanded ({_where(mark)}): "
                "an alias bomb, or a file far larger than any host's"
            )

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.anchors and event.anchor not in self._anchor_sizes:
                raise yaml.YAMLError(f"alias *{event.anchor} refers to itself ({_where(event.start_mark)})")
            self._count(self._anchor_sizes.get(event.anchor, 0), event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise yaml.YAMLError(f"nested more than {MAX_DEPTH} levels deep ({_where(event.start_mark)})")
        before = self._nodes
        self._count(1, event.start_mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if event.anchor is not None:
            self._anchor_sizes[event.anchor] = self._nodes - before
        return node

    def construct_yaml_int(self, node: Any) -> int:
        digits = sum(c.isalnum() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise yaml.YAMLError(
                f"an integer of {digits} digits ({_where(node.start_mark)}): more than {MAX_INT_DIGITS}, "
                "far past any value a host has"
            )
        return int(super().construct_yaml_int(node))


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


class _InventoryLoader(_BoundedLoader):
    """The same bounds for an Ansible inventory's YAML, larger (a fleet's inventory is one file), with
    Ansible's own tags taken as plain values: ``!vault`` (ciphertext: only Ansible holds the secret)
    and ``!unsafe`` (a value never templated)."""

    max_nodes = 5_000_000

    def construct_tagged(self, node: Any) -> Any:
        if isinstance(node, yaml.SequenceNode):
            return self.construct_sequence(node, deep=True)
        if isinstance(node, yaml.MappingNode):
            return self.construct_mapping(node, deep=True)
        return self.construct_scalar(node)


for _tag in ("!vault", "!vault-encrypted", "!unsafe"):
    _InventoryLoader.add_constructor(_tag, _InventoryLoader.construct_tagged)


def read_yaml(path: str, *, max_bytes: int = MAX_BYTES, inventory: bool = False) -> Any:
    """The one YAML document in ``path``, as plain data; :class:`YamlInputError` when it cannot be taken.
    ``inventory``: a file of an Ansible inventory (its tags taken, more values allowed)."""
    try:
        data = read_regular(path, max_bytes)
    except NotRegular:
        raise YamlInputError(f"{path} is not a regular file: give a YAML file") from None
    except TooLarge as exc:
        size = f"{exc.size} bytes, " if exc.size is not None else ""
        raise YamlInputError(f"{path} is {size}more than {max_bytes} bytes: give the host's own file") from None
    except OSError as exc:
        raise YamlInputError(f"cannot read {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlInputError(
            f"{path} is not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start}; save the file as UTF-8"
        ) from None
    loader = None
    try:
        stream = text.removeprefix("\ufeff")  # its reader refuses control characters here
        loader = _InventoryLoader(stream) if inventory else _BoundedLoader(stream)
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        if "!vault" in str(exc):  # an Ansible vault-encrypted value: Ansible's loader holds the secret
            raise YamlInputError(
                f"{path} holds vault-encrypted values (!vault), which only Ansible can read: give the inventory "
                "instead, -i INVENTORY --host HOST (with --vault-password-file FILE or --vault-id as to "
                "ansible-playbook)"
            ) from None
        where = str(exc).replace('"<unicode string>"', f'"{path}"')  # the file, its line and column
        raise YamlInputError(f"{path} is not valid YAML: {where}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        # Values PyYAML's constructors choke on (an integer of 5000 digits, a bad date...).
        raise YamlInputError(f"{path} is not valid YAML: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()
