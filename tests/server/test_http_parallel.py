"""`helios serve --tensor-parallel-size 2` through the official openai client: the tokens of one process; SIGTERM
stops every rank; a worker killed mid-stream fails its requests with an error and the server exits 1; ranks
started with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) serve the same tokens."""
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import openai
import pytest

from _server import Server, free_port
from helios import LLM, SamplingParams

MODEL_ARGS = ["--dtype", "float32", "--device", "cpu", "--kv-cache-bytes", "2e7"]
PROMPT = "The three laws of thermodynamics are"


def children(pid: int) -> list[int]:
    "The processes pid started (its workers and multiprocessing's resource tracker)."
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def workers(pid: int) -> list[int]:
    return [p for p in children(pid) if b"resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes()]


def wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in pids): time.sleep(0.1)
    return [p for p in pids if Path(f"/proc/{p}").exists()]


@pytest.fixture(scope="module")
def expected(tiny_folder) -> str:
    "The text one process gives (greedy, 12 tokens)."
    with LLM(tiny_folder, dtype="float32", device="cpu", quiet=True) as llm:
        return llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)[0].text


def complete(client: openai.OpenAI, folder) -> str:
    r = client.completions.create(model=str(folder), prompt=PROMPT, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True})
    return r.choices[0].text


def test_two_ranks_serve_the_tokens_of_one_and_sigterm_stops_every_process(tiny_folder, expected):
    server = Server("--model", str(tiny_folder), "--tensor-parallel-size", "2", *MODEL_ARGS)
    started = children(server.proc.pid)
    assert len(workers(server.proc.pid)) == 1
    assert complete(server.client(), tiny_folder) == expected
    assert server.stop(signal.SIGTERM) == 0
    assert wait_gone(started) == []


def test_a_killed_worker_fails_the_stream_and_the_server_exits_1(tiny_folder):
    server = Server("--model", str(tiny_folder), "--tensor-parallel-size", "2", *MODEL_ARGS)
    started, (worker,) = children(server.proc.pid), workers(server.proc.pid)
    outcome = {}

    def stream():
        try:
            chunks = server.client().completions.create(model=str(tiny_folder), prompt=PROMPT, max_tokens=1000,
                                                        temperature=0, stream=True, extra_body={"ignore_eos": True})
            outcome["chunks"] = sum(1 for _ in chunks)
        except openai.APIError as e:
            outcome["error"] = str(e)
    reader = threading.Thread(target=stream)
    reader.start()
    time.sleep(1.0)  # the stream is running
    os.kill(worker, signal.SIGKILL)
    killed = time.time()
    reader.join(30)
    assert "worker rank 1 exited with code -9" in outcome.get("error", ""), outcome
    assert server.proc.wait(timeout=30) == 1
    assert time.time() - killed < 30
    assert "the engine failed: worker rank 1 exited" in server.proc.stdout.read()
    assert wait_gone(started) == []


def test_ranks_started_with_torchrun_environment_serve_the_same_tokens(tiny_folder, expected):
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    rank1 = subprocess.Popen(["helios", "serve", "--model", str(tiny_folder), "-tp", "2", "--threads", "1", *MODEL_ARGS],
                             env={**os.environ, **env, "RANK": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        server = Server("--model", str(tiny_folder), "-tp", "2", *MODEL_ARGS, env={**env, "RANK": "0"})
        assert workers(server.proc.pid) == []  # nothing spawned: rank 1 is the other process
        assert complete(server.client(), tiny_folder) == expected
        assert server.stop(signal.SIGTERM) == 0
        assert rank1.wait(timeout=30) == 0  # told to stop by rank 0
    finally:
        if rank1.poll() is None: rank1.kill()


def test_torchrun_starts_the_ranks_and_they_serve_the_same_tokens(tiny_folder, expected):
    "torchrun's agent already serves a store at MASTER_PORT: every rank joins it, rank 0 serves."
    import httpx
    port = free_port()
    cmd = ["torchrun", "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "--no-python", "helios", "serve", "--model", str(tiny_folder), "-tp", "2",
           "--threads", "1", "--port", str(port), *MODEL_ARGS]
    agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200: break
            except httpx.HTTPError:
                time.sleep(0.3)
        ranks = children(agent.pid)
        assert len(ranks) == 2
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        assert complete(client, tiny_folder) == expected
        agent.send_signal(signal.SIGTERM)  # torchrun passes it to both ranks
        agent.wait(timeout=60)
        assert wait_gone(ranks) == []
    finally:
        if agent.poll() is None: agent.kill()
