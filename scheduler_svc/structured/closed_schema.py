"""JSON schemas closed the way vLLM's default backend reads them, before llguidance
compiles them.

JSON Schema allows properties an object schema does not name unless it says
`additionalProperties: false`, and llguidance compiles it so. A small model then fills
that room: held-out schemas ("a book" with title, author{first, last}, year) came
back as `"pages": 1, "pages_per_line": 1, ...` until `length`. vLLM's default backend
(xgrammar with `strict_mode`) and OpenAI's strict mode never generate a property the
schema does not name, and neither does an array go past its `prefixItems`; vLLM's
guidance backend rewrites schemas for the same reason (`disable_additional_properties`).
llguidance 1.9's JsonCompileOptions (and its `x-guidance` key) have no switch for it,
so the schema itself is rewritten here:

- an object schema that names properties (`properties` or `patternProperties`) and
  says nothing of others (`additionalProperties`, `unevaluatedProperties`) gets
  `additionalProperties: false`; one that says `true` or gives a schema keeps it;
- an array schema with `prefixItems` and no `items`/`unevaluatedItems` gets
  `items: false`;
- the same, recursively, for every subschema that describes a value: properties,
  items, additional properties given as a schema, `anyOf`/`oneOf` branches, `$defs`.

Left open on purpose: a bare `{"type": "object"}` or `{"type": "array"}` (it names
nothing; xgrammar too reads it as any object, and `json_object` and a tool without
parameters mean exactly that); the branches of `allOf` (each names only part of the
properties, and llguidance intersects them: closing each would forbid the others');
`not` and `if` (closing them would change what they exclude or select).
"""

from __future__ import annotations

from typing import Any

# Keys whose value is a map of name -> subschema.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# Keys whose value is one subschema (or a list of them, for old-style tuple `items`).
_SCHEMA_VALUES = (
    "additionalProperties",
    "unevaluatedProperties",
    "items",
    "unevaluatedItems",
    "additionalItems",
    "contains",
    "propertyNames",
    "then",
    "else",
)
# Keys whose value is a list of alternatives, each closed as a whole schema.
_ALTERNATIVES = ("anyOf", "oneOf", "prefixItems")


def closed_schema(schema: Any) -> Any:
    """A copy of the schema with no room for what it does not name; the input is not
    changed. Anything that is not a schema object (a boolean schema, a malformed
    value) comes back as it is, for llguidance to accept or refuse."""
    return _close(schema, own_level=True)


def _close(schema: Any, own_level: bool) -> Any:
    if not isinstance(schema, dict):
        return schema
    result = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(result.get(key), dict):
            result[key] = {name: _close(sub, True) for name, sub in result[key].items()}
    for key in _SCHEMA_VALUES:
        if key in result:
            value = result[key]
            if isinstance(value, list):
                result[key] = [_close(sub, True) for sub in value]
            else:
                result[key] = _close(value, True)
    for key in _ALTERNATIVES:
        if isinstance(result.get(key), list):
            result[key] = [_close(sub, True) for sub in result[key]]
    if isinstance(result.get("allOf"), list):
        # A branch's own level stays open; what it nests is closed.
        result["allOf"] = [_close(sub, False) for sub in result["allOf"]]
    if own_level:
        _close_level(result)
    return result


def _close_level(schema: dict) -> None:
    names_properties = "properties" in schema or "patternProperties" in schema
    if names_properties and not (
        "additionalProperties" in schema or "unevaluatedProperties" in schema
    ):
        schema["additionalProperties"] = False
    if "prefixItems" in schema and not ("items" in schema or "unevaluatedItems" in schema):
        schema["items"] = False
