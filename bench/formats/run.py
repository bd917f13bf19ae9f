"""Issue 31's table per format on this CPU, in one command:

    cbserve bench formats [--files shipped,q4_k_m,q8_0,qwen3-q4_k_m] [--threads 2]
    (also `python -m bench formats`, `make bench-formats`)

For each file (bench/peers/gguf_files.py makes the missing ones first with llama.cpp's
own tools): cbserve beside llama-server on that file, `cbserve bench --model FILE.gguf
--baselines llamacpp` at --num-prompts ShareGPT prompts at once, and at one stream
`python -m bench.formats.one_stream` (both servers up side by side, --stream-rounds
alternated rounds of one random 32-token prompt and --stream-tokens tokens, the median
of the rounds' ratios: one_stream.py says why); then `cbserve bench accuracy
--model FILE.gguf`, our perplexity beside llama-perplexity's and our greedy replies
beside float32's and llama-server's. Every run is a child process of its own, one after
another (no two systems share the CPU), with its files in --out-dir/<file>/; the table
(bench/formats/table.py) is printed as markdown for bench/RESULTS.md with the CPU named,
and written to --out-dir/formats.md and formats.json.

The runs take long: on a 2-core CPU the 64-prompt runs are minutes per file and system,
the accuracy runs minutes per file. `--num-prompts 2 --stream-tokens 8 --skip accuracy`
checks the command in a minute.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

from bench.formats.table import (
    FormatRow,
    accuracy_from_report,
    markdown,
    speed_from_results,
    speed_from_rounds,
)
from bench.peers.gguf_files import TABLE_FILES

PARTS = ("speed", "accuracy")


def _files(text: str) -> list[str]:
    keys = [k for k in text.split(",") if k]
    unknown = [k for k in keys if k not in TABLE_FILES]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"--files takes a comma-separated list of {', '.join(TABLE_FILES)}; got {text!r}"
        )
    return keys


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def parser(prog: str) -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    made.add_argument("--files", type=_files, default=list(TABLE_FILES), metavar="LIST")
    made.add_argument("--threads", type=positive, default=2, help="cbserve's and llama.cpp's")
    made.add_argument("--num-prompts", type=positive, default=64, help="the at-once run")
    made.add_argument("--stream-tokens", type=positive, default=128, help="the one-stream run")
    made.add_argument(
        "--stream-rounds", type=positive, default=9, help="the one-stream run's rounds"
    )
    made.add_argument("--texts", type=positive, default=16, help="the accuracy run's")
    made.add_argument("--skip", choices=PARTS, action="append", default=[], help="leave a part out")
    made.add_argument("--out-dir", type=Path, default=Path("out/bench-formats"))
    return made


def speed_argvs(gguf: Path, args, out: Path) -> dict[str, list[str]]:
    """The two command lines of one file's speed: at once, one stream.
    No vLLM column here: every row is a GGUF file, and vLLM 0.32 (the CPU build
    `--baselines vllm` measures) reads no GGUF at all (no `gguf` quantization method, no
    GGUF loader), so it does not apply; it is measured on HF directories by `cbserve bench
    --baselines vllm` (docs/benchmarks.md, "vLLM CPU as a peer")."""
    common = [sys.executable, "-m", "bench", "--model", str(gguf), "--baselines", "llamacpp"]
    common += ["--threads", str(args.threads), "--no-plots", "--no-progress"]
    # One stream: both servers up side by side, alternated rounds (bench/formats/one_stream.py).
    one_stream = [sys.executable, "-m", "bench.formats.one_stream", "--model", str(gguf)]
    one_stream += ["--threads", str(args.threads), "--tokens", str(args.stream_tokens)]
    one_stream += ["--rounds", str(args.stream_rounds)]
    return {
        "at_once": [*common, "--num-prompts", str(args.num_prompts)]
        + ["--out-dir", str(out / "at-once")],
        "one_stream": [*one_stream, "--json", str(out / "one-stream.json")],
    }


def accuracy_argv(gguf: Path, reference: Path | None, args, out: Path) -> list[str]:
    argv = [sys.executable, "-m", "bench", "accuracy", "--model", str(gguf)]
    argv += ["--reference", str(reference)] if reference else []
    argv += ["--threads", str(args.threads), "--texts", str(args.texts)]
    return [*argv, "--json", str(out / "accuracy.json")]


def _run(argv: list[str]) -> bool:
    print("+ " + " ".join(argv[1:]), file=sys.stderr, flush=True)
    return subprocess.run(argv, check=False).returncode in (0, 1)  # 1: a target missed


def measure_file(key: str, args) -> tuple[FormatRow, list[str]]:
    """One file's row, and what went wrong (a part that failed is left out of the row)."""
    from bench.peers.gguf_files import table_file

    row_spec, gguf, reference = table_file(key)
    out = args.out_dir / key
    out.mkdir(parents=True, exist_ok=True)
    speeds, errors, accuracy = {}, [], None
    if "speed" not in args.skip:
        for name, argv in speed_argvs(gguf, args, out).items():
            if name == "one_stream":  # bench/formats/one_stream.py's --json record
                results, read = Path(argv[argv.index("--json") + 1]), speed_from_rounds
            else:  # a `cbserve bench` run's results.json
                results = Path(argv[argv.index("--out-dir") + 1]) / "results.json"
                read = speed_from_results
            results.unlink(missing_ok=True)
            _run(argv)
            try:
                speeds[name] = read(json.loads(results.read_text()))
            except (OSError, ValueError, KeyError) as error:
                errors.append(f"{key} {name}: {error}")
    if "accuracy" not in args.skip:
        report = out / "accuracy.json"
        report.unlink(missing_ok=True)
        _run(accuracy_argv(gguf, reference, args, out))
        try:
            accuracy = accuracy_from_report(json.loads(report.read_text()))
        except (OSError, ValueError, KeyError) as error:
            errors.append(f"{key} accuracy: {error}")
    row = FormatRow(row_spec.name, speeds.get("at_once"), speeds.get("one_stream"), accuracy)
    return row, errors


