"""The Step round-trip floor runs over both transports and prints what it measured."""

from __future__ import annotations

import re

import pytest

from bench.micro.grpc_round_trip import main


@pytest.mark.parametrize(
    ("flags", "where"), [([], "TCP loopback"), (["--unix-socket"], "a Unix socket")]
)
def test_it_prints_the_wall_and_cpu_of_a_round_trip(capsys, flags, where):
    assert main(["--round-trips", "20", *flags]) == 0
    line = capsys.readouterr().out.strip()
    found = re.fullmatch(
        rf"20 Step round trips over {where}: (\d+) µs wall, (\d+) µs CPU each \(both ends\)", line
    )
    assert found, line
    assert int(found.group(1)) > 0  # the CPU of 20 round trips may round to 0 µs on a coarse clock
