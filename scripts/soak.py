"""A soak: mixed traffic through every endpoint of a running `helios serve`, at a bounded rate, for a given time.

A fixed number of client workers (threads, each with its own connection pool and a seeded random mix) send
completions, chats, streams, `n > 1`, JSON-schema grammars, forced tool calls, Responses and Messages requests,
streams closed after a few chunks, requests whose client hangs up, prompts that share a system prompt (prefix
hits) and long prompts that overflow a small KV pool (preemption, swaps to the host tier), with bad inputs in
between. Every answer is tallied as the client saw it; at the end the server's /metrics must agree, nothing may
be left running or holding a page, memory and file descriptors must be flat after the warm-up, and a fixed probe
must be as fast as on a fresh server started beside it (probed in turns with the soaked one, so both see the same
neighbours; with no fresh server to hand, as fast as at the start).

    python scripts/soak.py --minutes 30 --model path/to/checkpoint   # starts `helios serve` with SERVE_FLAGS
    python scripts/soak.py --minutes 3 --url http://127.0.0.1:8000 --pid 1234   # a server already running

tests/server/test_soak.py runs it for 3 minutes in the default suite and for 30 with `-m soak` (`make soak`).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

MODEL = "soak"            # the served model name the driver sends
PAGE_SIZE = 16            # small pages, so a few prompts fill the pool
KV_PAGES = 64             # the device pool: 1,024 tokens, far less than the workers ask for at once (preemption)
HOST_PAGES = 128          # the host tier, where preempted requests are swapped and evicted prefixes wait
KV_DTYPE = "float16"      # the pages' type, named so that the pool holds KV_PAGES on every CPU (auto's differs)
KV_DTYPE_BYTES = 2
MAX_BATCH_SIZE = 8


def serve_flags(kv_values_per_token: int) -> list[str]:
    """The flags of the soak's server: a pool of KV_PAGES pages of KV_DTYPE with a host tier of HOST_PAGES, for a
    model with `kv_values_per_token` KV values a token (layers x 2 x KV heads x head size)."""
    page_bytes = PAGE_SIZE * kv_values_per_token * KV_DTYPE_BYTES
    return ["--served-model-name", MODEL, "--page-size", str(PAGE_SIZE), "--kv-cache-dtype", KV_DTYPE,
            "--kv-cache-bytes", str(KV_PAGES * page_bytes),
            "--kv-offload-bytes", str(HOST_PAGES * page_bytes), "--max-batch-size", str(MAX_BATCH_SIZE),
            "--prefill-chunk-size", "128", "--responses-store-size", "64"]  # a store that fills during the warm-up


# ---------------------------------------------------------------------------------------------------------------
# What the client saw

@dataclass
class Tally:
    "Every answer as the client saw it; workers add to it under its lock."
    statuses: Counter = field(default_factory=Counter)        # (kind, HTTP status) -> requests
    finished_requests: int = 0      # generation requests answered in full (each is one engine request here)
    finished_choices: int = 0       # their choices (n of each)
    prompt_tokens: int = 0          # usage the client was told, summed over finished requests
    completion_tokens: int = 0
    cancelled: int = 0              # streams closed early and requests whose client hung up
    problems: list = field(default_factory=list)             # anything the client saw that is wrong
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def status(self, kind: str, code: int):
        with self.lock: self.statuses[(kind, code)] += 1

    def finished(self, choices: int, prompt_tokens: int, completion_tokens: int):
        with self.lock:
            self.finished_requests += 1; self.finished_choices += choices
            self.prompt_tokens += prompt_tokens; self.completion_tokens += completion_tokens

    def cancel(self):
        with self.lock: self.cancelled += 1

    def problem(self, kind: str, what: str):
        with self.lock:
            if len(self.problems) < 50: self.problems.append(f"{kind}: {what}")

    def by_kind(self) -> dict[str, int]:
        out = Counter()
        for (kind, _), k in self.statuses.items(): out[kind] += k
        return dict(sorted(out.items()))

    def errors(self) -> dict[int, int]:
        "Answers with an error status, by status (what /metrics' helios:request_errors_total counts)."
        out = Counter()
        for (_, code), k in self.statuses.items():
            if code >= 400: out[code] += k
        return dict(sorted(out.items()))

    def num_5xx(self) -> int: return sum(k for (_, code), k in self.statuses.items() if code >= 500)


def sse_lines(response: httpx.Response):
    """The data payloads of a server-sent event stream, parsed (the [DONE] marker as the string itself).

    Lines end at LF (or CRLF) only, as the SSE spec says: httpx's iter_lines also splits at U+2028, U+0085 and the
    like, which a model's text may hold (raw, in JSON written with ensure_ascii=False)."""
    buffer = b""
    for chunk in response.iter_bytes():
        *lines, buffer = (buffer + chunk).split(b"\n")
        for line in lines:
            if not line.startswith(b"data: "): continue
            data = line[len(b"data: "):].rstrip(b"\r").decode()
            yield data if data == "[DONE]" else json.loads(data)


