"""`cbserve bench accuracy --model FILE.gguf`: a GGUF file scored as it is served, beside
llama.cpp on the same file (issue 31's accuracy targets).

What runs (AccuracyPlan): float32 on the file's reference (bench/accuracy/reference.py),
then each path asked on the file itself; by default the one path `--dtype auto` serves
the file with on this CPU. llama-perplexity and llama-server run the same file.

The file's targets differ from the paths' gate (gate.py): a quantized file is not
float32, so it is held to what llama.cpp makes of the same file:
- perplexity under llama-perplexity's scoring (the same chunks of the same token ids)
  within FILE_PPL_TOLERANCE of llama-perplexity's own;
- greedy replies equal to float32's first REPLY_TOKENS tokens at least as often as
  llama-server's on the file are.
Without llama.cpp's binaries neither can be judged: the verdict says so, not pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FILE_PPL_TOLERANCE = 0.01


@dataclass(frozen=True)
class AccuracyPlan:
    """What the gate runs: (row label, model, compute path) in order, float32 first,
    and the GGUF that llama.cpp runs beside them (None: llama.cpp left out)."""

    runs: tuple[tuple[str, str, str], ...]
    gguf: Path | None
    file_mode: bool  # --model is a GGUF, judged by the file targets
    reference: str  # the float32 row's model

    @property
    def llamacpp_label(self) -> str:
        """How llama.cpp's rows are named: the shipped file's type as before, else the file."""
        return self.gguf.name if self.file_mode and self.gguf else "Q4_1"


def is_gguf(model: str | Path | None) -> bool:
    return model is not None and str(model).endswith(".gguf")


def auto_path(gguf: Path) -> str:
    """The path a worker's `--dtype auto` takes for this file on this CPU (measured once
    per CPU and shapes, then cached: worker_svc/compute/auto_choice.py)."""
    from worker_svc.compute.cpu_features import cpu_flags
    from worker_svc.compute.model_shapes import read_projection_shapes
    from worker_svc.compute.selection import select_path
    from worker_svc.model_loader import own_forward_serves

    path, why = select_path(
        "auto",
        "cpu",
        cpu_flags(),
        own_forward=own_forward_serves(gguf, "auto"),
        shapes=read_projection_shapes(gguf),
    )
    print(f"# --dtype auto on {gguf.name}: {path.name} ({why})", flush=True)
    return path.name


def plan(
    model: str | None,
    reference: str | None,
    paths: list[str] | None,
    shipped: Path | None,
    default_model: str,
    default_paths,
    file_paths=auto_path,
) -> AccuracyPlan:
    """The runs for the flags given. `default_paths()` and `file_paths(gguf)` give the
    paths when --paths is not given. Raises ValueError (ReferenceError) with a message
    naming the flag."""
    from bench.accuracy.reference import resolve_reference

    if not is_gguf(model):
        if reference is not None:
            raise ValueError("--reference is for a GGUF --model (FILE.gguf)")
        chosen = paths or default_paths()
        target = model or default_model
        runs = [("float32", target, "float32")]
        runs += [(p, target, p) for p in chosen if p != "float32"]
        # llama.cpp runs the shipped GGUF: the same model only when --model is the default.
        return AccuracyPlan(tuple(runs), shipped if model is None else None, False, target)
    gguf = Path(model)
    if not gguf.is_file():
        raise ValueError(f"--model {gguf}: no such file")
    ref = resolve_reference(gguf, Path(reference) if reference else None, shipped)
    chosen = paths or [file_paths(gguf)]
    runs = [("float32", str(ref), "float32")]
    # float32 asked on the file is its own dequantized weights, not the reference.
    runs += [(f"{p} (file)" if p == "float32" else p, str(gguf), p) for p in chosen]
    return AccuracyPlan(tuple(runs), gguf, True, str(ref))


def file_verdict(report: dict) -> dict:
    """Each file row against llama.cpp on the file: the figures and whether the targets
    are met (None where llama.cpp was left out)."""
    theirs_ppl = report["chunked"]["llama.cpp"]
    theirs_replies = report["llama.cpp replies"]
    rows = {}
    for label, row in report["paths"].items():
        if label == "float32":
            continue
        ours = row["chunked"]["perplexity"]
        verdict = {"perplexity": ours, "equal_replies": row["equal_replies"]}
        verdict["questions"] = len(row["replies"])
        ppl_met = replies_met = None
        if "perplexity" in theirs_ppl:
            verdict["llama_perplexity"] = theirs_ppl["perplexity"]
            verdict["ratio"] = ours / theirs_ppl["perplexity"]
            ppl_met = abs(verdict["ratio"] - 1) <= FILE_PPL_TOLERANCE
        if "equal_replies" in theirs_replies:
            verdict["llama_server_replies"] = theirs_replies["equal_replies"]
            replies_met = row["equal_replies"] >= theirs_replies["equal_replies"]
        verdict["perplexity_met"], verdict["replies_met"] = ppl_met, replies_met
        both = (ppl_met, replies_met)
        verdict["passes"] = None if None in both else all(both)
        rows[label] = verdict
    return rows


def _met(value: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "not judged (llama.cpp left out)"}[value]


def file_table(report: dict, reply_tokens: int) -> str:
    """The file's rows against llama.cpp's on the same file, as markdown."""
    name = Path(report["chunked"]["gguf"]).name
    lines = [
        f"{name} against llama.cpp on the same file (float32 reference: {report['reference']})",
        "",
        "| row | perplexity, llama-perplexity's chunks | llama-perplexity | ours vs theirs "
        f"| replies = float32's first {reply_tokens} | llama-server's | targets met |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, row in report["file"].items():
        theirs, served = row.get("llama_perplexity"), row.get("llama_server_replies")
        count = row["questions"]
        cells = [
            label,
            f"{row['perplexity']:.4f}",
            "" if theirs is None else f"{theirs:.4f}",
            "" if theirs is None else f"{row['ratio']:.4f}x",
            f"{row['equal_replies']}/{count}",
            "" if served is None else f"{served}/{count}",
            f"perplexity within 1%: {_met(row['perplexity_met'])}; "
            f"replies: {_met(row['replies_met'])}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
