"""The format table of `cbserve bench formats`, from the figures its runs recorded.

One row a file: cbserve beside llama-server on the same file at 64 prompts at once and
at one stream (output tok/s of `cbserve bench`'s results.json), our perplexity beside
llama-perplexity's on the same chunks, and how many greedy replies equal float32's first
12 tokens, ours beside llama-server's (the accuracy gate's JSON, file mode). Pure: the
figures in, markdown out, so that it is tested without llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Speed:
    """Output tok/s of cbserve and llama-server in one `cbserve bench` run, or the
    medians of alternated rounds (bench/formats/one_stream.py) with the median of the
    rounds' ratios."""

    ours: float
    theirs: float
    rounds: int = 0
    median_ratio: float | None = None

    @property
    def ratio(self) -> float:
        return self.median_ratio if self.median_ratio is not None else self.ours / self.theirs

    def cell(self) -> str:
        of_rounds = f" (median of {self.rounds} alternated rounds)" if self.rounds else ""
        return f"{self.ours:,.1f} vs {self.theirs:,.1f}: {self.ratio:.2f}x{of_rounds}"


@dataclass(frozen=True)
class FileAccuracy:
    """One file's accuracy figures against llama.cpp on the same file."""

    path: str  # the compute path that served the file (`--dtype auto`'s choice)
    perplexity: float
    llama_perplexity: float | None
    equal_replies: int
    llama_server_replies: int | None
    questions: int

    def perplexity_cell(self) -> str:
        if self.llama_perplexity is None:
            return f"{self.perplexity:.4f} (llama-perplexity left out)"
        ratio = self.perplexity / self.llama_perplexity
        return f"{self.perplexity:.4f} vs {self.llama_perplexity:.4f}: {ratio:.4f}x"

    def replies_cell(self) -> str:
        theirs = "" if self.llama_server_replies is None else f" vs {self.llama_server_replies}"
        return f"{self.equal_replies}{theirs} of {self.questions}"


@dataclass(frozen=True)
class FormatRow:
    file: str
    at_once: Speed | None = None
    one_stream: Speed | None = None
    accuracy: FileAccuracy | None = None


def speed_from_results(results: dict) -> Speed:
    """cbserve's and llama.cpp's output tok/s from a `cbserve bench` results.json."""
    by_system = {run["system"]: run["summary"]["output_throughput"] for run in results["runs"]}
    missing = {"cbserve", "llamacpp"} - set(by_system)
    if missing:
        raise ValueError(
            f"results.json has no {', '.join(sorted(missing))} run; errors: {results['errors']}"
        )
    return Speed(by_system["cbserve"], by_system["llamacpp"])


def speed_from_rounds(record: dict) -> Speed:
    """The medians and the median ratio of a `bench.formats.one_stream --json` record."""
    summary = record["summary"]
    return Speed(
        summary["cbserve_median"],
        summary["llamacpp_median"],
        summary["rounds"],
        summary["median_ratio"],
    )


def accuracy_from_report(report: dict) -> FileAccuracy:
    """The file row of a `cbserve bench accuracy --model FILE.gguf --json` report."""
    if not report.get("file"):
        raise ValueError("the accuracy report has no file rows (was --model a GGUF?)")
    path, row = next(iter(report["file"].items()))
    return FileAccuracy(
        path=path,
        perplexity=row["perplexity"],
        llama_perplexity=row.get("llama_perplexity"),
        equal_replies=row["equal_replies"],
        llama_server_replies=row.get("llama_server_replies"),
        questions=row["questions"],
    )


def markdown(
    rows: list[FormatRow], cpu: str, threads: int, settings: str, at_once: int = 64
) -> str:
    """The table for bench/RESULTS.md, with the CPU and the settings above it."""
    lines = [
        f"{cpu}; {threads} threads each; {settings}",
        "",
        f"| file | cbserve path | {at_once} prompts at once, tok/s (cbserve vs llama-server) "
        "| one stream, tok/s | perplexity vs llama-perplexity, same chunks "
        "| replies = float32's first 12 tokens (cbserve vs llama-server) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        accuracy = row.accuracy
        cells = [
            row.file,
            accuracy.path if accuracy else "",
            row.at_once.cell() if row.at_once else "not run",
            row.one_stream.cell() if row.one_stream else "not run",
            accuracy.perplexity_cell() if accuracy else "not run",
            accuracy.replies_cell() if accuracy else "not run",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