# ---------------------------------------------------------------------------------------------------------------
# The requests of the mix: each sends one request (or a few) and tallies what it saw

SYSTEM_PROMPTS = [  # shared by many requests: their pages are prefix-cache hits
    "You are a terse assistant for a weather service. Answer in one short sentence, without greetings. " * 2,
    "You are a careful librarian. Recommend exactly one book and say why in a few words, nothing else. " * 2,
]
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"], "properties": {
        "city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
PERSON = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": {
    "type": "object", "additionalProperties": False, "required": ["name", "age"],
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}}}}
PROBE = {"model": MODEL, "prompt": "The soak's probe: " + " ".join(WORDS), "max_tokens": 32, "temperature": 0,
         "ignore_eos": True}
CANCEL_TOKENS = KV_PAGES * PAGE_SIZE - 224   # 800: a stream closed after a few chunks, or a request whose client
HANG_UP_AFTER_S = 0.3     # leaves, asks for this many, far more than arrive before the client goes (the idle server
                          # makes ~1.2 tokens a ms: 300 could all arrive in time, and the server finished one the
                          # client had left), so the server always sees the cancel; the pool's longest request, less
                          # room for the longest prompt that asks it (~130 tokens)


def words(rng: random.Random, k: int) -> str: return " ".join(rng.choice(WORDS) for _ in range(k))


def user_text(rng: random.Random) -> str:
    return f"Request {rng.randrange(10**6)}: tell me about {words(rng, rng.randint(3, 12))}."


def chat_messages(rng: random.Random) -> list[dict]:
    messages = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}] if rng.random() < 0.7 else []
    return messages + [{"role": "user", "content": user_text(rng)}]


