"""Compiles constraints into llguidance grammars, once per constraint, off the event loop.

The first request with a given schema (regex, grammar, choice list) pays its
compilation in a worker thread while the event loop goes on with every other
request's steps; requests with the same constraint that arrive meanwhile await the
same future, and later ones find it in a bounded LRU cache. The result is a
CompiledGrammar: a matcher in its start state, which each request copies (a copy
costs about a microsecond, a compilation hundreds of them).

The llguidance tokenizer is built from the scheduler's own tokenizer.json (no
transformers, no torch) on the first compilation, also in the thread: it takes
about half a second.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import llguidance

from common.errors import InvalidArgument
from scheduler_svc.structured.closed_schema import closed_schema
from scheduler_svc.structured.constraint import Constraint
from scheduler_svc.structured.matcher import RequestMatcher

DEFAULT_MAX_CACHED = 256
# JSON on one line, as json.dumps writes it. llguidance's default allows any
# whitespace between tokens, and small models measured here then run to max_tokens
# on newlines and indentation (a schema's "x-guidance" field can still ask for it).
JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class CompiledGrammar:
    """A constraint's grammar in its start state; new_matcher() gives each request its own."""

    def __init__(self, constraint: Constraint, template: llguidance.LLMatcher, num_words: int):
        self.constraint = constraint
        self._template = template
        self.num_words = num_words

    def new_matcher(self) -> RequestMatcher:
        return RequestMatcher(self._template, self.num_words, self.constraint)


class GrammarCompiler:
    def __init__(
        self,
        tokenizer_json: str,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        max_cached: int = DEFAULT_MAX_CACHED,
    ) -> None:
        if vocab_size < 1 or max_cached < 1:
            raise ValueError(f"vocab_size and max_cached must be >= 1: {vocab_size}, {max_cached}")
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        # One row of the allowed-token bitmask: a bit per token id.
        self.num_words = (vocab_size + 31) // 32
        self._eos_token_ids = list(eos_token_ids)
        self._max_cached = max_cached
        self._cache: OrderedDict[Constraint, CompiledGrammar] = OrderedDict()
        self._pending: dict[Constraint, asyncio.Future[CompiledGrammar]] = {}
        # One thread: compilations queue behind each other, never behind a step.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._tokenizer_lock = threading.Lock()
        self.num_compiled = 0

    @classmethod
    def for_tokenizer(cls, tokenizer, max_cached: int = DEFAULT_MAX_CACHED) -> GrammarCompiler:
        """From the scheduler's Tokenizer (scheduler_svc.api.tokenizer)."""
        return cls(tokenizer.to_json(), tokenizer.vocab_size, tokenizer.eos_token_ids, max_cached)

    @property
    def num_cached(self) -> int:
        return len(self._cache)

    async def compile(self, constraint: Constraint) -> CompiledGrammar:
        """The constraint's grammar; raises InvalidArgument with llguidance's message."""
        cached = self._cached(constraint)
        if cached is not None:
            return cached
        pending = self._pending.get(constraint)
        if pending is None:
            loop = asyncio.get_running_loop()
            pending = asyncio.ensure_future(
                loop.run_in_executor(self._executor, self.compile_now, constraint)
            )
            self._pending[constraint] = pending
            pending.add_done_callback(lambda _: self._pending.pop(constraint, None))
        # shield: one caller cancelled (its client gone) must not cancel the others.
        return await asyncio.shield(pending)

    def compile_now(self, constraint: Constraint) -> CompiledGrammar:
        """Compiles in the calling thread (the executor's, or a test's)."""
        cached = self._cached(constraint)
        if cached is not None:
            return cached
        kind, text = constraint.llguidance_format()
        try:
            if kind == "json_schema":
                # Closed as vLLM's default backend reads schemas (closed_schema.py).
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    closed_schema(json.loads(text)), defaults=JSON_DEFAULTS
                )
            else:
                grammar = llguidance.grammar_from(kind, text)
        except ValueError as error:
            raise InvalidArgument(constraint.field, str(error)) from None
        template = llguidance.LLMatcher(self._tokenizer(), grammar, log_level=0)
        if template.is_error():
            raise InvalidArgument(constraint.field, template.get_error())
        compiled = CompiledGrammar(constraint, template, self.num_words)
        self.num_compiled += 1
        self._store(constraint, compiled)
        return compiled

    def _cached(self, constraint: Constraint) -> CompiledGrammar | None:
        compiled = self._cache.get(constraint)
        if compiled is not None:
            self._cache.move_to_end(constraint)
        return compiled

    def _store(self, constraint: Constraint, compiled: CompiledGrammar) -> None:
        # OrderedDict operations are atomic under the GIL; the executor is the only writer.
        self._cache[constraint] = compiled
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)

    def _tokenizer(self) -> llguidance.LLTokenizer:
        with self._tokenizer_lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = llguidance.LLTokenizer(
                    self._tokenizer_json,
                    n_vocab=self.vocab_size,
                    eos_token=self._eos_token_ids or None,
                )
            return self._ll_tokenizer

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
