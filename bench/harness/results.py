"""The results of a `cbserve bench` run: its columns, the ratios between them, and the
files (results.json, results.md, PNG plots) that keep them.

results.md starts with what makes a table comparable later (the command, the date,
the machine and the workload) so that it can be pasted into bench/RESULTS.md as is.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from bench.harness import metrics, plots, report

# The server counter the table shows: a preempted request is recomputed, so its count
# explains throughput that a small KV pool lost.
PREEMPTIONS = "cbserve_num_preemptions_total"
# Histograms that split every engine iteration into the worker's forward and the rest.
FORWARD = "cbserve_step_forward_seconds"
OVERHEAD = "cbserve_step_overhead_seconds"


def _summed(counters: dict[str, float], name: str) -> float:
    """A histogram's sum (or count) over every worker label."""
    return sum(v for key, v in counters.items() if key.split("{", 1)[0] == name)


def step_split(counters: dict[str, float]) -> dict[str, float]:
    """Mean step and the share of it outside the worker's forward, from counter growth."""
    steps = _summed(counters, FORWARD + "_count")
    forward = _summed(counters, FORWARD + "_sum")
    overhead = _summed(counters, OVERHEAD + "_sum")
    if steps <= 0 or forward + overhead <= 0:
        return {}
    return {
        "steps": int(steps),
        "mean_step_ms": round((forward + overhead) / steps * 1000, 2),
        "step_overhead_pct": round(100 * overhead / (forward + overhead), 2),
    }


@dataclass
class Column:
    """One measured run (one system at one request rate): a column of the table."""

    label: str
    system: str
    rate: float
    timings: list = field(default_factory=list)
    wall_s: float = 0.0
    info: dict = field(default_factory=dict)


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


def rate_label(rate: float) -> str:
    return "all at once" if math.isinf(rate) else f"{rate:g} req/s"


def workload_line(workload: dict, rates: list[float]) -> str:
    w = workload
    parts = [
        f"{w['num_prompts']} {w['dataset']} prompts (seed {w['seed']})",
        f"{w['total_prompt_tokens']} prompt tokens",
        f"{w['total_output_tokens']} output tokens asked"
        + (f" (replies capped at {w['max_output_tokens']})" if w.get("max_output_tokens") else ""),
        "EOS ignored" if w["ignore_eos"] else "EOS honoured",
        "greedy" if w["temperature"] == 0 else f"temperature {w['temperature']}",
        "arrivals: " + ", ".join(rate_label(rate) for rate in rates),
    ]
    if any(not math.isinf(rate) for rate in rates):
        parts.append(f"burstiness {w['burstiness']:g}")
    if w.get("max_concurrency"):
        parts.append(f"max concurrency {w['max_concurrency']}")
    if w.get("lora_requests"):
        # The adapters the requests named (bench/harness/lora_assignment.py).
        spread = ", ".join(f"{name} {count}" for name, count in w["lora_requests"].items())
        parts.append(f"LoRA adapters ({w['lora_assignment']}): {spread} requests")
    return "; ".join(parts)


def column_label(system: str, rate: float, rates: list[float]) -> str:
    return system if len(rates) == 1 else f"{system} @ {rate_label(rate)}"


def comparisons(columns: list[Column]) -> list[tuple[str, str, str]]:
    """(header, cbserve column, baseline column) for every comparable pair."""
    # The measured system: cbserve over gRPC, or the server behind --backend openai.
    measured = ("cbserve", "openai")
    ours = {c.rate: c for c in columns if c.system in measured}
    several = len(ours) > 1
    pairs = []
    for column in columns:
        if column.system in measured or column.rate not in ours:
            continue
        name = {
            "static": "static",
            "hf": "transformers",
            "llamacpp": "llama.cpp",
            "vllm": "vLLM CPU",
            # --lora-beside-base: the adapters' requests again, on the base.
            "base": "the base",
        }[column.system]
        suffix = f" @ {rate_label(column.rate)}" if several else ""
        ours_column = ours[column.rate]
        header = f"{ours_column.system} vs {name}{suffix}"
        pairs.append((header, ours_column.label, column.label))
    return pairs


def summaries(columns: list[Column], slos: dict[str, float]) -> dict[str, dict]:
    out = {}
    for column in columns:
        summary = metrics.summarize(column.timings, column.wall_s, slos)
        counters = column.info.get("server_counters", {})
        if PREEMPTIONS in counters:
            summary["preemptions"] = int(counters[PREEMPTIONS])
        summary.update(step_split(counters))
        out[column.label] = summary
    return out


def write(
    out: Path,
    command: str,
    workload: dict,
    rates: list[float],
    columns: list[Column],
    slos: dict[str, float],
    errors: list[str],
    with_plots: bool = True,
) -> tuple[str, list[Path]]:
    """Writes the files; returns the markdown table and the paths written."""
    by_label = summaries(columns, slos)
    pairs = comparisons(columns)
    table = report.markdown_table(by_label, pairs)
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    header = [
        f"Command: `{command}`",
        f"Date: {date}",
        "Machine: {cpu}, {cores} cores, Python {python}".format(**machine()),
        "Workload: " + workload_line(workload, rates),
    ]
    payload = {
        "benchmark": "cbserve bench",
        "command": command,
        "date": date,
        "machine": machine(),
        "workload": workload,
        "goodput_slos_ms": slos,
        "runs": [
            {
                "label": c.label,
                "system": c.system,
                "request_rate": None if math.isinf(c.rate) else c.rate,
                "info": c.info,
                "summary": by_label[c.label],
                "requests": metrics.per_request(c.timings),
            }
            for c in columns
        ],
        "ratios": report.ratio_summary(by_label, pairs),
        "errors": errors,
    }
    report.write_json(out / "results.json", payload)
    (out / "results.md").write_text("\n\n".join(["\n".join(header), table]) + "\n")
    written = [out / "results.json", out / "results.md"]
    if with_plots and columns:
        curves: dict[str, list[tuple[float, float]]] = {}
        for c in columns:
            curves.setdefault(c.system, []).append((c.rate, by_label[c.label]["output_throughput"]))
        written += plots.write_plots(
            out,
            curves,
            {c.label: [t.ttft * 1000 for t in c.timings if t.ok] for c in columns},
            {c.label: [g * 1000 for t in c.timings if t.ok for g in t.itls()] for c in columns},
        )
    return table, written