class Driver:
    "Sends the mix to one server and tallies what came back."
    def __init__(self, url: str, headers: dict, tally: Tally):
        self.url, self.headers, self.tally = url, headers, tally
        self.stored: list[str] = []    # ids of stored responses, for retrieval and previous_response_id

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=httpx.Timeout(120.0))

    def post(self, c: httpx.Client, kind: str, path: str, body: dict) -> httpx.Response:
        r = c.post(path, json=body)
        self.tally.status(kind, r.status_code)
        if r.status_code != 200: self.tally.problem(kind, f"{r.status_code} {r.text[:300]}")
        return r

    def openai_usage(self, kind: str, usage: dict | None, choices: int):
        if usage is None: return self.tally.problem(kind, "no usage")
        self.tally.finished(choices, usage["prompt_tokens"], usage["completion_tokens"])

    # -- chapter 13: completions and chat, whole and streamed -------------------------------------------------
    def completion(self, c, rng):
        n = rng.choice((1, 1, 2, 3))
        prompt = (rng.choice(SYSTEM_PROMPTS) if rng.random() < 0.5 else "") + user_text(rng)
        body = {"model": MODEL, "prompt": prompt, "max_tokens": rng.randint(4, 48), "n": n, "temperature": 0.8,
                "seed": rng.randrange(1000)}
        if rng.random() < 0.5: return self.stream_openai(c, "completion_stream", "/v1/completions", body, n)
        r = self.post(c, "completion", "/v1/completions", body)
        if r.status_code == 200: self.openai_usage("completion", r.json()["usage"], len(r.json()["choices"]))

    def chat(self, c, rng, kind="chat", **extra):
        n = extra.pop("n", rng.choice((1, 1, 2)))
        body = {"model": MODEL, "messages": chat_messages(rng), "max_tokens": rng.randint(4, 64), "n": n,
                "temperature": 0.8, "seed": rng.randrange(1000), **extra}
        if rng.random() < 0.5: return self.stream_openai(c, kind + "_stream", "/v1/chat/completions", body, n)
        r = self.post(c, kind, "/v1/chat/completions", body)
        if r.status_code != 200: return
        out = r.json()
        self.openai_usage(kind, out["usage"], len(out["choices"]))
        for choice in out["choices"]:
            if choice["finish_reason"] != "length": self.check_choice(kind, choice["message"], extra)

    def check_choice(self, kind: str, message: dict, extra: dict):
        "A grammar's whole answer parses as its schema says; a required tool call is there."
        if "response_format" in extra:
            try: value = json.loads(message["content"])
            except (TypeError, json.JSONDecodeError): return self.tally.problem(kind, f"not JSON: {message['content']!r}")
            if set(value) != {"name", "age"}: self.tally.problem(kind, f"not a person: {value}")
        if extra.get("tool_choice") == "required" and not message.get("tool_calls"):
            self.tally.problem(kind, f"no tool call: {message}")

    def stream_openai(self, c, kind: str, path: str, body: dict, n: int):
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with c.stream("POST", path, json=body) as r:
            self.tally.status(kind, r.status_code)
            if r.status_code != 200: return self.tally.problem(kind, f"{r.status_code} {r.read()[:300]!r}")
            usage, finishes, done = None, 0, False
            for event in sse_lines(r):
                if event == "[DONE]": done = True; continue
                if "error" in event: return self.tally.problem(kind, f"error event {event}")
                if event.get("usage"): usage = event["usage"]
                finishes += sum(ch.get("finish_reason") is not None for ch in event.get("choices", ()))
        if not done or finishes != n: return self.tally.problem(kind, f"done={done} finishes={finishes} of {n}")
        self.openai_usage(kind, usage, n)

    def grammar(self, c, rng): self.chat(c, rng, "json_schema", response_format=PERSON, max_tokens=100)

    def tools(self, c, rng):
        self.chat(c, rng, "tools", tools=[WEATHER], tool_choice="required", max_tokens=150)

    def long_prompt(self, c, rng):
        "A prompt of ~200-350 tokens with a long answer: with others it overflows the pool, so requests are preempted."
        body = {"model": MODEL, "prompt": words(rng, rng.randint(120, 200)), "max_tokens": rng.randint(40, 100),
                "temperature": 0.8, "ignore_eos": True}
        r = self.post(c, "long_prompt", "/v1/completions", body)
        if r.status_code == 200: self.openai_usage("long_prompt", r.json()["usage"], 1)

    # -- the client goes away --------------------------------------------------------------------------------
    def cancel_stream(self, c, rng):
        "A stream closed after a few chunks: the server cancels its request."
        body = {"model": MODEL, "messages": chat_messages(rng), "max_tokens": CANCEL_TOKENS, "ignore_eos": True,
                "stream": True, "temperature": 0.8}
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            self.tally.status("cancel_stream", r.status_code)
            if r.status_code != 200: return self.tally.problem("cancel_stream", f"{r.status_code}")
            for i, _ in enumerate(sse_lines(r)):
                if i == 3: break
        self.tally.cancel()  # leaving the block closed the connection mid-stream

    def hang_up(self, c, rng):
        "A whole-answer request whose client stops waiting and closes its connection (the server answers no one: 499)."
        body = {"model": MODEL, "prompt": user_text(rng), "max_tokens": CANCEL_TOKENS, "ignore_eos": True}
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=HANG_UP_AFTER_S) as quick:
            try:
                r = quick.post("/v1/completions", json=body)
                self.tally.status("hang_up", r.status_code)
                return self.tally.problem("hang_up", f"answered in {HANG_UP_AFTER_S} s: {r.status_code}")
            except httpx.TimeoutException:
                self.tally.status("hang_up", 0)   # 0: no answer, by design
        self.tally.cancel()

    # -- chapter 13a: the Responses API ----------------------------------------------------------------------
    def responses(self, c, rng):
        body = {"model": MODEL, "input": user_text(rng), "max_output_tokens": rng.randint(4, 48), "temperature": 0.8,
                "store": rng.random() < 0.5}
        if rng.random() < 0.5: body["instructions"] = rng.choice(SYSTEM_PROMPTS)
        if self.stored and rng.random() < 0.3:   # a first turn, continued (the store may have dropped it: 404)
            body["previous_response_id"] = rng.choice(self.stored[-8:])
        if rng.random() < 0.3: body["text"] = {"format": {"type": "json_schema", **PERSON["json_schema"]}}
        if rng.random() < 0.5: return self.stream_responses(c, body)
        r = c.post("/v1/responses", json=body)
        self.tally.status("responses", r.status_code)
        if r.status_code == 200: self.responses_done("responses", body, r.json())
        elif not (r.status_code == 404 and "previous_response_id" in body):
            self.tally.problem("responses", f"{r.status_code} {r.text[:300]}")

    def responses_done(self, kind: str, body: dict, out: dict):
        if out["status"] not in ("completed", "incomplete"): return self.tally.problem(kind, f"status {out['status']}")
        usage = out["usage"]
        self.tally.finished(1, usage["input_tokens"], usage["output_tokens"])
        if body["store"] and "previous_response_id" not in body: self.stored.append(out["id"])  # conversations stay short

    def stream_responses(self, c, body: dict):
        with c.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
            self.tally.status("responses_stream", r.status_code)
            if r.status_code == 404 and "previous_response_id" in body: return
            if r.status_code != 200: return self.tally.problem("responses_stream", f"{r.status_code}")
            final = None
            for event in sse_lines(r):
                if event["type"] in ("response.completed", "response.incomplete"): final = event["response"]
                if event["type"] in ("response.failed", "error"): return self.tally.problem("responses_stream", str(event))
        if final is None: return self.tally.problem("responses_stream", "no final event")
        self.responses_done("responses_stream", body, final)

    def stored_response(self, c, rng):
        "GET a stored response (it may have left the store: 404), or DELETE one."
        if not self.stored: return self.responses(c, rng)
        delete = rng.random() < 0.3
        try:
            rid = self.stored.pop(rng.randrange(len(self.stored))) if delete else rng.choice(self.stored)
        except (IndexError, ValueError):   # another worker took the last one
            return
        method = "DELETE" if delete else "GET"
        r = c.request(method, f"/v1/responses/{rid}")
        self.tally.status(f"responses_{method.lower()}", r.status_code)
        if r.status_code not in (200, 404): self.tally.problem("responses_get", f"{r.status_code} {r.text[:200]}")

    # -- chapter 13b: the Messages API -----------------------------------------------------------------------
    def messages(self, c, rng):
        body = {"model": MODEL, "max_tokens": rng.randint(4, 48), "temperature": 0.8,
                "messages": [{"role": "user", "content": user_text(rng)}], "thinking": {"type": "disabled"}}
        if rng.random() < 0.6: body["system"] = rng.choice(SYSTEM_PROMPTS)
        if rng.random() < 0.3:
            body.update(tools=[{"name": "get_weather", "description": "The weather",
                                "input_schema": WEATHER["function"]["parameters"]}], tool_choice={"type": "any"},
                        max_tokens=120)
        if rng.random() < 0.2:
            r = self.post(c, "count_tokens", "/v1/messages/count_tokens",
                          {k: v for k, v in body.items() if k not in ("max_tokens", "temperature")})
            return
        if rng.random() < 0.5: return self.stream_messages(c, body)
        r = self.post(c, "messages", "/v1/messages", body)
        if r.status_code == 200: self.messages_done("messages", r.json()["usage"])

    def messages_done(self, kind: str, usage: dict):
        self.tally.finished(1, usage["input_tokens"] + usage["cache_read_input_tokens"], usage["output_tokens"])

    def stream_messages(self, c, body: dict):
        with c.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
            self.tally.status("messages_stream", r.status_code)
            if r.status_code != 200: return self.tally.problem("messages_stream", f"{r.status_code}")
            usage, stopped = None, False
            for event in sse_lines(r):
                if event["type"] == "error": return self.tally.problem("messages_stream", str(event))
                if event["type"] == "message_delta": usage = event["usage"]
                stopped |= event["type"] == "message_stop"
        if usage is None or not stopped: return self.tally.problem("messages_stream", "no message_delta or message_stop")
        self.messages_done("messages_stream", usage)

    # -- the rest of the surface -----------------------------------------------------------------------------
    def inspect(self, c, rng):
        "The endpoints that generate nothing: tokenize, detokenize, models, the cache report, health, metrics."
        kind, method, path, body = rng.choice([
            ("tokenize", "POST", "/tokenize", {"model": MODEL, "prompt": user_text(rng)}),
            ("tokenize_chat", "POST", "/tokenize", {"model": MODEL, "messages": chat_messages(rng)}),
            ("detokenize", "POST", "/detokenize", {"model": MODEL, "tokens": [rng.randrange(1000) for _ in range(8)]}),
            ("models", "GET", "/v1/models", None), ("cache", "GET", "/v1/cache", None),
            ("health", "GET", "/health", None), ("metrics", "GET", "/metrics", None)])
        r = c.request(method, path, json=body)
        self.tally.status(kind, r.status_code)
        if r.status_code != 200: self.tally.problem(kind, f"{r.status_code} {r.text[:200]}")

    def bad(self, c, rng):
        "A request the server must refuse, with the status it must refuse it with."
        name, expected, method, path, content, headers = rng.choice(
            [b for b in BAD_INPUTS if self.headers or b[0] != "no_key"])   # a server without a key takes any
        r = c.request(method, path, content=content() if callable(content) else content,
                      headers={"content-type": "application/json", **headers})
        self.tally.status(f"bad:{name}", r.status_code)
        if r.status_code != expected:
            self.tally.problem(f"bad:{name}", f"expected {expected}, got {r.status_code} {r.text[:200]}")


