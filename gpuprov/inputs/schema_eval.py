"""A small evaluator of JSON Schema (draft 2020-12) written as plain data: the one validator of
every schema gpuprov publishes and reads by (the host declaration, :mod:`gpuprov.inputs.declaration`;
a fleet host's answer, :mod:`gpuprov.report.fleet`), so no hand-written checker drifts from a schema.

It knows the keywords those schemas use, with JSON Schema's meaning (:data:`KEYWORDS`; a test holds
each schema to that list). Two notes:

- patterns are written to mean the same in ECMA-262 (JSON Schema's dialect) and in Python's
  ``re`` (the ``jsonschema`` package's): ASCII classes, no ``\\d``/``\\w``/``\\s``, and each ends
  ``$(?!\\n)``, the end of the text in both (Python's ``$`` alone also matches before a final
  newline);
- a whole number is an integer as YAML writes it: ``1.0`` is YAML's float and is refused here
  (a JSON validator, for which 1.0 is the integer 1, takes it: the one place they differ).

Each problem names its path (``gpuprov_host.gpus[2].use``) and, as its fix, the ``description``
of the rule it broke. Sizes are checked before contents (every list and mapping the schema walks
is bounded), so a huge list is refused without being walked; nesting past :data:`MAX_DEPTH` is
refused, never recursed into.

Standard library only (ships to targets with the modules).
"""

from __future__ import annotations

import difflib
import functools
import re
from typing import Any

from .validate import Problems, kind, shown

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
MAX_DEPTH = 32
KEYWORDS = frozenset(
    {
        "$ref",
        "type",
        "const",
        "enum",
        "pattern",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "items",
        "minItems",
        "maxItems",
        "uniqueItems",
        "properties",
        "required",
        "additionalProperties",
        "propertyNames",
        "minProperties",
        "maxProperties",
        "allOf",
        "not",
        "if",
        "then",
        "else",
    }
)  # what Evaluator walks; the rest are annotations ($schema, $id, $defs, title, description)


def did_you_mean(value: Any, names: list[Any]) -> str:
    """``: did you mean 'passthrough'?`` for a string close to one of ``names`` (a typo), else nothing."""
    if not isinstance(value, str) or len(value) > 200:
        return ""
    close = difflib.get_close_matches(value, [n for n in names if isinstance(n, str)], n=1, cutoff=0.75)
    return f": did you mean {close[0]!r}?" if close else ""


def _fix(schema: dict[str, Any]) -> str | None:
    return schema.get("description")