def cpu_line() -> str:
    """The CPU as the table names it: its model name, family and model (a VM's model
    name can be as short as "AMD EPYC"), cores and the vector features that pick paths."""
    import os

    from worker_svc.compute.cpu_features import CPUINFO, cpu_flags, cpu_name

    numbers = {}
    try:
        for line in CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("cpu family", "model") and key.strip() not in numbers:
                numbers[key.strip()] = value.strip()
    except OSError:
        pass
    family = f" (family {numbers['cpu family']} model {numbers['model']})" if numbers else ""
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile")
    flags = " ".join(f for f in wanted if f in cpu_flags()) or "no AVX2"
    return f"{cpu_name()}{family}, {os.cpu_count()} cores, {flags}"


def settings_line(args, started: str, command: str) -> str:
    parts = [started]
    if "speed" not in args.skip:
        parts.append(
            f"at once: {args.num_prompts} ShareGPT prompts; one stream: a 32-token prompt, "
            f"{args.stream_tokens} tokens, {args.stream_rounds} alternated rounds"
        )
    if "accuracy" not in args.skip:
        parts.append(f"accuracy: {args.texts} texts, 16 questions")
    return "; ".join(parts) + f"; `{command}`"


def main(argv: list[str] | None = None, prog: str = "python -m bench.formats.run") -> int:
    args = parser(prog).parse_args(argv)
    from bench.peers import gguf_files

    try:
        gguf_files.make(args.threads)
    except (RuntimeError, FileNotFoundError) as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows, errors = [], []
    for key in args.files:
        row, problems = measure_file(key, args)
        rows.append(row)
        errors += problems
    command = f"{prog} {' '.join(argv if argv is not None else sys.argv[1:])}"
    settings = settings_line(args, started, command)
    cpu = cpu_line()
    table = markdown(rows, cpu, args.threads, settings, args.num_prompts)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "formats.md").write_text(table + "\n")
    payload = {"cpu": cpu, "threads": args.threads, "settings": settings, "errors": errors}
    payload["rows"] = [_as_dict(row) for row in rows]
    (args.out_dir / "formats.json").write_text(json.dumps(payload, indent=1))
    print(table)
    for message in errors:
        print(f"{prog}: {message}", file=sys.stderr)
    return 1 if errors else 0


def _as_dict(row: FormatRow) -> dict:
    from dataclasses import asdict

    return asdict(row)


if __name__ == "__main__":
    sys.exit(main())
