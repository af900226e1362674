"""Check a Compute Engine request against Google's published v1 discovery document.

The document ships inside google-api-python-client
(``googleapiclient/discovery_cache/documents/compute.v1.json``): every method,
its path template, its query parameters, and the request body's schema with
its enums, patterns, formats, output-only fields and ``required`` annotations.
The Compute stand-in runs every request through :func:`check` before acting on
it, so a request GCE would refuse cannot pass here either. What the document
does not say (the MIG size limits, metadata sizes, real zone names) the stand-in
checks itself.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import os
import re
from dataclasses import dataclass

API_PREFIX = "/compute/v1/"
INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}
# Google's front end takes the standard parameters also with a '$' in front (the GAPIC REST
# transports send "$alt=json;enum-encoding=int"); "enum-encoding=int" only changes the answer's enums.
ALT = re.compile(r"^(json|media|proto)(;enum-encoding=int)?$")


class Violation(Exception):
    """A request the published API refuses: a 400 with reason ``invalid`` (or ``required``)."""

    def __init__(self, message: str, reason: str = "invalid", status: int = 400):
        super().__init__(message)
        self.message, self.reason, self.status = message, reason, status


def document_path() -> str:
    import googleapiclient

    return os.path.join(os.path.dirname(googleapiclient.__file__), "discovery_cache", "documents", "compute.v1.json")


@functools.lru_cache(maxsize=1)
def document() -> dict:
    with open(document_path()) as f:
        return json.load(f)


def revision() -> str:
    return document()["revision"]


@dataclass(frozen=True)
class Method:
    id: str  # e.g. compute.instanceGroupManagers.deleteInstances
    http: str
    pattern: re.Pattern
    names: tuple[str, ...]  # path parameters, in the order the pattern captures them
    spec: dict


@functools.lru_cache(maxsize=1)
def methods() -> tuple[Method, ...]:
    out = []

    def walk(resources: dict) -> None:
        for res in resources.values():
            for m in res.get("methods", {}).values():
                template = m.get("flatPath") or m["path"]
                names = tuple(re.findall(r"\{\+?([^}]+)\}", template))
                regex = "".join(
                    "([^/]+)" if part.startswith("{") else re.escape(part)
                    for part in re.split(r"(\{\+?[^}]+\})", template)
                    if part
                )
                out.append(Method(m["id"], m["httpMethod"], re.compile(regex), names, m))
            walk(res.get("resources", {}))

    walk(document()["resources"])
    return tuple(out)


def find(http: str, path: str) -> tuple[Method, dict[str, str]]:
    """The method a request calls and its path parameters; 404 as Google answers an unknown URL."""
    if not path.startswith(API_PREFIX):
        raise Violation(f"The requested URL {path} was not found on this server.", "notFound", 404)
    rest = path[len(API_PREFIX) :]
    matched = [(m, g) for m in methods() if (g := m.pattern.fullmatch(rest))]
    for m, g in matched:
        if m.http == http:
            return m, dict(zip(m.names, g.groups()))
    if matched:
        raise Violation(
            f"{http} is not allowed on {path} (the API has {', '.join(sorted({m.http for m, _ in matched}))})",
            "notFound",
            404,
        )
    raise Violation(f"The requested URL {path} was not found on this server.", "notFound", 404)


def _scalar(where: str, value: str, spec: dict) -> None:
    """A path or query parameter: always a string on the wire, of the type the document names."""
    kind, fmt = spec.get("type", "string"), spec.get("format")
    if kind == "boolean" and value not in ("true", "false"):
        raise Violation(f"Invalid value for {where}: '{value}'. Expected a boolean (true or false).")
    if kind == "integer" or fmt in INT_RANGES:
        lo, hi = INT_RANGES.get(fmt or "int32", INT_RANGES["int32"])
        if not re.fullmatch(r"-?[0-9]+", value) or not lo <= int(value) <= hi:
            raise Violation(f"Invalid value for {where}: '{value}'. Expected an integer ({fmt}).")
        if (
            "minimum" in spec
            and int(value) < int(spec["minimum"])
            or "maximum" in spec
            and int(value) > int(spec["maximum"])
        ):
            raise Violation(
                f"Invalid value for {where}: {value}. Must be from {spec.get('minimum')} to {spec.get('maximum')}."
            )
    if "enum" in spec and value not in spec["enum"]:
        raise Violation(f"Invalid value for {where}: '{value}'. Must be one of {', '.join(spec['enum'])}.")
    if "pattern" in spec and not re.fullmatch(spec["pattern"], value):
        raise Violation(f"Invalid value for {where}: '{value}'. Must be a match of regex '{spec['pattern']}'.")


def _query(method: Method, query: dict[str, list[str]]) -> None:
    known = {
        **document()["parameters"],
        **{k: v for k, v in method.spec.get("parameters", {}).items() if v.get("location") == "query"},
    }
    for name, values in query.items():
        plain = name[1:] if name.startswith("$") and name[1:] in document()["parameters"] else name
        spec = known.get(plain)
        if spec is None:
            raise Violation(
                f'Invalid JSON payload received. Unknown name "{name}": Cannot bind query parameter. '
                f"Field '{name}' could not be found in request message."
            )
        if len(values) > 1 and not spec.get("repeated"):
            raise Violation(f"Invalid value for parameter '{name}': given {len(values)} times.")
        for value in values:
            if plain == "alt":
                if not ALT.match(value):
                    raise Violation(f"Invalid value for parameter 'alt': '{value}'.")
                continue
            _scalar(f"parameter '{name}'", value, spec)


def output_only(spec: dict) -> bool:
    text = spec.get("description", "")
    return bool(spec.get("readOnly")) or text.startswith(("[Output Only]", "Output only.", "Output Only."))


def _value(method_id: str, where: str, value, spec: dict) -> None:
    schemas = document()["schemas"]
    if "$ref" in spec:
        spec = {**schemas[spec["$ref"]], **{k: v for k, v in spec.items() if k != "$ref"}}
    kind, fmt = spec.get("type"), spec.get("format")
    if kind == "object":
        if not isinstance(value, dict):
            raise Violation(f"Invalid value at '{where}': expected an object, got {json.dumps(value)[:80]}.")
        props = spec.get("properties")
        if props is None:  # a map
            extra = spec.get("additionalProperties") or {}
            for k, v in value.items():
                _value(method_id, f"{where}[{k}]", v, extra)
            return
        for k, v in value.items():
            if k not in props:
                raise Violation(f"Invalid JSON payload received. Unknown name \"{k}\" at '{where}': Cannot find field.")
            if output_only(props[k]):
                raise Violation(
                    f"Invalid value for field '{where}.{k}': it is output only and cannot be set in a request."
                )
            _value(method_id, f"{where}.{k}", v, props[k])
        for k, p in props.items():
            if method_id in (p.get("annotations") or {}).get("required", []) and k not in value:
                raise Violation(f"Required field '{where}.{k}' not specified", "required")
    elif kind == "array":
        if not isinstance(value, list):
            raise Violation(f"Invalid value at '{where}': expected a list, got {json.dumps(value)[:80]}.")
        for i, v in enumerate(value):
            _value(method_id, f"{where}[{i}]", v, spec.get("items") or {})
    elif kind == "boolean":
        if not isinstance(value, bool):
            raise Violation(f"Invalid value at '{where}' (TYPE_BOOL), {json.dumps(value)[:80]}")
    elif kind == "integer":  # int32 / uint32: a JSON number
        lo, hi = INT_RANGES[fmt or "int32"]
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise Violation(f"Invalid value at '{where}' (TYPE_{(fmt or 'int32').upper()}), {json.dumps(value)[:80]}")
    elif kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Violation(f"Invalid value at '{where}' (TYPE_{(fmt or 'double').upper()}), {json.dumps(value)[:80]}")
    elif kind == "string":
        if not isinstance(value, str):
            # int64 and uint64 are JSON strings in Google's APIs: the document says type string.
            raise Violation(
                f"Invalid value at '{where}' (TYPE_STRING{', format ' + fmt if fmt else ''}), "
                f"{json.dumps(value)[:80]}: expected a JSON string"
            )
        if fmt in INT_RANGES:
            lo, hi = INT_RANGES[fmt]
            if not re.fullmatch(r"-?[0-9]+", value) or not lo <= int(value) <= hi:
                raise Violation(f"Invalid value at '{where}' (TYPE_{fmt.upper()}), \"{value}\"")
        elif fmt == "byte":
            try:
                base64.b64decode(value.replace("-", "+").replace("_", "/") + "=" * (-len(value) % 4), validate=True)
            except (binascii.Error, ValueError):
                raise Violation(
                    f"Invalid value at '{where}' (TYPE_BYTES), Base64 decoding failed for \"{value[:40]}\""
                ) from None
        if "enum" in spec and value not in spec["enum"]:
            raise Violation(f"Invalid value at '{where}' (enum), \"{value}\": must be one of {', '.join(spec['enum'])}")
        if "pattern" in spec and not re.fullmatch(spec["pattern"], value):
            raise Violation(
                f"Invalid value for field '{where}': '{value}'. Must be a match of regex '{spec['pattern']}'"
            )


def check(http: str, path: str, query: dict[str, list[str]], body) -> tuple[str, dict[str, str]]:
    """Raise Violation unless the document allows this request; else (method id, path parameters)."""
    method, params = find(http, path)
    for name, value in params.items():
        _scalar(f"path parameter '{name}'", value, method.spec["parameters"][name])
    _query(method, query)
    request = method.spec.get("request")
    if request is None:
        if body not in (None, {}):
            raise Violation(f"Invalid JSON payload received. {method.id} takes no request body.")
    else:
        field = "resource"
        if body is None:
            raise Violation(f"Required field '{field}' not specified", "required")
        _value(method.id, field, body, request)
    return method.id, params
