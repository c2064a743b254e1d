"""A bounded loopback load test of the policy server: batched throughput, and /predict latency under load.

Run: ``python benchmarks/serve_load.py [--states 2048] [--batch 64] [--requests 800] [--clients 16]
[--session-runs 64] [--json OUT]``

The server is the real command, ``evoharness-agent serve --policy default`` (uvicorn, one worker), in
a process of its own on a free 127.0.0.1 port, with a fresh embedding cache: every state's new
texts are embedded by the server during the run, as in production (nothing is served from an
earlier run). The load generator runs in this process, so on a 2-core machine client and server
share the cores, as they would on one host.

States are real: every decision point of the bundled BFCL multi-turn runs (task, the steps so
far, that run's 16-30 tools), so the history grows as in an agent and each state brings about one
new text (the newest step).

1. ``/predict/batch``: the states are sent ``--batch`` at a time by one client; decisions/s =
   states / wall time. A second pass over the same states (texts now cached) shows the cost
   without embedding.
2. ``/predict`` under ``--clients`` concurrent clients (threads, one keep-alive connection each),
   ``--requests`` requests in all over states not seen in pass 1: p50 / p99 latency and requests/s;
   then the same requests again (texts cached).
3. Sessions under ``--clients`` concurrent clients: each client runs BFCL runs not seen before
   (``--session-runs`` in all, from the end of the list) as an agent would, one session a run,
   sending each decision's new steps (``/sessions/{id}/steps``): p50 / p99 latency of a decision
   and decisions/s.

Each figure comes with the server process's CPU time per decision (from ``/proc``, Linux): on a
shared machine the wall-clock figures fall with the load of other processes, the CPU time does
not, so ``cores / CPU time per decision`` estimates the rate on the same cores when unshared.

Figures only: nothing is asserted. Loopback only; the request count is fixed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from evoharness_agent.logs.bundled import domain_episodes
from evoharness_agent.server.client import predict_payload


def states(limit: int) -> list[dict[str, Any]]:
    """Every decision point of the bundled BFCL runs, as /predict bodies, up to ``limit``."""
    out = []
    for episode in domain_episodes("bfcl"):
        for index, step in enumerate(episode.steps):
            if step.is_decision:
                out.append(predict_payload(episode.task, episode.steps[:index], episode.tools))
                if len(out) == limit:
                    return out
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(port: int, cache: str, policy: str = "default", backend: str = "torch") -> subprocess.Popen:
    env = {**os.environ, "EVOHARNESS_CACHE_DIR": cache, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    process = subprocess.Popen([sys.executable, "-m", "evoharness_agent.cli", "serve", "--policy", policy,
                                "--backend", backend, "--port", str(port)],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited: {process.stderr.read().decode() if process.stderr else ''}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).raise_for_status()
            return process
        except httpx.HTTPError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError("server did not start")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def batched(url: str, bodies: list[dict[str, Any]], batch: int, pid: int) -> dict[str, float]:
    """Send the states ``batch`` at a time; return decisions per second and server CPU ms per decision."""
    with httpx.Client(base_url=url, timeout=300) as client:
        cpu, started = cpu_seconds(pid), time.perf_counter()
        for start in range(0, len(bodies), batch):
            response = client.post("/predict/batch", json={"items": bodies[start : start + batch]})
            response.raise_for_status()
            assert len(response.json()["results"]) == len(bodies[start : start + batch])
        wall = time.perf_counter() - started
        return {"decisions_per_s": len(bodies) / wall,
                "server_cpu_ms_per_decision": 1000 * (cpu_seconds(pid) - cpu) / len(bodies)}


class Tally:
    """The latencies of the requests that worked and the errors of the others, from many threads."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def post(self, client: httpx.Client, path: str, body: dict[str, Any], *, timed: bool = True,
             expected: int = 200) -> httpx.Response:
        """Send one request; keep its latency (``timed``) or its error."""
        started = time.perf_counter()
        response = client.post(path, json=body)
        elapsed = time.perf_counter() - started
        with self._lock:
            if response.status_code != expected:
                self.errors.append(f"{path} {response.status_code}: {response.text[:200]}")
            elif timed:
                self.latencies.append(elapsed)
        return response

    def figures(self, wall: float, cpu: float) -> dict[str, float]:
        """Return p50 / p99 in ms, requests/s and the server's CPU ms a request (an error fails the run)."""
        if self.errors:
            raise RuntimeError(f"{len(self.errors)} requests failed, e.g. {self.errors[0]}")
        ms = np.array(self.latencies) * 1000
        return {"requests": len(ms), "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
                "requests_per_s": len(ms) / wall, "server_cpu_ms_per_decision": 1000 * cpu / len(ms)}


def run_threads(worker: Callable[[Any], None], shares: list[Any], pid: int) -> tuple[float, float]:
    """Run ``worker`` on each share in a thread of its own; return the wall seconds and the server's CPU seconds."""
    threads = [threading.Thread(target=worker, args=(share,)) for share in shares]
    cpu, started = cpu_seconds(pid), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, cpu_seconds(pid) - cpu


