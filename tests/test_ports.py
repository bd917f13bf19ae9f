"""cbserve.ports: ports handed out once, below the kernel's ephemeral range, and never
the same to two processes on one host."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from cbserve.ports import BLOCK_SIZE, PortBlocks, ephemeral_start, free_port, probe_port

# Tests use their own lock directory, small blocks and a range of their own: above the
# kernel's default ephemeral range (32768-60999), where no outgoing connection of the
# suite holds a port, and outside the default blocks, so they never touch what the
# suite's stacks are given.
TEST_FIRST = 61_000
SMALL = 4
TEST_END = TEST_FIRST + 4 * SMALL


def _blocks(lock_dir) -> PortBlocks:
    return PortBlocks(TEST_FIRST, TEST_END, lock_dir, block_size=SMALL)


def _child_ports(lock_dir, count: int, hold: bool) -> subprocess.Popen:
    """A process that takes `count` ports from the test range and prints them; with
    hold, it then waits for a line on stdin before it exits (its claim lives on)."""
    code = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from cbserve.ports import PortBlocks
        blocks = PortBlocks({TEST_FIRST}, {TEST_END}, Path({str(lock_dir)!r}), block_size={SMALL})
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


@pytest.mark.process
def test_two_processes_never_get_the_same_port(tmp_path):
    ours = _blocks(tmp_path)
    mine = {ours.take() for _ in range(SMALL + 1)}  # two blocks claimed
    child = _child_ports(tmp_path, SMALL + 1, hold=False)
    theirs = set(map(int, child.communicate(timeout=60)[0].split()))
    assert child.returncode == 0
    assert len(mine) == len(theirs) == SMALL + 1
    assert not mine & theirs
    assert all(TEST_FIRST <= port < TEST_END for port in mine | theirs)


@pytest.mark.process
def test_a_claim_ends_with_its_process(tmp_path):
    holder = _child_ports(tmp_path, 1, hold=True)
    held_port = int(holder.stdout.readline())
    # While the child lives, all four blocks but its one are ours to take.
    ours = _blocks(tmp_path)
    taken = {ours.take() for _ in range(3 * SMALL)}
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
        blocks = PortBlocks(busy, busy + SMALL, tmp_path, block_size=SMALL)
        assert blocks.take() == busy + 1


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaulted(tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("20000\t60999\n")
    assert ephemeral_start(ranges) == 20_000
    assert ephemeral_start(tmp_path / "missing") == 32_768


def test_a_range_outside_the_ports_or_an_empty_block_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not within"):
        PortBlocks(60_000, 70_000, tmp_path)
    with pytest.raises(ValueError, match="block_size"):
        PortBlocks(TEST_FIRST, TEST_END, tmp_path, block_size=0)


def test_the_probe_port_is_free():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", probe_port()))
