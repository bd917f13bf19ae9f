"""bench.transport.measure: the table's pure parts, and one tiny run of every candidate."""

from __future__ import annotations

import re

import pytest

from bench.transport.measure import CANDIDATES, Row, Traffic, best_of, format_table, main
from bench.transport.messages import CODECS

PACED = Traffic("outputs", 512, 0.005)


def _row(cost: float, rate: float) -> Row:
    return Row("stream+msgspec", PACED, cost, cost, cost, cost, rate, cost, cost)


def test_best_of_keeps_each_columns_best_run():
    best = best_of([_row(2.0, 10.0), _row(1.0, 5.0)])
    assert (best.send_us_per_entry, best.recv_us_per_entry, best.entries_per_s) == (1.0, 1.0, 10.0)


def test_latency_is_shown_only_where_paced():
    back_to_back = Traffic("outputs", 64, 0.0)
    table = format_table([_row(1.0, 5.0), Row("zmq+pickle", back_to_back, *[1.0] * 7)])
    paced_line, queued_line = table.splitlines()[2:]
    assert "every 5 ms" in paced_line and "(queued)" not in paced_line
    assert queued_line.endswith("| (queued) | (queued) |")


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_codecs_round_trip_both_directions(codec):
    codec = CODECS[codec]
    outputs = codec.stamp(codec.build_outputs(3, 7, 0), 123)
    decoded = codec.decode_outputs(codec.encode(outputs))
    assert codec.sent_at(decoded) == 123
    assert decoded == outputs or tuple(decoded) == tuple(outputs)
    submit = codec.stamp(codec.build_submit(5, 64), 456)
    assert codec.sent_at(codec.decode_request(codec.encode(submit))) == 456


@pytest.mark.process
def test_a_tiny_run_prints_a_row_for_every_candidate_and_traffic(capsys):
    assert main(["--duration", "0.05", "--pace-ms", "5", "--prompt-tokens", "64"]) == 0
    tables = capsys.readouterr().out.split("\n\n")
    rows = [line for line in tables[0].splitlines() if line.startswith("| ")][1:]
    labels = {(row.split(" | ")[0][2:], row.split(" | ")[1]) for row in rows}
    traffic = {
        "outputs x64, back-to-back",
        "outputs x512, back-to-back",
        "outputs x64, every 5 ms",
        "outputs x512, every 5 ms",
        "submit 64 ids",
    }
    assert labels == {(candidate, label) for candidate in CANDIDATES for label in traffic}
    for row in rows:
        costs = row.split(" | ")[2:7]
        assert all(re.fullmatch(r"-?[\d,]+\.\d{3}|[\d,]+", cost) for cost in costs), row
    codec_rows = [line for line in tables[1].splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0][2:] for row in codec_rows] == list(CODECS)
