"""JSON schemas are compiled closed, as vLLM's default backend (xgrammar, strict mode)
reads them: no property or tuple item the schema does not name unless it allows
others explicitly. Checked on the rewrite itself and on the compiled grammar (SmolLM2's
tokenizer, no model)."""

from __future__ import annotations

import copy
import json

import pytest

from scheduler_svc.structured.closed_schema import closed_schema
from scheduler_svc.structured.compiler import GrammarCompiler
from scheduler_svc.structured.constraint import Constraint

from .harness import encode, load_tokenizer

NAME = {"type": "string", "maxLength": 12}
BOOK = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "author": {
            "type": "object",
            "properties": {"first": NAME, "last": NAME},
            "required": ["first", "last"],
        },
        "year": {"type": "integer"},
    },
    "required": ["title", "author", "year"],
}
SHELF = {
    "type": "object",
    "properties": {"books": {"type": "array", "items": BOOK, "maxItems": 2}},
    "required": ["books"],
}
AUTHOR = '{"first": "Ann", "last": "Lee"}'
A_BOOK = f'{{"title": "Dune", "author": {AUTHOR}, "year": 1965}}'


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(load_tokenizer(), max_cached=16)


def accepts(compiler: GrammarCompiler, schema: dict, text: str) -> bool:
    """Whether the compiled schema takes text whole (with the one-line separators)."""
    matcher = compiler.compile_now(Constraint("json_schema", json.dumps(schema))).new_matcher()
    return all(matcher.advance(token_id) for token_id in encode(text)) and matcher.is_accepting


def opened(schema: dict, **fields) -> dict:
    return {**schema, **fields}


def test_the_rewrite_closes_named_objects_at_every_depth_and_leaves_the_input():
    before = copy.deepcopy(SHELF)
    shelf = closed_schema(SHELF)
    assert before == SHELF
    assert shelf["additionalProperties"] is False
    book = shelf["properties"]["books"]["items"]
    assert book["additionalProperties"] is False
    assert book["properties"]["author"]["additionalProperties"] is False


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object"},  # names nothing: any object, as json_object means
        {"type": "array"},
        {"type": "object", "properties": {"a": NAME}, "additionalProperties": True},
        {"type": "object", "properties": {"a": NAME}, "additionalProperties": NAME},
        {"type": "object", "properties": {"a": NAME}, "unevaluatedProperties": True},
        {"type": "array", "prefixItems": [NAME], "items": NAME},
        True,
    ],
)
def test_what_allows_more_explicitly_or_names_nothing_stays_as_it_is(schema):
    assert closed_schema(schema) == schema


def test_anyof_branches_and_defs_are_closed_allof_branches_only_inside():
    part = {"type": "object", "properties": {"a": NAME, "inner": BOOK}}
    schema = {
        "anyOf": [part, {"$ref": "#/$defs/part"}],
        "allOf": [part],
        "$defs": {"part": part},
        "not": part,
    }
    result = closed_schema(schema)
    assert result["anyOf"][0]["additionalProperties"] is False
    assert result["$defs"]["part"]["additionalProperties"] is False
    [branch] = result["allOf"]
    assert "additionalProperties" not in branch
    assert branch["properties"]["inner"]["additionalProperties"] is False
    assert result["not"] == part  # closing what is excluded would exclude less


def test_a_book_refuses_a_property_it_does_not_name(compiler):
    assert accepts(compiler, BOOK, A_BOOK)
    assert not accepts(compiler, BOOK, A_BOOK[:-1] + ', "pages": 1}')


def test_additional_properties_true_or_a_schema_allows_them(compiler):
    extra = A_BOOK[:-1] + ', "pages": 1}'
    assert accepts(compiler, opened(BOOK, additionalProperties=True), extra)
    typed = opened(BOOK, additionalProperties={"type": "integer"})
    assert accepts(compiler, typed, extra)
    assert not accepts(compiler, typed, A_BOOK[:-1] + ', "pages": "one"}')


def test_nested_objects_are_closed_unless_they_open_themselves(compiler):
    nested_extra = A_BOOK.replace(AUTHOR, '{"first": "Ann", "last": "Lee", "born": 1920}')
    assert not accepts(compiler, BOOK, nested_extra)
    author = opened(BOOK["properties"]["author"], additionalProperties=True)
    open_author = opened(BOOK, properties={**BOOK["properties"], "author": author})
    assert accepts(compiler, open_author, nested_extra)
    # The outer object stays closed all the same.
    assert not accepts(compiler, open_author, nested_extra[:-1] + ', "pages": 1}')


def test_objects_in_array_items_are_closed(compiler):
    assert accepts(compiler, SHELF, f'{{"books": [{A_BOOK}]}}')
    extra = A_BOOK[:-1] + ', "pages": 1}'
    assert not accepts(compiler, SHELF, f'{{"books": [{A_BOOK}, {extra}]}}')


def test_a_tuple_takes_no_item_past_its_prefix_items_unless_items_allows(compiler):
    pair = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "integer"}]}
    assert accepts(compiler, pair, "[1, 2]")
    assert not accepts(compiler, pair, "[1, 2, 3]")
    assert accepts(compiler, opened(pair, items={"type": "integer"}), "[1, 2, 3]")


def test_a_bare_object_is_still_any_object(compiler):
    assert accepts(compiler, {"type": "object"}, '{"anything": [1, {"x": null}]}')
    any_json = Constraint("json_object", "")
    matcher = compiler.compile_now(any_json).new_matcher()
    assert all(matcher.advance(t) for t in encode('{"cat": "Tom", "age": 3}'))
    assert matcher.is_accepting
