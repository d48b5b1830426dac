"""oneDNN's pre-packed float32 linear (chapter 15's `PackedLinear`, the exact-weights CPU matmul): a row gets the same
bits alone as among other rows, which same-tokens-batched-as-alone needs."""
import pytest
import torch

from helios.linears import PackedLinear, weight_packing_available

pytestmark = pytest.mark.skipif(not weight_packing_available(), reason="this PyTorch build cannot pre-pack for oneDNN")


@pytest.mark.parametrize("shape", [(576, 1536), (1536, 576), (192, 576), (96, 64)], ids=str)
def test_a_row_gets_the_same_bits_alone_and_among_others(shape):
    "Each of the first m rows of a 40-row product, for m = 1 (oneDNN's one-row kernel, bypassed) up to 33."
    torch.manual_seed(0)
    weight, bias = torch.randn(*shape), torch.randn(shape[0])
    linear = PackedLinear(weight, bias)
    x = torch.randn(40, shape[1])
    every = linear(x)
    for m in (1, 2, 3, 7, 16, 33):
        assert torch.equal(linear(x[:m]), every[:m]), m
    assert torch.equal(linear(x[0]), every[0])  # a bare vector: [in] -> [out]
    torch.testing.assert_close(every, torch.nn.functional.linear(x, weight, bias), rtol=1e-4, atol=1e-4)
