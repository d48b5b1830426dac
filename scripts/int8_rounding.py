"""Which rounding of the `c-int8` matmul moves SmolLM2's next tokens: its activations per token, or its weights per output
channel, each alone and per kind of linear (appendix 92, "What int8 buys, and costs").

    flock /tmp/helios-cpu.lock python scripts/int8_rounding.py [--positions 256] [--model PATH] [--smooth 0.5 ...]

The model runs with exact float32 weights (`dtype="float32"`, oneDNN's `PackedLinear`). Each row of the table rounds one
thing the way matmul_int8.c does, in PyTorch (`int8_quantize`, then back to floats), and leaves the rest exact: the
inputs of every linear (or of one kind: qkv_proj, o_proj, gate_up_proj, down_proj, lm_head) per token, or their weights
per output channel. Agreement with the unrounded model is measured as scripts/bf16_accuracy.py measures it.

`--smooth ALPHA` adds a row per ALPHA: both rounded, after SmoothQuant's scaling. Each linear's input channel j is
divided by s_j = max|x_j|^ALPHA / max|W[:, j]|^(1 - ALPHA) and its weight column multiplied by it (the product is
unchanged before rounding), which moves a large channel's range from the activations into the weights. The max|x_j| are
calibrated on other text than the measured one (the docstrings of other standard-library modules).
"""
from __future__ import annotations

import argparse

import torch

from bf16_accuracy import WINDOW, agreement, machine, next_token_logprobs, windows

CALIBRATION_MODULES = ("os", "re", "subprocess", "functools", "itertools", "random", "csv", "email", "http", "sqlite3")


def rounded(x: torch.Tensor) -> torch.Tensor:
    "x [..., K] rounded to int8 per row as the kernel rounds its activations, back in float32."
    from helios.kernels.matmul import int8_quantize
    values, scales = int8_quantize(x)
    return values.float() * scales[..., None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--model", default=None, help="a model LLM() takes (default: the embedded SmolLM2-135M)")
    parser.add_argument("--smooth", type=float, action="append", default=[],
                        help="add a row rounding both after SmoothQuant's scaling with this alpha (repeatable)")
    args = parser.parse_args()
    from helios import LLM
    from helios.linears import PackedLinear
    exact_forward = PackedLinear.forward

    def forward(self, x):  # the input rounded per token where this linear is marked (divided by its smoothing first)
        if self.calibrating:
            seen = x.detach().abs().reshape(-1, x.shape[-1]).amax(0)
            self.amax = seen if self.amax is None else torch.maximum(self.amax, seen)
        if self.smooth is not None: x = x / self.smooth
        return exact_forward(self, rounded(x) if self.round_inputs else x)

    PackedLinear.forward = forward
    try:
        measure(LLM, PackedLinear, args)
    finally:
        PackedLinear.forward = exact_forward


def measure(LLM, PackedLinear, args) -> None:
    "Print the table: the model loaded once, each row's rounding set on its linears before the row's pass."
    with LLM(args.model, dtype="float32", quiet=True, kv_cache_bytes=1 << 30, max_batch_size=32) as llm:
        linears = {n: m for n, m in llm.model.named_modules() if isinstance(m, PackedLinear)}
        weights = {}  # each linear's float32 weight, read back through its packed form
        for name, m in linears.items():
            m.round_inputs, m.calibrating, m.amax, m.smooth = False, False, None, None
            weights[name] = torch.ops.mkldnn._linear_pointwise(torch.eye(m.in_features), m.packed, None, "none", [],
                                                               "").T.contiguous()
        exact_packed = {name: m.packed for name, m in linears.items()}
        prompts = windows(llm.tokenizer, args.positions)
        reference, _ = next_token_logprobs(llm, prompts)
        kinds = sorted({name.rsplit(".", 1)[-1] for name in linears})
        rows = [("activations, every linear", set(), set(kinds)), ("weights, every linear", set(kinds), set()),
                ("both, every linear", set(kinds), set(kinds))]
        rows += [(f"activations, {k}", set(), {k}) for k in kinds] + [(f"weights, {k}", {k}, set()) for k in kinds]
        print(f"{args.model or 'SmolLM2-135M'}, {args.positions} positions; {machine()}\n")
        print("| rounded to int8 | top-1 | max \\|Δ log p\\| | mean |\n| --- | --- | --- | --- |")
        for label, weight_kinds, input_kinds in rows:
            for name, m in linears.items():
                kind = name.rsplit(".", 1)[-1]
                m.round_inputs = kind in input_kinds
                m.packed = (torch.ops.mkldnn._reorder_linear_weight(rounded(weights[name]), 16)
                            if kind in weight_kinds else exact_packed[name])
            report(label, agreement(reference, *next_token_logprobs(llm, prompts)))
        if args.smooth:
            for name, m in linears.items(): m.round_inputs, m.packed = False, exact_packed[name]
            calibrate(llm, linears)
        for alpha in args.smooth:
            for name, m in linears.items():
                m.round_inputs = True
                m.smooth = (m.amax.clamp(min=1e-5) ** alpha / weights[name].abs().amax(0).clamp(min=1e-5) ** (1 - alpha))
                m.packed = torch.ops.mkldnn._reorder_linear_weight(rounded(weights[name] * m.smooth), 16)
            report(f"both, every linear, smoothed (alpha {alpha})", agreement(reference, *next_token_logprobs(llm, prompts)))


def report(label: str, a) -> None:
    print(f"| {label} | {a.top1}/{a.positions} ({100 * a.top1 / a.positions:.1f}%) | {a.max_gap:.3f} | "
          f"{a.mean_gap:.4f} |", flush=True)


def calibrate(llm, linears: dict) -> None:
    "Each linear's largest |input| per channel (its `amax`), over 32 windows of the calibration text, exact weights."
    from importlib import import_module
    text = "\n\n".join(d.strip() for d in (import_module(n).__doc__ for n in CALIBRATION_MODULES) if d)
    ids = llm.tokenizer.encode(text)
    prompts = [ids[i:i + WINDOW] for i in range(0, min(len(ids) - WINDOW, 32 * WINDOW), WINDOW)]
    for m in linears.values(): m.calibrating = True
    next_token_logprobs(llm, prompts)
    for m in linears.values(): m.calibrating = False


if __name__ == "__main__":
    main()