def concurrent(url: str, bodies: list[dict[str, Any]], clients: int, pid: int) -> dict[str, float]:
    """Send every body to /predict from ``clients`` threads; return latency percentiles and requests/s."""
    tally = Tally()

    def worker(mine: list[dict[str, Any]]) -> None:
        with httpx.Client(base_url=url, timeout=300) as client:
            for body in mine:
                tally.post(client, "/predict", body)

    return tally.figures(*run_threads(worker, [bodies[i::clients] for i in range(clients)], pid))


def session_runs(count: int) -> list[tuple[str, list[dict[str, Any]], list[dict[str, Any]], list[int]]]:
    """The last ``count`` bundled BFCL runs: (task, wire tools, wire steps, the step count at each decision)."""
    out = []
    for episode in domain_episodes("bfcl")[-count:]:
        payload = predict_payload(episode.task, episode.steps, episode.tools)
        decisions = [index for index, step in enumerate(episode.steps) if step.is_decision]
        out.append((payload["task_description"], payload["available_tools"], payload["history"], decisions))
    return out


def sessions(url: str, runs: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]], list[int]]], clients: int,
             pid: int) -> dict[str, float]:
    """Play every run as a session from ``clients`` threads; return decision latency percentiles and decisions/s."""
    tally = Tally()

    def worker(mine: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]], list[int]]]) -> None:
        with httpx.Client(base_url=url, timeout=300) as client:
            for task, tools, steps, decisions in mine:
                created = tally.post(client, "/sessions", {"task_description": task, "available_tools": tools},
                                     timed=False, expected=201)
                if created.status_code != 201:
                    continue
                path, held = f"/sessions/{created.json()['session_id']}/steps", 0
                for index in decisions:
                    tally.post(client, path, {"start": held, "steps": steps[held:index]})
                    held = index

    return tally.figures(*run_threads(worker, [runs[i::clients] for i in range(clients)], pid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--states", type=int, default=2048, help="States sent to /predict/batch.")
    parser.add_argument("--batch", type=int, default=64, help="States per /predict/batch request.")
    parser.add_argument("--requests", type=int, default=800, help="/predict requests in the concurrent run.")
    parser.add_argument("--clients", type=int, default=16, help="Concurrent /predict clients.")
    parser.add_argument("--session-runs", type=int, default=64, help="BFCL runs played as concurrent sessions.")
    parser.add_argument("--json", type=Path, help="Also write the figures here.")
    parser.add_argument("--policy", default="default", help="Policy directory served (onnx: an export's).")
    parser.add_argument("--backend", default="torch", choices=["torch", "onnx"], help="The server's backend.")
    args = parser.parse_args()
    bodies = states(args.states + args.requests)
    batch_states, single_states = bodies[: args.states], bodies[args.states :]
    port = free_port()
    with tempfile.TemporaryDirectory() as cache:
        server = start_server(port, cache, args.policy, args.backend)
        url = f"http://127.0.0.1:{port}"
        try:
            batched(url, bodies[:8], 8, server.pid)  # connection and first-call warm-up, not counted
            cold = batched(url, batch_states, args.batch, server.pid)
            warm = batched(url, batch_states, args.batch, server.pid)
            latency = concurrent(url, single_states, args.clients, server.pid)
            latency_cached = concurrent(url, single_states, args.clients, server.pid)
            session_run = sessions(url, session_runs(args.session_runs), args.clients, server.pid)
            load = os.getloadavg()[0]
        finally:
            server.terminate()
            server.wait(timeout=30)
    cores = len(os.sched_getaffinity(0))
    figures = {"cores": cores, "load_average_1min": load, "states": len(batch_states), "batch": args.batch,
               "batched": cold, "batched_cached_texts": warm, "clients": args.clients, "predict": latency,
               "predict_cached_texts": latency_cached, "sessions": session_run}

    def rates(run: dict[str, float]) -> str:
        unshared = cores * 1000 / run["server_cpu_ms_per_decision"]
        return (f"{run['decisions_per_s']:,.0f} decisions/s, server CPU {run['server_cpu_ms_per_decision']:.2f} ms "
                f"per decision (~{unshared:,.0f}/s on {cores} unshared cores)")

    print(f"{cores} cores, load average {load:.1f}")
    print(f"/predict/batch, {len(batch_states)} states, {args.batch} per request: {rates(cold)}")
    print(f"  same states again (texts already embedded): {rates(warm)}")
    for name, run in (("new texts", latency), ("texts already embedded", latency_cached)):
        print(f"/predict, {args.clients} concurrent clients, {run['requests']} requests ({name}): "
              f"p50 {run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms, {run['requests_per_s']:.0f} requests/s, "
              f"server CPU {run['server_cpu_ms_per_decision']:.2f} ms per decision")
    print(f"sessions, {args.clients} concurrent clients, {session_run['requests']} decisions of "
          f"{args.session_runs} runs: p50 {session_run['p50_ms']:.1f} ms, p99 {session_run['p99_ms']:.1f} ms, "
          f"{session_run['requests_per_s']:.0f} decisions/s, server CPU "
          f"{session_run['server_cpu_ms_per_decision']:.2f} ms per decision")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