def _word(value: Any) -> str:
    """A value as YAML writes it: null, true, 1, host."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: a boolean is never a number, 1 and 1.0 are one number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@functools.lru_cache(maxsize=128)
def _compiled(pattern: str) -> re.Pattern[str]:
    """A schema ``pattern`` as JSON Schema (ECMA-262) means it, in Python's ``re``: a ``$`` outside
    a character class is the end of the text (``\\Z``), never "before a final newline" as Python's
    ``$`` is: ``"train\\n"`` is not a name. (The schema's patterns end ``$(?!\\n)``, which means the
    end in both; this keeps a future pattern honest too.)"""
    out: list[str] = []
    in_class = escaped = False
    for ch in pattern:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            out.append(ch)
            escaped = True
        elif in_class:
            out.append(ch)
            in_class = ch != "]"
        elif ch == "[":
            out.append(ch)
            in_class = True
        else:
            out.append(r"\Z" if ch == "$" else ch)
    return re.compile("".join(out))


def _key(value: Any) -> Any:
    """A hashable stand-in for a JSON value, equal where the values are (uniqueItems)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, list):
        return ("array", tuple(_key(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((_key(k), _key(v)) for k, v in value.items()))
    return (type(value).__name__, value)


class Evaluator:
    """One schema (``root``: its ``$ref``s are local to it); ``top`` is how paths name the whole value."""

    def __init__(self, root: dict[str, Any], top: str) -> None:
        self.root = root
        self.top = top

    def check(self, value: Any, path: str, definition: str | None = None) -> Problems:
        """Every problem of ``value`` against the schema (or its ``$defs`` entry ``definition``)."""
        p = Problems()
        self._walk(p, self.root if definition is None else self._resolve(f"#/$defs/{definition}"), value, path, 0)
        return p

    def _resolve(self, ref: str) -> dict[str, Any]:
        node: Any = self.root
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        return node

    def _valid(self, schema: dict[str, Any], value: Any, path: str, depth: int) -> bool:
        scratch = Problems()
        self._walk(scratch, schema, value, path, depth)
        return not scratch

    def _walk(self, p: Problems, schema: dict[str, Any], value: Any, path: str, depth: int) -> None:
        if "$ref" in schema:
            schema = self._resolve(schema["$ref"])
        if depth > MAX_DEPTH:
            p.add(path, "is nested too deeply", _fix(schema))
            return
        types = schema.get("type")
        if types is not None:
            names = [types] if isinstance(types, str) else types
            if not any(_TYPES[t](value) for t in names):
                p.add(path, f"is {kind(value)}, expected {' or '.join(names)}", _fix(schema))
                return
        if "const" in schema and not _equal(value, schema["const"]):
            p.add(path, f"{shown(value)} is not {_word(schema['const'])}", _fix(schema))
            return
        if "enum" in schema and not any(_equal(value, v) for v in schema["enum"]):
            said = f"{shown(value)} is not one of {', '.join(map(_word, schema['enum']))}"
            p.add(path, said + did_you_mean(value, schema["enum"]), _fix(schema))
            return
        if isinstance(value, str):
            self._string(p, schema, value, path)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in schema and value < schema["minimum"]:
                p.add(path, f"{shown(value)} is below {schema['minimum']}", _fix(schema))
            if "maximum" in schema and value > schema["maximum"]:
                p.add(path, f"{shown(value)} is above {schema['maximum']}", _fix(schema))
        elif isinstance(value, list):
            self._array(p, schema, value, path, depth)
        elif isinstance(value, dict):
            self._object(p, schema, value, path, depth)
        for sub in schema.get("allOf", ()):
            self._walk(p, sub, value, path, depth + 1)
        if "not" in schema and self._valid(schema["not"], value, path, depth + 1):
            p.add(path, "is not allowed here", _fix(schema))
        if "if" in schema:
            branch = "then" if self._valid(schema["if"], value, path, depth + 1) else "else"
            if branch in schema:
                self._walk(p, schema[branch], value, path, depth + 1)

    @staticmethod
    def _string(p: Problems, schema: dict[str, Any], value: str, path: str) -> None:
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            p.add(path, f"is {len(value)} characters long, more than {schema['maxLength']}", _fix(schema))
        elif len(value) < schema.get("minLength", 0):
            p.add(path, "is empty", _fix(schema))
        elif "pattern" in schema and not _compiled(schema["pattern"]).search(value):
            p.add(path, f"{shown(value)} is not valid here", _fix(schema))

    def _array(self, p: Problems, schema: dict[str, Any], value: list[Any], path: str, depth: int) -> None:
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            p.add(path, f"has {len(value)} items, more than {schema['maxItems']}", _fix(schema))
            return
        if len(value) < schema.get("minItems", 0):
            p.add(path, f"has fewer than {schema['minItems']} items", _fix(schema))
        if schema.get("uniqueItems") and len({_key(v) for v in value}) < len(value):
            p.add(path, "names an item twice", _fix(schema))
        items = schema.get("items")
        if items is not None:
            for i, item in enumerate(value):
                self._walk(p, items, item, f"{path}[{i}]", depth + 1)

    def _child(self, path: str, key: str) -> str:
        """A key's path: top-level keys are named alone (gpuprov_host.gpus[0], not (the file).gpuprov_host...)."""
        return key if path == self.top else f"{path}.{key}"

    def _object(self, p: Problems, schema: dict[str, Any], value: dict[Any, Any], path: str, depth: int) -> None:
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            p.add(path, f"has {len(value)} keys, more than {schema['maxProperties']}", _fix(schema))
            return
        if len(value) < schema.get("minProperties", 0):
            p.add(path, "is empty", _fix(schema))
        for key in schema.get("required", ()):
            if key not in value:
                p.add(self._child(path, key), "is required", _fix(schema.get("properties", {}).get(key, schema)))
        properties = schema.get("properties", {})
        names = schema.get("propertyNames")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            where = self._child(path, key) if isinstance(key, str) else f"{path}[{shown(key)}]"
            if names is not None and not self._valid(names, key, where, depth + 1):
                self._walk(p, names, key, f"{path}: key {shown(key)}", depth + 1)
                continue
            if isinstance(key, str) and key in properties:
                self._walk(p, properties[key], item, where, depth + 1)
            elif extra is False:
                known = ", ".join(properties) or "none"
                p.add(where, "is not a known key" + did_you_mean(key, list(properties)), f"known keys here: {known}")
            elif isinstance(extra, dict):
                self._walk(p, extra, item, where, depth + 1)
