"""An LLM that the script never closes stops its engine thread at interpreter exit, before PyTorch's teardown."""
import subprocess
import sys

SCRIPT = """
import atexit, sys
from helios import LLM, SamplingParams
atexit.register(lambda: print("engine thread alive at exit:", llm.engine._thread is not None))  # LIFO: runs after LLM's hook
llm = LLM(sys.argv[1], quiet=True, kv_cache_bytes=2**24)
closed = LLM(sys.argv[1], quiet=True, kv_cache_bytes=2**24)
closed.close()
print(llm.generate("Hello", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0].finish_reason)
"""


def test_unclosed_llm_stops_its_engine_at_exit(tiny_folder):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_folder)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2:] == ["engine thread alive at exit: False", ""], result.stdout


def test_a_dropped_llm_stops_its_thread_and_frees_its_engine(tiny_folder):
    import gc
    import weakref
    from helios import LLM
    llm = LLM(tiny_folder, quiet=True, kv_cache_bytes=2**24)
    thread, engine = llm.engine._thread, weakref.ref(llm.engine)
    assert thread.is_alive()
    del llm
    gc.collect()
    thread.join(timeout=30)
    assert not thread.is_alive() and engine() is None  # nothing else kept the model and KV pool alive


def test_with_block_closes_the_llm(tiny_folder):
    from helios import LLM, SamplingParams
    with LLM(tiny_folder, quiet=True, kv_cache_bytes=2**24) as llm:
        thread = llm.engine._thread
        assert llm.generate("Hi", SamplingParams(max_tokens=2), use_tqdm=False)[0].finish_reason
    assert not thread.is_alive() and llm.engine._thread is None
    llm.close()  # closing again is harmless
