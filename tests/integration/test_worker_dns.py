"""--worker-dns follows the addresses behind a name, with real worker processes.

There is no DNS server to change here, so the scheduler resolves the name from
a hosts-format file (--worker-hosts-file) that the test rewrites, exactly as a
headless Service's records change when pods come and go. The two workers
listen on the same port on two loopback addresses, 127.0.0.1 and 127.0.0.2
(all of 127/8 is loopback on Linux), as two pods would on two pod IPs.
127.0.0.3 has no worker: an address that never answers.

The scheduler's stderr goes to a file, so that its JSON log lines can be
checked at the end.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading

import grpc
import pytest

from cbserve.client import Client
from cbserve.local_stack import ChildProcess, free_port
from tests.integration.ops import (
    GENERATION,
    NOT_SERVING,
    SERVING,
    health_status,
    per_worker,
    scrape,
)
from tests.waiting import wait_until

NAME = "cbserve-worker.test"
IPS = ("127.0.0.1", "127.0.0.2")
SILENT_IP = "127.0.0.3"
WORKER_ARGS = ["--dtype", "float32", "--threads", "1", "--num-kv-blocks", "128"]
GREEDY = {"temperature": 0.0, "ignore_eos": True}


def _port_free_on_every_address() -> int:
    while True:
        port = free_port()
        try:
            for ip in (*IPS[1:], SILENT_IP):
                with socket.socket() as probe:
                    probe.bind((ip, port))
        except OSError:
            continue
        return port


class DnsStack:
    def __init__(self, tmp_path) -> None:
        self.port = _port_free_on_every_address()
        self.hosts_file = tmp_path / "hosts"
        self.hosts_file.write_text("")
        self.log_path = tmp_path / "scheduler.log"
        self.scheduler_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{(metrics_port := free_port())}/metrics"
        self.workers = [
            ChildProcess(
                f"worker {ip}",
                [sys.executable, "-m", "worker_svc", "--host", ip, "--port", str(self.port)]
                + WORKER_ARGS,
            )
            for ip in IPS
        ]
        argv = [sys.executable, "-m", "scheduler_svc", "--host", "127.0.0.1"]
        argv += ["--port", str(self.scheduler_port), "--metrics-port", str(metrics_port)]
        argv += ["--worker-dns", f"{NAME}:{self.port}", "--worker-hosts-file", str(self.hosts_file)]
        argv += ["--worker-dns-interval", "0.2", "--worker-connect-timeout", "5"]
        # Once every worker is gone a request waits this long for one before UNAVAILABLE
        # (30 s by default): the removal test asks for that answer.
        argv += ["--worker-wait-timeout", "3"]
        with open(self.log_path, "w") as log:
            self.scheduler = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
            )
        self.ready_line = self.scheduler.stdout.readline()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.scheduler_port}"

    def worker(self, ip: str) -> str:
        return f"{ip}:{self.port}"

    def list_behind_name(self, *ips: str) -> None:
        self.hosts_file.write_text("".join(f"{ip} {NAME}\n" for ip in ips))

    def live_workers(self) -> list[str]:
        try:
            with Client(self.address, retry=None) as client:
                return list(client.model_info(timeout=5).workers)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            return []

    def wait_for_workers(self, *ips: str) -> None:
        expected = sorted(self.worker(ip) for ip in ips)
        wait_until(f"workers {expected}", lambda: self.live_workers() == expected)

    def log_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line]

    def stop(self) -> None:
        if self.scheduler.poll() is None:
            self.scheduler.send_signal(signal.SIGTERM)
            try:
                self.scheduler.wait(10)
            except subprocess.TimeoutExpired:
                self.scheduler.kill()
                self.scheduler.wait()
        for worker in self.workers:
            worker.stop()


@pytest.fixture(scope="module")
def dns_stack(tmp_path_factory):
    stack = DnsStack(tmp_path_factory.mktemp("dns"))
    try:
        for worker in stack.workers:
            worker.wait_ready()
        yield stack
    finally:
        stack.stop()


def _generate_ok(stack: DnsStack, request_id: str) -> None:
    with Client(stack.address) as client:
        done = client.complete("Name a fruit.", request_id=request_id, max_tokens=4, **GREEDY)
    assert len(done.token_ids) == 4


def _unavailable(stack: DnsStack) -> bool:
    with Client(stack.address, retry=None) as client, pytest.raises(grpc.RpcError) as raised:
        client.complete("Hi", max_tokens=2)
    return raised.value.code() == grpc.StatusCode.UNAVAILABLE


def test_scheduler_starts_before_any_worker_and_serves_once_one_connects(dns_stack):
    assert f"worker_dns={NAME}:{dns_stack.port}" in dns_stack.ready_line
    assert health_status(dns_stack.address) == NOT_SERVING
    assert health_status(dns_stack.address, GENERATION) == NOT_SERVING
    assert _unavailable(dns_stack)
    # Listed but never answering: retried, never served.
    dns_stack.list_behind_name(SILENT_IP)
    silent = dns_stack.worker(SILENT_IP)
    wait_until(
        "the silent address is being dialled",
        lambda: f'cbserve_worker_connected{{worker="{silent}"}}' in scrape(dns_stack.metrics_url),
    )
    assert health_status(dns_stack.address) == NOT_SERVING
    dns_stack.list_behind_name(IPS[0])
    dns_stack.wait_for_workers(IPS[0])
    assert health_status(dns_stack.address) == SERVING
    assert health_status(dns_stack.address, GENERATION) == SERVING
    assert not any(f'worker="{silent}"' in key for key in scrape(dns_stack.metrics_url))
    _generate_ok(dns_stack, "dns-first")


def test_a_worker_added_behind_the_name_is_picked_up(dns_stack):
    dns_stack.list_behind_name(*IPS)
    dns_stack.wait_for_workers(*IPS)
    before = scrape(dns_stack.metrics_url)
    for index in range(4):
        _generate_ok(dns_stack, f"dns-both-{index}")
    after = scrape(dns_stack.metrics_url)
    for ip in IPS:
        worker = dns_stack.worker(ip)
        name = "cbserve_worker_requests_total"
        assert per_worker(after, name, worker) > per_worker(before, name, worker), worker
    assert after["cbserve_workers_connected"] == 2


def test_a_worker_removed_from_the_name_is_dropped(dns_stack):
    dns_stack.list_behind_name(IPS[1])
    dns_stack.wait_for_workers(IPS[1])
    gone = dns_stack.worker(IPS[0])
    samples = scrape(dns_stack.metrics_url)
    assert not any(f'worker="{gone}"' in key for key in samples)
    # Totals keep what the removed worker counted.
    assert samples["cbserve_prefix_cache_queries_total"] > 0
    _generate_ok(dns_stack, "dns-after-removal")
    dns_stack.list_behind_name()
    wait_until("not serving", lambda: health_status(dns_stack.address) == NOT_SERVING)
    assert _unavailable(dns_stack)


def test_requests_on_a_removed_worker_end_unavailable(dns_stack):
    dns_stack.list_behind_name(IPS[0])
    dns_stack.wait_for_workers(IPS[0])
    first_token = threading.Event()
    outcome: list[grpc.StatusCode] = []

    def long_request() -> None:
        with Client(dns_stack.address) as client:
            try:
                for _ in client.generate(
                    "Tell me a long story.", request_id="dns-lost", max_tokens=1000, **GREEDY
                ):
                    first_token.set()
            except grpc.RpcError as error:
                outcome.append(error.code())

    thread = threading.Thread(target=long_request)
    thread.start()
    assert first_token.wait(60)
    dns_stack.list_behind_name()
    thread.join(60)
    assert outcome == [grpc.StatusCode.UNAVAILABLE]


def test_logs_are_json_lines_with_a_summary_per_request(dns_stack):
    lines = dns_stack.log_lines()
    assert all({"event", "level", "timestamp"} <= line.keys() for line in lines)
    events = [line["event"] for line in lines]
    for event in ("worker appeared", "worker connected", "worker disappeared", "serving"):
        assert event in events, event
    summaries = {line["request_id"]: line for line in lines if line["event"] == "request finished"}
    first = summaries["dns-first"]
    assert first["worker"] == dns_stack.worker(IPS[0])
    assert first["finish_reason"] == "length" and first["output_tokens"] == 4
    assert first["prompt_tokens"] > 0
    assert 0 <= first["queue_time_s"] <= first["ttft_s"] <= first["total_time_s"]
    assert {summaries[f"dns-both-{i}"]["worker"] for i in range(4)} == {
        dns_stack.worker(ip) for ip in IPS
    }
    (lost,) = [line for line in lines if line.get("request_id") == "dns-lost"]
    assert lost["event"] == "request failed" and lost["code"] == "UNAVAILABLE"
    # Lines about a request never lack its id.
    for line in lines:
        if line["event"].startswith("request "):
            assert line.get("request_id"), line
