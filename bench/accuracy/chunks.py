"""llama-perplexity's scoring, applied to cbserve's paths and to llama.cpp itself, so
that the two perplexities are of the same tokens under the same context.

llama-perplexity (bench/peers/llama_perplexity.py) tokenizes a whole document, cuts the ids
into chunks of n_ctx tokens (the remainder is dropped), evaluates each chunk from an
empty cache and scores only the predictions of its second half: the logits at
positions n_ctx/2 .. n_ctx-2 against the tokens one later, n_ctx - n_ctx/2 - 1 tokens a
chunk, so that every scored token has at least n_ctx/2 tokens of context. Where the
model's vocabulary adds a BOS token, it is put first in the document and over the
first token of every chunk. Its estimate is exp(mean negative log-likelihood) and its
+/- is the standard error of that mean, times the perplexity. ChunkScoring and
Estimate are those rules, torch-free; accuracy_eval.chunk_nlls scores our paths by
them, llamacpp_row runs llama-perplexity itself, chunked_table prints both.

The document is the whole-text bench's held-out texts, whole and joined
(accuracy_data.heldout_document). Both sides score llama.cpp's own token ids when
llama-server is built (its /tokenize, the tokenizer llama-perplexity uses); document_ids
says whether ours were the same.
"""

from __future__ import annotations

import difflib
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cbserve.ports import free_port

DEFAULT_N_CTX = 512  # llama-perplexity's own default


@dataclass(frozen=True)
class ChunkScoring:
    n_ctx: int = DEFAULT_N_CTX
    bos_id: int | None = None  # set where the vocabulary adds a BOS token

    def __post_init__(self) -> None:
        if self.n_ctx < 4:
            raise ValueError(f"n_ctx must be at least 4, got {self.n_ctx}")

    @property
    def first_scored(self) -> int:
        """The first position whose logits are scored (it predicts the token after it)."""
        return self.n_ctx // 2

    @property
    def scored_per_chunk(self) -> int:
        return self.n_ctx - self.first_scored - 1

    def chunks(self, ids: Sequence[int]) -> list[list[int]]:
        """The chunks llama-perplexity evaluates from a document's ids (BOS included
        where the tokenizer adds it): whole chunks only, each chunk's first token made
        BOS where the vocabulary has one. It refuses fewer than 2 * n_ctx ids; so do we."""
        if len(ids) < 2 * self.n_ctx:
            raise ValueError(
                f"{len(ids)} tokens: llama-perplexity needs at least {2 * self.n_ctx} "
                f"for n_ctx={self.n_ctx}"
            )
        count = len(ids) // self.n_ctx
        chunks = [list(ids[i * self.n_ctx : (i + 1) * self.n_ctx]) for i in range(count)]
        if self.bos_id is not None:
            for chunk in chunks:
                chunk[0] = self.bos_id
        return chunks


@dataclass(frozen=True)
class Estimate:
    """A perplexity with llama-perplexity's +/- (standard error of the mean NLL, times
    the perplexity)."""

    perplexity: float
    plus_minus: float
    tokens: int

    @classmethod
    def from_nlls(cls, nlls: Sequence[float]) -> Estimate:
        count = len(nlls)
        if count < 2:
            raise ValueError("an estimate needs at least 2 scored tokens")
        mean = math.fsum(nlls) / count
        variance = math.fsum(x * x for x in nlls) / count - mean * mean
        ppl = math.exp(mean)
        return cls(ppl, math.sqrt(max(variance, 0.0) / (count - 1)) * ppl, count)


def per_chunk(nlls: Sequence[float], chunks: int) -> list[float]:
    """Each chunk's own perplexity from the scored NLLs of `chunks` equal chunks."""
    size = len(nlls) // chunks
    return [math.exp(math.fsum(nlls[i * size : (i + 1) * size]) / size) for i in range(chunks)]


@dataclass(frozen=True)
class DocumentIds:
    ids: list[int]
    source: str  # which tokenizer's ids both sides score, and whether ours agreed


def compare_ids(ours: Sequence[int], theirs: Sequence[int]) -> str:
    """A sentence on whether our tokenizer gave llama.cpp's ids for the document: where
    they differ, how many runs differ and how many tokens each side has in them (an
    alignment, since one token more shifts every later position)."""
    if list(ours) == list(theirs):
        return f"llama.cpp's, identical to ours ({len(theirs)} tokens)"
    matcher = difflib.SequenceMatcher(a=list(ours), b=list(theirs), autojunk=False)
    runs = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    in_ours = sum(i2 - i1 for _, i1, i2, _, _ in runs)
    in_theirs = sum(j2 - j1 for _, _, _, j1, j2 in runs)
    return (
        f"llama.cpp's ({len(theirs)} tokens; ours, {len(ours)}, differ in {len(runs)} "
        f"places: {in_ours} of our tokens for {in_theirs} of theirs, the first at {runs[0][1]})"
    )


