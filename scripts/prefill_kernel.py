"""One layer's whole causal attention over 8,192 tokens (SmolLM2's 9 query heads, 3 KV heads of 64): the bfloat16
prefill kernel (appendix 92's `prefill_bf16_kernel`) against PyTorch's float32 SDPA, best of 3, with the load.

    flock /tmp/helios-cpu.lock python scripts/prefill_kernel.py
"""
import os
import time

import torch
import torch.nn.functional as F

from helios.kernels.attention import prefill_bf16_kernel

TOKENS, HEADS, KV_HEADS, HEAD_DIM = 8192, 9, 3, 64


def best_of(fn, rounds: int = 3) -> float:
    "The fastest of `rounds` calls, in seconds."
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    torch.set_num_threads(2)
    print(f"load before {os.getloadavg()[0]:.2f}")
    kernel = prefill_bf16_kernel()
    q = torch.randn(TOKENS, HEADS, HEAD_DIM)
    k, v = torch.randn(TOKENS, KV_HEADS, HEAD_DIM), torch.randn(TOKENS, KV_HEADS, HEAD_DIM)
    out = torch.empty_like(q)
    group = HEADS // KV_HEADS
    qs, ks, vs = (t.repeat_interleave(r, 1).transpose(0, 1)[None].contiguous() for t, r in ((q, 1), (k, group), (v, group)))

    def ours(): kernel(q.data_ptr(), TOKENS, HEADS, k.data_ptr(), v.data_ptr(), TOKENS, KV_HEADS, HEAD_DIM,
                       HEAD_DIM ** -0.5, out.data_ptr(), 2)

    def sdpa(): F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)

    flops = 4 * HEADS * HEAD_DIM * TOKENS * TOKENS / 2  # QK^T and PV over the causal half
    for name, fn in (("bf16 kernel", ours), ("float32 SDPA", sdpa)):
        seconds = best_of(fn)
        print(f"{name}: {seconds * 1000:.0f} ms, {flops / seconds / 1e9:.0f} GFLOP/s")
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
