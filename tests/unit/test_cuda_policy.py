"""The CUDA choices made from a GPU's compute capability, checked on a CPU with faked capabilities: the dtype
(float16 below 8.0, where bfloat16 is emulated; bfloat16 from 8.0) and whether FlashAttention's varlen_attn runs."""
import pytest
import torch

from helios.attention.cuda import varlen_unavailable
from helios.weights import cuda_dtype, resolve_dtype

GPU = torch.device("cuda")


@pytest.mark.parametrize("capability, dtype", [((7, 0), torch.float16), ((7, 5), torch.float16),
                                               ((8, 0), torch.bfloat16), ((8, 9), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_auto_dtype_follows_the_compute_capability(capability, dtype):
    assert cuda_dtype(capability) == dtype == resolve_dtype("auto", GPU, capability)


def test_an_explicit_dtype_wins_and_the_cpu_keeps_float32():
    assert resolve_dtype("bfloat16", GPU, (7, 5)) == torch.bfloat16
    assert resolve_dtype("float16", GPU, (9, 0)) == torch.float16
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32


def test_flashattention_is_refused_below_8_0_with_the_reason():
    assert varlen_unavailable(GPU, (7, 5)) == "FlashAttention needs compute capability 8.0+, this GPU has 7.5"
    assert varlen_unavailable(torch.device("cpu")) == "varlen_attn runs on CUDA, not cpu"


def test_a_pytorch_whose_varlen_attn_lacks_the_paged_keywords_is_refused(monkeypatch):
    import torch.nn.attention.varlen as varlen
    def old_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=None): ...
    monkeypatch.setattr(varlen, "varlen_attn", old_varlen_attn)
    assert "takes no block_table, seqused_k, num_splits" in varlen_unavailable(GPU, (9, 0))


def test_gathering_pages_off_the_cpu_never_reads_the_page_numbers():
    "Off the CPU, gather_pages indexes the pool with the table as it is: on the meta device, any read of a value raises."
    from helios.attention.base import gather_pages
    pool = torch.randn(6, 4, 2, 3)  # [pages, page_size, H, D]
    for table in (torch.tensor([2, 3, 4]), torch.tensor([5, 1, 0])):  # consecutive (a view on the CPU), scattered
        expected = torch.cat([pool[p] for p in table.tolist()])[:10]
        assert torch.equal(gather_pages(pool, table, 10), expected)
        with pytest.raises((RuntimeError, NotImplementedError)): int(table.to("meta")[0])  # what a host read would do
        assert gather_pages(pool.to("meta"), table.to("meta"), 10).shape == (10, 2, 3)


def test_float32_pages_on_a_gpu_take_the_torch_backend():
    "varlen_attn's kernels read float16/bfloat16 only: float32 on an sm90 GPU falls to `torch`, with the reason."
    from helios.attention.base import choose_backend
    from helios.config import tiny_qwen3
    choice = choose_backend(tiny_qwen3(), torch.float32, GPU, capability=(9, 0))
    assert choice.implementation.name == "torch"
    assert any(r.startswith("varlen:") for r in choice.passed_over)