def _json(body: dict) -> bytes: return json.dumps(body).encode()


_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
BAD_INPUTS = [  # (name, status, method, path, body, extra headers)
    ("unknown_field", 400, "POST", "/v1/chat/completions", _json({**_CHAT, "temprature": 0.5}), {}),
    ("bad_schema", 400, "POST", "/v1/chat/completions", _json({**_CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}}), {}),
    ("not_json", 400, "POST", "/v1/completions", b'{"model": "soak", "prompt": ', {}),
    ("oversized", 413, "POST", "/v1/completions", lambda: _json({"model": MODEL, "prompt": "x" * (1 << 20) + "y"}), {}),
    ("too_many_n", 400, "POST", "/v1/completions", _json({"model": MODEL, "prompt": "hi", "n": 17}), {}),
    ("too_long", 400, "POST", "/v1/completions", _json({"model": MODEL, "prompt": "hi", "max_tokens": 10**6}), {}),
    ("wrong_model", 404, "POST", "/v1/chat/completions", _json({**_CHAT, "model": "gpt-9"}), {}),
    ("unknown_tool", 400, "POST", "/v1/chat/completions", _json({**_CHAT, "tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "nope"}}}), {}),
    ("no_such_path", 404, "POST", "/v1/nothing", b"{}", {}),
    ("wrong_method", 405, "GET", "/v1/completions", None, {}),
    ("no_key", 401, "POST", "/v1/completions", _json({"model": MODEL, "prompt": "hi"}), {"authorization": "Bearer wrong"}),
    ("responses_unknown_field", 400, "POST", "/v1/responses", _json({"model": MODEL, "input": "hi", "colour": 1}), {}),
    ("responses_missing", 404, "GET", "/v1/responses/resp_doesnotexist", None, {}),
    ("messages_no_max_tokens", 400, "POST", "/v1/messages", _json({"model": MODEL, "messages": [
        {"role": "user", "content": "hi"}]}), {}),
]

# the mix: (request, weight); weights are relative and the draw is seeded per worker
MIX = [("completion", 14), ("chat", 14), ("grammar", 6), ("tools", 6), ("long_prompt", 6), ("cancel_stream", 5),
       ("hang_up", 3), ("responses", 8), ("stored_response", 3), ("messages", 8), ("inspect", 6), ("bad", 8)]


def worker(driver: Driver, seed: int, until: float, pause_s: float):
    "Send requests from the mix until `until` (time.monotonic()), one at a time, `pause_s` apart at least."
    rng = random.Random(seed)
    names, weights = zip(*MIX)
    with driver.client() as c:
        while time.monotonic() < until:
            name = rng.choices(names, weights)[0]
            try:
                getattr(driver, name)(c, rng)
            except Exception as e:   # a connection dropped or reset, an answer not in its shape: the server's failure
                driver.tally.status(name, -1)
                driver.tally.problem(name, f"{type(e).__name__}: {e}")
            time.sleep(pause_s)


def traffic(driver: Driver, workers: int, duration_s: float, seed: int, pause_s: float,
            on_tick=lambda: None, tick_s: float = 15.0):
    "Run `workers` workers for `duration_s`, calling on_tick every tick_s meanwhile (the memory samples)."
    until = time.monotonic() + duration_s
    threads = [threading.Thread(target=worker, args=(driver, seed * 1000 + i, until, pause_s), daemon=True)
               for i in range(workers)]
    for t in threads: t.start()
    last_tick = time.monotonic()
    while any(t.is_alive() for t in threads):
        time.sleep(0.2)
        if time.monotonic() - last_tick >= tick_s: on_tick(); last_tick = time.monotonic()


# ---------------------------------------------------------------------------------------------------------------
# What the server says about itself

def rss_mib(pid: int) -> float:
    "The process' resident memory (VmRSS), MiB."
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"): return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS in /proc/{pid}/status")


def num_fds(pid: int) -> int: return len(os.listdir(f"/proc/{pid}/fd"))


def scrape(url: str, headers: dict) -> dict[str, float]:
    "Every sample of /metrics, keyed by its name and labels (model_name dropped), summed where keys repeat."
    out: dict[str, float] = Counter()
    for line in httpx.get(url + "/metrics", headers=headers, timeout=30).text.splitlines():
        if not line or line.startswith("#"): continue
        key, value = line.rsplit(" ", 1)
        if "{" in key:
            name, labels = key[:-1].split("{", 1)
            kept = ",".join(p for p in labels.split(",") if not p.startswith("model_name="))
            key = f"{name}{{{kept}}}" if kept else name
        out[key] += float(value)
    return out


def delta(before: dict, after: dict, key: str) -> float: return after.get(key, 0.0) - before.get(key, 0.0)


def wait_idle(url: str, headers: dict, timeout_s: float = 60.0) -> dict:
    "/health once nothing runs, waits or holds a page (host tier included); raise if that does not come."
    deadline, health = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        health = httpx.get(url + "/health", timeout=10).json()
        pages = health["kv_pages"]
        if health["running"] == health["waiting"] == pages["device"]["used"] == pages["host"]["used"] == 0: return health
        time.sleep(0.1)
    raise AssertionError(f"the server is not idle {timeout_s} s after the traffic stopped: {health}")


def probe_best_s(url: str, headers: dict, tally: Tally, k: int = 10, warm: int = 2) -> float:
    """The fastest of k identical probe requests to an idle server, after `warm` unmeasured ones: a neighbour's load
    only ever adds time, so the fastest is the server's own cost (a real slow-down slows every one of them)."""
    return probe_turns_s([url], headers, [tally], k, warm)[0]


def probe_turns_s(urls: list, headers: dict, tallies: list, k: int = 10, warm: int = 2) -> list:
    """probe_best_s of each server in `urls`, their requests in turns (one to each, then again): a neighbour's load
    falls on all of them alike. Each server's answers go to its own tally."""
    times = [[] for _ in urls]
    clients = [httpx.Client(base_url=url, headers=headers, timeout=60) for url in urls]
    try:
        for i in range(warm + k):
            turn = list(zip(clients, tallies, times))
            for c, tally, found in (turn if i % 2 == 0 else turn[::-1]):  # each goes first every other time
                start = time.perf_counter()
                r = c.post("/v1/completions", json=PROBE)
                elapsed = time.perf_counter() - start
                tally.status("probe", r.status_code)
                if r.status_code != 200: raise AssertionError(f"the probe failed: {r.status_code} {r.text[:300]}")
                tally.finished(1, r.json()["usage"]["prompt_tokens"], r.json()["usage"]["completion_tokens"])
                if i >= warm: found.append(elapsed)
    finally:
        for c in clients: c.close()
    return [min(found) for found in times]


def probe_rounds_s(url: str, headers: dict, tally: Tally, rounds: int, within_s: float = 0.0, pause_s: float = 2.0) -> list:
    "Up to `rounds` probe_best_s, `pause_s` apart; stop early once one is at most `within_s`."
    found = []
    for i in range(rounds):
        if i: time.sleep(pause_s)
        found.append(probe_best_s(url, headers, tally))
        if found[-1] <= within_s: break
    return found


def probe_beside_s(url: str, fresh_url: str, headers: dict, tally: Tally, rounds: int, drift: float,
                   pause_s: float = 2.0) -> tuple[list, list]:
    """Up to `rounds` rounds, `pause_s` apart, of probe_turns_s on the soaked server and a fresh one: their bests,
    round by round. Turns put the same neighbours on both; stop early once the soaked server's best is within
    `drift` of the fresh one's."""
    soaked, fresh = [], []
    for i in range(rounds):
        if i: time.sleep(pause_s)
        ends = probe_turns_s([url, fresh_url], headers, [tally, Tally()])   # the fresh server's answers: not tallied
        soaked.append(ends[0]); fresh.append(ends[1])
        if min(soaked) <= min(fresh) * (1 + drift): break
    return soaked, fresh


# ---------------------------------------------------------------------------------------------------------------
# The soak

RSS_DRIFT_MIB = 32        # resident memory may end this far above its post-warm-up value (allocator arenas, caches)
FD_DRIFT = 4              # open file descriptors may end this many above theirs
LATENCY_DRIFT = 0.20      # the probe's best time at the end within 20% of a fresh server's (or of its own at the start)
PROBE_ROUNDS = 4          # rounds of probes at the start (all) and the end (until one is within the bound), 2 s apart:
                          # a busy neighbour comes and goes, a real slow-down stays


@dataclass
class SoakReport:
    duration_s: float
    workers: int
    requests: dict             # by kind
    statuses: dict             # "kind status" -> count
    num_5xx: int
    problems: list
    rss_mib: dict              # start (after warm-up), end, max during the run
    samples: list              # [seconds after the warm-up, RSS MiB, open fds, requests so far] every 15 s
    fds: dict
    probe_s: dict              # start, end, fresh (each the best of its rounds of 10 probes), every end and fresh round
    idle: dict                 # /health at the end
    metrics: dict              # the counters compared: server delta vs client tally
    exercised: dict            # preemptions, swaps, prefix hits, constrained rows, cancels: proof the mix reached them
    failures: list             # every check that failed, in words (empty: the soak passed)
    machine: dict


def machine() -> dict:
    "The CPU's model name and the load average, to put next to the figures."
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    return {"cpu": name, "cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}


def counter_checks(before: dict, after: dict, tally: Tally) -> tuple[dict, list[str]]:
    "Each /metrics counter's growth over the run against what the client tallied; failures in words."
    pairs = {
        "helios:request_success_total (choices)": (sum(delta(before, after, k) for k in after
                                                      if k.startswith("helios:request_success_total")), tally.finished_choices),
        "helios:generation_tokens_total": (delta(before, after, "helios:generation_tokens_total"), tally.completion_tokens),
        "helios:prompt_tokens_total": (delta(before, after, "helios:prompt_tokens_total"), tally.prompt_tokens),
        "helios:e2e_request_latency_seconds_count": (delta(before, after, "helios:e2e_request_latency_seconds_count"),
                                                     tally.finished_requests),
        "helios:request_cancelled_total": (delta(before, after, "helios:request_cancelled_total"), tally.cancelled),
    }
    for status, k in tally.errors().items():
        pairs[f"helios:request_errors_total{{status={status}}}"] = (
            delta(before, after, f'helios:request_errors_total{{status="{status}"}}'), k)
    counted = {k for k in after if k.startswith("helios:request_errors_total{")}
    for key in counted:
        status = int(key.split('"')[1])
        if status not in tally.errors(): pairs[f"helios:request_errors_total{{status={status}}}"] = (delta(before, after, key), 0)
    table = {name: {"server": server, "client": client} for name, (server, client) in pairs.items()}
    failures = [f"{name}: the server counted {v['server']:g}, the client saw {v['client']:g}"
                for name, v in table.items() if v["server"] != v["client"]]
    return table, failures


def soak(url: str, pid: int, headers: dict, duration_s: float, workers: int = 4, seed: int = 0,
         warm_up_s: float | None = None, pause_s: float = 0.02, log=print,
         fresh: Callable[[], AbstractContextManager[str]] | None = None) -> SoakReport:
    """Drive the server at `url` (process `pid`) for `duration_s` (warm-up included) and check it; the report's
    `failures` lists what did not hold. `fresh` starts a server like this one and yields its URL: the probe at the end
    is held to it, in turns; without it, to the soaked server's own probe at the start."""
    warm_up_s = warm_up_s if warm_up_s is not None else min(120.0, max(30.0, 0.15 * duration_s))
    tally, failures = Tally(), []
    driver = Driver(url, headers, tally)
    before = scrape(url, headers)
    log(f"warm-up: {warm_up_s:.0f} s of traffic, {workers} workers")
    traffic(driver, workers, warm_up_s, seed, pause_s)
    wait_idle(url, headers)
    rss_start, fds_start = rss_mib(pid), num_fds(pid)
    probe_start = min(probe_rounds_s(url, headers, tally, PROBE_ROUNDS))
    log(f"after warm-up: RSS {rss_start:.1f} MiB, {fds_start} fds, probe {probe_start * 1000:.1f} ms (best of {PROBE_ROUNDS} x 10)")
    samples, main_start = [], time.monotonic()

    def sample():
        samples.append((round(time.monotonic() - main_start), round(rss_mib(pid), 1), num_fds(pid),
                        sum(tally.by_kind().values())))
        log(f"  {samples[-1][0]:5d} s: RSS {samples[-1][1]:.1f} MiB, {samples[-1][2]} fds, {samples[-1][3]} requests")
    traffic(driver, workers, duration_s - warm_up_s, seed + 1, pause_s, on_tick=sample)
    idle = wait_idle(url, headers)
    time.sleep(1.0)   # the last connections' sockets close
    rss_end, fds_end = rss_mib(pid), num_fds(pid)
    if fresh is None:
        probe_end, probe_fresh = probe_rounds_s(url, headers, tally, PROBE_ROUNDS, within_s=probe_start * (1 + LATENCY_DRIFT)), []
    else:
        try:
            with fresh() as fresh_url:
                probe_end, probe_fresh = probe_beside_s(url, fresh_url, headers, tally, PROBE_ROUNDS, LATENCY_DRIFT)
        except (RuntimeError, OSError, TimeoutError) as e:   # the soaked server is still measured, against its start
            failures.append(f"the fresh server for the probe at the end did not start: {e}")
            probe_end, probe_fresh = probe_rounds_s(url, headers, tally, PROBE_ROUNDS), []
    probe_bound, against = ((min(probe_fresh), "a fresh server's") if probe_fresh else (probe_start, "at the start"))
    log(f"at the end: probe {min(probe_end) * 1000:.1f} ms vs {probe_bound * 1000:.1f} ms {against}")
    wait_idle(url, headers)
    after = scrape(url, headers)

    if tally.num_5xx(): failures.append(f"{tally.num_5xx()} answers with a 5xx status")
    if tally.problems: failures.append(f"{len(tally.problems)}+ wrong answers, first: {tally.problems[0]}")
    if rss_end > rss_start + RSS_DRIFT_MIB:
        failures.append(f"RSS grew from {rss_start:.1f} to {rss_end:.1f} MiB (allowed +{RSS_DRIFT_MIB})")
    if fds_end > fds_start + FD_DRIFT: failures.append(f"open fds went from {fds_start} to {fds_end} (allowed +{FD_DRIFT})")
    if min(probe_end) > probe_bound * (1 + LATENCY_DRIFT):
        failures.append(f"probe {min(probe_end) * 1000:.1f} ms at the end vs {probe_bound * 1000:.1f} ms {against} "
                        f"(the fastest of 10, best of {len(probe_end)} rounds; allowed +{LATENCY_DRIFT:.0%})")
    for gauge in ("helios:kv_pages_used", "helios:num_requests_running", "helios:num_requests_waiting",
                  'helios:kv_tier_pages{state="used",tier="host"}', 'helios:kv_tier_pages{state="used",tier="device"}'):
        if after.get(gauge, 0) != 0: failures.append(f"{gauge} is {after[gauge]:g} when idle")
    table, counter_failures = counter_checks(before, after, tally)
    failures += counter_failures
    exercised = {name: delta(before, after, key) for name, key in (
        ("preemptions", "helios:num_preemptions_total"), ("swapped", "helios:num_preemptions_swapped_total"),
        ("prefix_hit_tokens", "helios:prefix_cache_hits_total"), ("host_hit_tokens", "helios:prefix_cache_host_hits_total"),
        ("constrained_rows", "helios:constrained_rows_total"), ("cancelled", "helios:request_cancelled_total"))}
    for name in ("preemptions", "swapped", "prefix_hit_tokens", "constrained_rows", "cancelled"):
        if exercised[name] <= 0: failures.append(f"the mix never reached {name}: the soak is not what it claims")
    return SoakReport(
        duration_s=duration_s, workers=workers, requests=tally.by_kind(),
        statuses={f"{kind} {code}": k for (kind, code), k in sorted(tally.statuses.items())}, num_5xx=tally.num_5xx(),
        problems=tally.problems, rss_mib={"start": round(rss_start, 1), "end": round(rss_end, 1),
                                          "max": round(max([s[1] for s in samples] + [rss_end]), 1)},
        samples=samples, fds={"start": fds_start, "end": fds_end, "max": max([s[2] for s in samples] + [fds_end])},
        probe_s={"start": round(probe_start, 4), "end": round(min(probe_end), 4), "end_rounds": [round(p, 4) for p in probe_end],
                 "fresh": round(min(probe_fresh), 4) if probe_fresh else None,
                 "fresh_rounds": [round(p, 4) for p in probe_fresh]},
        idle=idle, metrics=table, exercised=exercised, failures=failures, machine=machine())


# ---------------------------------------------------------------------------------------------------------------
# By hand

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, kv_values_per_token: int, threads: int) -> tuple[subprocess.Popen, str]:
    "`helios serve` with the soak's flags on a free port; returns the process and its URL once /health answers."
    port = free_port()
    proc = subprocess.Popen(["helios", "serve", "--model", model, "--port", str(port), "--threads", str(threads),
                             "--log-level", "warning", *serve_flags(kv_values_per_token)])
    url = f"http://127.0.0.1:{port}"
    for _ in range(900):
        if proc.poll() is not None: raise RuntimeError(f"helios serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200: return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("helios serve did not start in 180 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill(); proc.wait()


@contextmanager
def fresh_server(model: str, kv_values_per_token: int, threads: int):
    "A second `helios serve` like the soaked one, new, for the probe at the end; yields its URL and stops it."
    proc, url = start_server(model, kv_values_per_token, threads)
    try:
        yield url
    finally:
        stop_server(proc)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--url", help="a running server (with --pid); else one is started with --model")
    p.add_argument("--pid", type=int, help="the running server's process id, for its memory and file descriptors")
    p.add_argument("--api-key")
    p.add_argument("--model", help="the checkpoint to serve (a tools-and-thinking template exercises the tool calls)")
    p.add_argument("--kv-values-per-token", type=int, default=256,
                   help="KV values of one token of --model (layers x 2 x KV heads x head size), to size the pool in "
                        "pages (the tests' tiny Qwen3: 256)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, help="write the report here")
    args = p.parse_args(argv)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    proc, fresh = None, None
    if args.url is None:
        if not args.model: p.error("give --model (a server is started) or --url and --pid")
        try:
            proc, url = start_server(args.model, args.kv_values_per_token, args.threads)
        except RuntimeError as e:
            sys.exit(str(e))
        pid = proc.pid
        fresh = lambda: fresh_server(args.model, args.kv_values_per_token, args.threads)
    else:
        if args.pid is None: p.error("--url needs --pid (the server's memory and file descriptors are read)")
        url, pid = args.url, args.pid
    try:
        report = soak(url, pid, headers, args.minutes * 60, args.workers, args.seed, fresh=fresh)
    finally:
        if proc is not None: stop_server(proc)
    text = json.dumps(report.__dict__, indent=1)
    if args.json: args.json.write_text(text + "\n")
    print(text)
    sys.exit(1 if report.failures else 0)


if __name__ == "__main__":
    main()
