"""What a request constrains its output to, checked at the door, in llguidance's terms.

A Constraint is plain data (kind and text): it is the key of the compiled-grammar
cache, so two requests with the same schema text share one compilation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from cbserve.v1 import generation_pb2 as pb
from common.errors import InvalidArgument

# A schema, regex or grammar larger than this is refused before any compilation.
MAX_CONSTRAINT_CHARS = 64 * 1024
MAX_CHOICES = 1024
KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
_ANY_JSON_OBJECT = '{"type": "object"}'


@dataclass(frozen=True)
class Constraint:
    # One of KINDS.
    kind: str
    # The schema (JSON text), regex, grammar, or the choices as a JSON list.
    text: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def field(self) -> str:
        """The request field it came from, for error messages."""
        return f"structured_output.{self.kind}"

    def llguidance_format(self) -> tuple[str, str]:
        """(format, text) as llguidance.grammar_from reads them."""
        if self.kind == "json_object":
            return "json_schema", _ANY_JSON_OBJECT
        return self.kind, self.text


def json_schema_constraint(schema: object, field: str) -> Constraint:
    """A JSON-schema constraint from a decoded schema (HTTP bodies carry objects)."""
    if not isinstance(schema, dict | bool):
        raise InvalidArgument(field, "must be a JSON schema (an object)")
    return _checked(Constraint("json_schema", json.dumps(schema)))


def constraint_from_proto(message: pb.StructuredOutput) -> Constraint | None:
    """The request's constraint, or None for free text; raises InvalidArgument."""
    kind = message.WhichOneof("kind")
    if kind is None:
        return None
    if kind == "json_object":
        if not message.json_object:
            return None
        return Constraint("json_object", "")
    if kind == "choice":
        choices = list(message.choice.choices)
        if not choices or len(choices) > MAX_CHOICES:
            raise InvalidArgument(
                "structured_output.choice", f"must hold 1 to {MAX_CHOICES} strings"
            )
        if not all(choices):
            raise InvalidArgument("structured_output.choice", "the choices must not be empty")
        return _checked(Constraint("choice", json.dumps(choices)))
    constraint = _checked(Constraint(kind, getattr(message, kind)))
    if not constraint.text:
        raise InvalidArgument(constraint.field, "must not be empty")
    if kind == "json_schema":
        try:
            schema = json.loads(constraint.text)
        except json.JSONDecodeError as error:
            raise InvalidArgument(constraint.field, f"is not valid JSON: {error}") from None
        if not isinstance(schema, dict | bool):
            raise InvalidArgument(constraint.field, "must be a JSON schema (an object)")
    return constraint


def constraint_to_proto(constraint: Constraint) -> pb.StructuredOutput:
    if constraint.kind == "json_object":
        return pb.StructuredOutput(json_object=True)
    if constraint.kind == "choice":
        return pb.StructuredOutput(choice=pb.ChoiceList(choices=json.loads(constraint.text)))
    return pb.StructuredOutput(**{constraint.kind: constraint.text})


def _checked(constraint: Constraint) -> Constraint:
    if len(constraint.text) > MAX_CONSTRAINT_CHARS:
        raise InvalidArgument(
            constraint.field,
            f"{len(constraint.text)} characters; at most {MAX_CONSTRAINT_CHARS}",
        )
    return constraint
