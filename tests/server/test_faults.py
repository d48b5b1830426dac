"""Faults under load: a tensor-parallel worker killed while streams run and cancels arrive; the kernel cache folder
unwritable or full, or holding a library cut short; SIGTERM while a context-long prompt prefills.

What existed before: test_http_parallel.py kills the worker under one stream (error, exit 1, its processes gone);
tests/kernels/test_decode_kernel.py covers, in process, a cache path under a regular file, a garbage (non-ELF)
library rebuilt, and no compiler; test_server.py and test_hostile.py send SIGTERM during decodes. Here: the same
faults with traffic around them, through the `helios` command, checking the whole process tree."""
import json
import os
import resource
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from _server import Server
from kernel_support import skip_or_fail

MODEL_ARGS = ["--dtype", "float32", "--device", "cpu", "--kv-cache-bytes", "2e7"]


def descendants(pid: int) -> list[int]:
    "Every process below pid (children, their children, ...), read from /proc."
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit(): continue
        try: parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError): continue  # it exited while we read
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def running(pid: int) -> bool:
    "pid exists and is not a zombie waiting to be reaped (an exited worker whose new parent has not reaped it yet)."
    try: return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError: return False


def still_running(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline and any(running(p) for p in pids): time.sleep(0.1)
    return [p for p in pids if running(p)]


class Stream(threading.Thread):
    "A streaming completion on its own thread: its SSE lines; `close_after` chunks: the client hangs up there."
    def __init__(self, server: Server, body: dict, close_after: int | None = None):
        super().__init__(daemon=True)
        self.server, self.body, self.close_after = server, body, close_after
        self.started, self.lines, self.error = threading.Event(), [], None

    def run(self):
        try:
            with httpx.stream("POST", self.server.url + "/v1/completions", timeout=60, json={**self.body, "stream": True}) as r:
                for line in r.iter_lines():
                    if not line: continue
                    self.lines.append(line)
                    self.started.set()
                    if self.close_after is not None and len(self.lines) >= self.close_after: return  # hang up
        except httpx.HTTPError as e:
            self.error = e
        finally:
            self.started.set()

    def events(self) -> list[dict]:
        return [json.loads(line[6:]) for line in self.lines if line.startswith("data: {")]


# --- 1. a tensor-parallel worker killed under load ------------------------------------------------------------

def test_a_worker_killed_under_streams_and_cancels_fails_every_request_and_leaves_no_process(tiny_folder):
    server = Server("--model", str(tiny_folder), "--tensor-parallel-size", "2", "--max-batch-size", "8", *MODEL_ARGS,
                    api_key=None)
    tree = descendants(server.proc.pid)
    (worker,) = [p for p in tree if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
    long = {"prompt": "The three laws of thermodynamics are", "max_tokens": 1500, "temperature": 0, "ignore_eos": True}
    streams = [Stream(server, long) for _ in range(3)]
    cancelled = [Stream(server, long, close_after=3) for _ in range(2)]
    plain = {}
    def post(i): plain[i] = httpx.post(server.url + "/v1/completions", json=long, timeout=60)
    posts = [threading.Thread(target=post, args=(i,), daemon=True) for i in range(2)]
    for t in [*streams, *cancelled, *posts]: t.start()
    for s in [*streams, *cancelled]: assert s.started.wait(60) and s.error is None, s.error
    for s in cancelled: s.join(10)
    time.sleep(0.3)  # the cancels reach the engine; the other streams keep running
    assert server.proc.poll() is None and all(s.is_alive() for s in streams)
    os.kill(worker, signal.SIGKILL)
    killed = time.time()
    for t in [*streams, *posts]: t.join(30)
    for s in streams:
        assert s.lines[-1] == "data: [DONE]", s.lines[-3:]
        error = s.events()[-1].get("error", {})
        assert "worker rank 1 exited with code -9" in error.get("message", ""), s.lines[-3:]
    for r in plain.values():  # the engine failed, not the client: a server error that says why
        assert r.status_code in (500, 503) and "worker rank 1 exited" in r.json()["error"]["message"], r.text
    assert server.proc.wait(timeout=30) == 1 and time.time() - killed < 30
    assert "the engine failed: worker rank 1 exited" in server.proc.stdout.read()
    assert still_running(tree) == []  # no orphan: the worker's children and the resource tracker are gone too


# --- 2. the kernel cache unwritable, full, or holding a library cut short ----------------------------------------

@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    "The attention library the tiny model's engine loads (head_dim 32, 4 query and 2 KV heads, float32 pages), built now."
    from helios.kernels.build import KernelUnavailable, build_kernels
    try:
        return build_kernels(32, 2, 2, cache_dir=tmp_path_factory.mktemp("reference"))
    except KernelUnavailable as e:
        skip_or_fail(f"the C kernels do not build here: {e}")


def generate(folder: Path, cache: Path, *args, file_size_limit: int | None = None) -> subprocess.CompletedProcess:
    """`helios generate` with HELIOS_CACHE_DIR=cache; file_size_limit: every file it (or the compiler) writes stops at
    that many bytes (RLIMIT_FSIZE: a full disk, for any user, root included)."""
    env = {k: v for k, v in os.environ.items() if k not in ("HELIOS_REQUIRE_KERNELS", "HELIOS_ATTENTION")}
    env["HELIOS_CACHE_DIR"] = str(cache)
    def limit(): resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
    return subprocess.run(["helios", "generate", "--model", str(folder), *MODEL_ARGS, "--threads", "1", "--raw",
                           "--max-tokens", "4", *args, "The sky is"], env=env, capture_output=True, text=True,
                          timeout=120, preexec_fn=limit if file_size_limit else None)


def plant_cut_short(library: Path, cache: Path) -> Path:
    "A copy of library, cut to a third, where the engine looks for it in cache (a crash left it there)."
    planted = cache / "kernels" / library.name
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_bytes(library.read_bytes()[:library.stat().st_size // 3])
    return planted


def fell_back(run: subprocess.CompletedProcess, reason: str):
    "It answered, with PyTorch's attention, and said on stderr why not the C kernels."
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])  # -7 (SIGBUS) was a library loaded cut short
    assert run.stdout.strip(), run.stderr[-2000:]
    assert "attention: c is unavailable, falling back" in run.stderr and reason in run.stderr, run.stderr[-2000:]


def refused(run: subprocess.CompletedProcess, reason: str):
    "With --attention c it does not start, and stderr says why in one line (exit 1: no signal, no hang, no traceback)."
    assert run.returncode == 1 and not run.stdout.strip(), (run.returncode, run.stderr[-2000:])
    assert "helios: error: no executor implementation runs here" in run.stderr and reason in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]


def test_a_cache_folder_that_cannot_be_made_falls_back_or_refuses_with_the_reason(tiny_folder, library, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # HELIOS_CACHE_DIR/kernels cannot be made, for root too (NotADirectoryError)
    fell_back(generate(tiny_folder, blocker), "set HELIOS_CACHE_DIR to a writable folder")
    refused(generate(tiny_folder, blocker, "--attention", "c"), "set HELIOS_CACHE_DIR to a writable folder")


def test_a_library_cut_short_in_the_cache_is_built_again_not_loaded(tiny_folder, library, tmp_path):
    from helios.kernels.build import check_whole_library
    planted = plant_cut_short(library, tmp_path / "cache")
    run = generate(tiny_folder, tmp_path / "cache")
    assert run.returncode == 0 and "attention: c is unavailable" not in run.stderr, (run.returncode, run.stderr[-2000:])
    assert check_whole_library(planted).stat().st_size == library.stat().st_size  # replaced by a whole one
    assert not list(planted.parent.glob("*.partial"))


def test_a_full_disk_falls_back_never_loading_a_partial_library(tiny_folder, library, tmp_path):
    limit = library.stat().st_size // 2  # the compiler's output stops halfway, as on a full disk
    run = generate(tiny_folder, tmp_path / "empty", file_size_limit=limit)
    fell_back(run, "the C kernels did not compile")
    assert not list((tmp_path / "empty").rglob("*.so")) and not list((tmp_path / "empty").rglob("*.partial"))
    planted = plant_cut_short(library, tmp_path / "full")  # and one cut short by an earlier crash: not rebuilt, not loaded
    fell_back(generate(tiny_folder, tmp_path / "full", file_size_limit=limit), "the C kernels did not compile")
    refused(generate(tiny_folder, tmp_path / "full", "--attention", "c", file_size_limit=limit), "did not compile")
    assert planted.stat().st_size == library.stat().st_size // 3 and not list(planted.parent.glob("*.partial"))


def test_a_read_only_cache_holding_a_library_cut_short_falls_back(tiny_folder, library, tmp_path):
    "chmod 0o500 for a user; root ignores permission bits, so there a read-only tmpfs (if mount is allowed)."
    cache = tmp_path / "cache"
    planted = plant_cut_short(library, cache)
    mounted = os.geteuid() == 0
    if mounted:
        folder = planted.parent
        try:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as e:
            pytest.skip(f"root, and no read-only folder can be made here (mount: {e})")
        try:
            plant_cut_short(library, cache)
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)
        except BaseException:
            subprocess.run(["umount", str(folder)]); raise
    else:
        planted.parent.chmod(0o500)
    try:
        with pytest.raises(OSError):  # really read-only
            (planted.parent / "probe").write_text("x")
        fell_back(generate(tiny_folder, cache), "set HELIOS_CACHE_DIR to a writable folder")
        assert planted.stat().st_size == library.stat().st_size // 3
    finally:
        if mounted: subprocess.run(["umount", str(planted.parent)])
        else: planted.parent.chmod(0o700)


# --- 3. SIGTERM while a context-long prompt prefills -------------------------------------------------------------

LONG_PROMPT_TOKENS = 7900  # SmolLM2 serves 8,192: a prefill of many seconds on a small CPU, in chunks of 512


def test_sigterm_during_a_context_long_prefill_drains_within_grace(smollm2_gguf):
    grace_s = 2.0
    s = Server("--model", str(smollm2_gguf), "--dtype", "float32", "--kv-cache-bytes", "5e8",
               "--shutdown-grace-s", str(grace_s), api_key=None)
    prompt = [1000 + i % 20000 for i in range(LONG_PROMPT_TOKENS)]
    stream = Stream(s, {"prompt": prompt, "max_tokens": 50, "temperature": 0})
    stream.start()
    deadline = time.time() + 60
    while s.metric("helios:kv_pages_used") == 0 and time.time() < deadline: time.sleep(0.05)
    assert s.metric("helios:kv_pages_used") > 0  # its first chunk is in
    s.proc.send_signal(signal.SIGTERM)
    signalled = time.time()
    code = s.proc.wait(timeout=grace_s + 30)
    took = time.time() - signalled
    stream.join(10)
    log = s.proc.stdout.read()
    assert code == 0, log[-2000:]
    assert took < grace_s + 15, f"{took:.1f} s to exit after SIGTERM, with a grace of {grace_s} s"
    assert stream.lines[-1] == "data: [DONE]", stream.lines[-3:]
    assert stream.events()[-1]["choices"][0]["finish_reason"] == "abort", stream.lines[-3:]
    assert not any(c["choices"][0]["text"] for c in stream.events() if c["choices"])  # it never left its prefill
    assert "Traceback" not in log, log[-2000:]


def test_shutdown_between_prefill_chunks_leaves_no_page_held(smollm2_llm_factory):
    "The engine thread sees the shutdown between two chunks of a long prefill, ends it as abort, frees its pages."
    from helios import SamplingParams
    llm = smollm2_llm_factory(prefill_chunk_size=256)
    handle = llm.submit([1000 + i % 20000 for i in range(LONG_PROMPT_TOKENS)], SamplingParams(max_tokens=20))
    deadline = time.time() + 60
    while llm.stats().num_used_pages == 0 and time.time() < deadline: time.sleep(0.02)
    assert llm.stats().num_used_pages > 0
    start = time.time()
    llm.engine.shutdown(grace_s=0.5)
    took = time.time() - start
    output = handle.result(timeout=10)
    assert output.outputs[0].finish_reason == "abort" and output.outputs[0].token_ids == []
    assert took < 0.5 + 10, f"shutdown took {took:.1f} s with a grace of 0.5 s"
    report = llm.engine.inspect_cache()
    assert report.num_used_pages == 0 and report.num_free_pages + report.num_cached_pages == report.num_pages