def document_ids(our_ids: list[int], text: str, gguf: Path | None, threads: int) -> DocumentIds:
    """llama.cpp's ids for the document when llama-server is built, else ours."""
    from bench.peers import llama_server

    binary = llama_server.binary_path()
    if binary is None or gguf is None:
        why = "llama-server not built" if binary is None else "no GGUF of this model"
        return DocumentIds(our_ids, f"ours (llama.cpp's not checked: {why})")
    port = free_port()
    argv = llama_server.server_argv(binary, gguf, port, 1, threads, 512)
    with llama_server.LlamaServer(argv, port) as server:
        theirs = server.tokenize(text)
    return DocumentIds(theirs, compare_ids(our_ids, theirs))


def llamacpp_replies(
    gguf: Path | None, prompts: list[list[int]], count: int, threads: int
) -> list[list[int]] | str:
    """llama-server's greedy replies to the same prompt ids, or why they were left out."""
    from bench.peers import llama_server

    binary = llama_server.binary_path()
    if binary is None or gguf is None:
        return llama_server.MISSING if binary is None else "no GGUF of this model"
    port = free_port()
    context = max(map(len, prompts)) + count + 16
    argv = llama_server.server_argv(binary, gguf, port, 1, threads, context)
    with llama_server.LlamaServer(argv, port) as server:
        return [server.greedy_tokens(prompt, count) for prompt in prompts]


def gguf_bos_id(gguf: Path | None) -> int | None:
    """The BOS id llama.cpp puts first when the GGUF says its vocabulary adds one."""
    if gguf is None:
        return None
    from gguf import GGUFReader

    fields = GGUFReader(gguf).fields

    def scalar(name: str):
        field = fields.get(name)
        return None if field is None else field.parts[field.data[0]][0]

    return (
        int(scalar("tokenizer.ggml.bos_token_id"))
        if scalar("tokenizer.ggml.add_bos_token")
        else None
    )


def llamacpp_row(
    gguf: Path | None, document: str, scoring: ChunkScoring, chunks: int, threads: int
) -> dict:
    """llama-perplexity on the same document and GGUF, or why it was left out."""
    from bench.peers import llama_perplexity

    binary = llama_perplexity.binary_path()
    if binary is None or gguf is None:
        reason = llama_perplexity.MISSING if binary is None else "no GGUF of this model"
        print(f"# llama.cpp: left out: {reason}", flush=True)
        return {"skipped": reason}
    with tempfile.TemporaryDirectory() as folder:
        text_file = Path(folder) / "heldout.txt"
        text_file.write_text(document, encoding="utf-8")
        started = time.perf_counter()
        run = llama_perplexity.run(binary, gguf, text_file, scoring.n_ctx, threads)
    if (run.chunks, run.n_ctx) != (chunks, scoring.n_ctx):
        raise RuntimeError(f"llama-perplexity scored {run.chunks} chunks of {run.n_ctx}, not ours")
    print(f"# llama.cpp: perplexity {run.perplexity:.4f}", flush=True)
    return {
        "perplexity": run.perplexity,
        "plus_minus": run.plus_minus,
        "per_chunk": run.per_chunk(),
        "seconds": time.perf_counter() - started,
    }


def chunked_table(report: dict) -> str:
    chunked = report["chunked"]
    scored = chunked["chunks"] * (chunked["n_ctx"] - chunked["n_ctx"] // 2 - 1)
    reference = report["paths"]["float32"]["chunked"]["perplexity"]
    lines = [
        f"llama-perplexity's scoring: the same texts whole and joined, {chunked['chunks']} "
        f"chunks of {chunked['n_ctx']} tokens, the second half of each scored "
        f"({scored} tokens); token ids: {chunked['token_ids']}",
        "",
        "| path | perplexity | +/- | vs float32 |",
        "|---|---:|---:|---:|",
    ]
    rows = [(f"{n} (cbserve)", r["chunked"]) for n, r in report["paths"].items()]
    theirs = chunked["llama.cpp"]
    if "skipped" not in theirs:
        label = report.get("llama.cpp label", "Q4_1")
        rows.append((f"{label} GGUF (llama.cpp llama-perplexity)", theirs))
    for name, row in rows:
        lines.append(
            f"| {name} | {row['perplexity']:.4f} | {row['plus_minus']:.4f} "
            f"| {row['perplexity'] / reference:.4f}x |"
        )
    if "skipped" in theirs:
        lines += ["", f"llama.cpp left out: {theirs['skipped']}"]
    return "\n".join(lines)
