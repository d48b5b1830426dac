"""A real `helios serve` process on a free port of 127.0.0.1, for the server tests."""
import os
import signal
import socket
import subprocess
import time

import httpx
import openai

API_KEY = "test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    "A `helios serve` subprocess on a free port."
    def __init__(self, *args, api_key=API_KEY, env=None, log_level="warning"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = ["helios", "serve", "--port", str(self.port), "--threads", "1", *args]
        if api_key: cmd += ["--api-key", api_key]
        if log_level: cmd += ["--log-level", log_level]  # at info (serve's default) a line per request: None keeps it
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None: raise RuntimeError(f"server exited: {self.proc.stdout.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200: return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise TimeoutError("server did not start")

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=API_KEY, **kw)

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", headers=self.headers).text
        values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith(name + "{") or line.startswith(name + " ")]
        return sum(values)

    def wait_idle(self, timeout=10.0):
        "Wait until no page is held by a request; return how long that took."
        start = time.time()
        while time.time() - start < timeout:
            if self.metric("helios:kv_pages_used") == 0 and self.metric("helios:num_requests_running") == 0:
                return time.time() - start
            time.sleep(0.05)
        raise AssertionError(f"pages still used after {timeout} s")

    def stop(self, sig=signal.SIGTERM, timeout=60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)
