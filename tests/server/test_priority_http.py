"""Over HTTP: `priority` overtakes a queue, `--max-model-len` caps what the server accepts and reports, and
`helios serve` logs one line per generation request at its default log level."""
import re
import subprocess
import threading
import time

import httpx

from _server import Server

LOG_LINE = re.compile(r"^helios: POST /v1/(chat/)?completions (\d{3}) (chat)?cmpl-\w+ prompt=\d+ cached=\d+ out=\d+ "
                      r"ttft=(\d+\.\d\ds|-) e2e=\d+\.\d\ds", re.M)


def wait_for(condition, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition(): return
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_a_high_priority_request_overtakes_a_queue_and_each_request_is_logged(tiny_folder):
    s = Server("--model", str(tiny_folder), "--max-batch-size", "1", api_key=None, log_level=None)  # serve's default
    done, answers = [], {}
    try:
        def ask(name, priority=None, max_tokens=8, prompt=None):
            body = {"prompt": prompt or f"request {name}", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            if priority is not None: body["priority"] = priority
            r = httpx.post(s.url + "/v1/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            answers[name] = r.json()["choices"][0]["text"]
            done.append(name)

        waiting = lambda: httpx.get(s.url + "/health").json()["waiting"]
        # n=4 with one place: its sequences run one after another, for seconds; they wait ahead of everyone below
        blocker = {"prompt": "hold the line", "max_tokens": 1800, "temperature": 0, "ignore_eos": True, "stream": True,
                   "n": 4}
        with httpx.stream("POST", s.url + "/v1/completions", json=blocker, timeout=120) as held:
            lines = held.iter_lines()                     # (kept: a dropped iterator closes the stream)
            next(lines)                                   # it runs: the one place is taken
            wait_for(lambda: waiting() == 3)
            threads = [threading.Thread(target=ask, args=(f"queued-{i}",)) for i in range(3)]
            for i, t in enumerate(threads):
                t.start()
                wait_for(lambda: waiting() == 3 + i + 1)  # one at a time, so that their arrival order is known
            threads.append(threading.Thread(target=ask, args=("urgent", -5)))
            threads[-1].start()
            wait_for(lambda: waiting() == 3 + 4)
        for t in threads: t.join(120)                     # the blocker's stream closed: it is cancelled, all of it
        assert done == ["urgent", "queued-0", "queued-1", "queued-2"], done
        ask("urgent-alone", prompt="request urgent")      # the same request, nobody queued, no priority
        assert answers["urgent-alone"] == answers["urgent"]
        for bad in (2**31, -(2**31), 1.5, "high", True):
            r = httpx.post(s.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                 "priority": bad}, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
        r = httpx.post(s.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "priority": 2**31 - 1})
        assert r.status_code == 200, r.text
    finally:
        assert s.stop() == 0
    log = s.proc.stdout.read()
    lines = LOG_LINE.findall(log)
    assert len(lines) == 1 + 3 + 1 + 1 + 1, log      # the blocker, the queue, urgent, urgent alone, one chat
    assert sum(1 for route, status, *_ in lines if route == "chat/" and status == "200") == 1
    assert re.search(r"^helios: POST /v1/completions 200 cmpl-\w+ .* priority=-5$", log, re.M), log
    assert re.search(r"^helios: POST /v1/completions 200 cmpl-\w+ .* out=\d+ .* disconnected$", log, re.M), log


def test_the_same_tokens_whatever_the_priority(tiny_folder):
    s = Server("--model", str(tiny_folder), "--max-batch-size", "2", api_key=None, log_level="warning")
    try:
        def text(priority):
            body = {"prompt": "The same request", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                    "priority": priority}
            return httpx.post(s.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
        assert text(0) == text(-100) == text(100)
    finally:
        assert s.stop() == 0
    assert not LOG_LINE.search(s.proc.stdout.read())  # --log-level warning: no line per request


def test_max_model_len_caps_the_server(tiny_folder):
    s = Server("--model", str(tiny_folder), "--served-model-name", "tiny", "--max-model-len", "64", api_key=None)
    try:
        models = httpx.get(s.url + "/v1/models").json()["data"]
        assert models[0]["max_model_len"] == 64
        r = httpx.post(s.url + "/v1/completions", json={"prompt": list(range(1000, 1070)), "max_tokens": 1}, timeout=30)
        assert r.status_code == 400 and "context of 64" in r.json()["error"]["message"], r.text
        r = httpx.post(s.url + "/v1/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": "word " * 70}]})
        assert r.status_code == 400 and "64" in r.json()["error"]["message"], r.text
        r = httpx.post(s.url + "/tokenize", json={"prompt": "hello"}, timeout=30)
        assert r.json()["max_model_len"] == 64
        r = httpx.post(s.url + "/v1/completions", json={"prompt": list(range(1000, 1040)), "max_tokens": 8}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        assert s.stop() == 0


def test_max_model_len_above_the_model_is_a_one_line_error(tiny_folder):
    r = subprocess.run(["helios", "serve", "--model", str(tiny_folder), "--threads", "1", "--max-model-len", "99999"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert ("helios: error: max_model_len=99,999 is above the model's context (max_position_embeddings=2,048)"
            in r.stderr), r.stderr
