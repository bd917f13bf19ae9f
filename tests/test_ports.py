"""cbserve.ports: ports handed out once, below the kernel's ephemeral range, and never
the same to two processes on one host."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from cbserve.ports import BLOCK_SIZE, PortBlocks, ephemeral_start, free_port, probe_port

# Tests use their own lock directory and a range of their own, so that they never
# claim what the suite's stacks take from the default blocks.
TEST_FIRST = 40_000


def _child_ports(lock_dir, count: int, hold: bool) -> subprocess.Popen:
    """A process that takes `count` ports from the test range and prints them; with
    hold, it then waits for a line on stdin before it exits (its claim lives on)."""
    code = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from cbserve.ports import PortBlocks
        blocks = PortBlocks({TEST_FIRST}, {TEST_FIRST + 4 * BLOCK_SIZE}, Path({str(lock_dir)!r}))
        print(" ".join(str(blocks.take()) for _ in range({count})), flush=True)
        if {hold}:
            sys.stdin.readline()
        """
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def test_ports_of_one_process_are_distinct_and_below_the_ephemeral_range():
    ports = [free_port() for _ in range(3 * BLOCK_SIZE // 2)]
    assert len(set(ports)) == len(ports)
    assert all(port < ephemeral_start() for port in ports)


def test_two_processes_never_get_the_same_port(tmp_path):
    ours = PortBlocks(TEST_FIRST, TEST_FIRST + 4 * BLOCK_SIZE, tmp_path)
    mine = {ours.take() for _ in range(BLOCK_SIZE + 5)}  # two blocks claimed
    child = _child_ports(tmp_path, BLOCK_SIZE + 5, hold=False)
    theirs = set(map(int, child.communicate(timeout=60)[0].split()))
    assert child.returncode == 0
    assert len(theirs) == BLOCK_SIZE + 5
    assert not mine & theirs


def test_a_claim_ends_with_its_process(tmp_path):
    holder = _child_ports(tmp_path, 1, hold=True)
    held_port = int(holder.stdout.readline())
    # While the child lives, all four blocks but its one are ours to take.
    ours = PortBlocks(TEST_FIRST, TEST_FIRST + 4 * BLOCK_SIZE, tmp_path)
    taken = {ours.take() for _ in range(3 * BLOCK_SIZE)}
    assert held_port not in taken
    with pytest.raises(OSError, match="other processes hold them all"):
        ours.take()
    holder.communicate("\n", timeout=60)
    # Its block is free again once it has exited.
    assert ours.take() == held_port


def test_a_port_someone_listens_on_is_skipped(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        blocks = PortBlocks(busy, busy + BLOCK_SIZE, tmp_path)
        assert blocks.take() == busy + 1


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaulted(tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("20000\t60999\n")
    assert ephemeral_start(ranges) == 20_000
    assert ephemeral_start(tmp_path / "missing") == 32_768


def test_a_range_outside_the_ports_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not within"):
        PortBlocks(60_000, 70_000, tmp_path)


def test_the_probe_port_is_free():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", probe_port()))
