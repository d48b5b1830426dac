"""When the engine has waited once without work it calls its runner's `idle`, once (chapter 11), on its own thread, and
the C kernels' `idle` ends that thread's OpenMP workers (appendix 92): kept, they make libgomp count more threads than
cores once a second engine runs in the process, and every team then sleeps at its barriers (scripts/two_engines.py
measures it)."""
import os
import threading
import time

import pytest
import torch

from conftest import TEST_KV_BYTES
from helios import LLM, SamplingParams
from helios.kernels.attention import c_kernels
from kernel_support import builds, needs_kernels
from test_blocked_prefill import attention_config, scattered_tick

CPU = torch.device("cpu")
needs_compiler = needs_kernels(builds(lambda: c_kernels(attention_config(9, 3, 64), torch.float32, CPU)))


def os_threads() -> set[str]:
    "The process's threads, as Linux lists them (OpenMP's workers among them)."
    return set(os.listdir("/proc/self/task"))


@needs_compiler
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_idle_ends_the_calling_threads_openmp_workers(threads):
    torch.set_num_threads(2)
    backend = c_kernels(attention_config(9, 3, 64), torch.float32, CPU)
    q, k_pages, v_pages, batch = scattered_tick(0, 9, 3, 64, 16, list(range(100, 164)), [1] * 64)
    seen = {}

    def run():  # a fresh thread: its team is made by the call below
        seen["before"] = os_threads()
        backend(q, k_pages, v_pages, batch)          # 64 decode rows: a parallel region of 2 threads
        seen["held"] = os_threads()
        backend.idle()
        seen["after"] = os_threads()
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    workers = seen["held"] - seen["before"]
    assert len(workers) >= 1, seen                   # the team's worker beside this thread
    assert not workers & seen["after"], seen         # gone


def test_the_engine_calls_idle_once_after_a_stretch_of_work(tiny_folder):
    with LLM(tiny_folder, dtype="float32", device="cpu", quiet=True, kv_cache_bytes=TEST_KV_BYTES) as llm:
        calls = []
        llm.engine.runner.backend.idle = lambda: calls.append(threading.current_thread().name)

        def served_then_idle(expected: int):
            deadline = time.monotonic() + 5
            while len(calls) < expected and time.monotonic() < deadline: time.sleep(0.01)
            time.sleep(0.3)  # the loop keeps waiting without work meanwhile: no second call
            assert calls == ["helios-engine"] * expected

        llm.generate(["a b c"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
        served_then_idle(1)
        llm.generate(["d e f"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        served_then_idle(2)  # once more after the next stretch of work
