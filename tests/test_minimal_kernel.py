"""The minimal forward kernel that chapter 7 reads first (flashbook.kernels.minimal).

Checked against the float64 NumPy reference on the same (rounded) inputs, on fresh
random inputs, causal and not, with sequence lengths that are and are not a multiple
of the block, on the interpreter (fp16 and fp32; the interpreter gives garbage for bf16).
"""
import numpy as np
import pytest
import torch

from flashbook import reference, runtime
from flashbook.kernels.minimal import minimal_attention

# fp16: the inputs are exact in float64; the kernel rounds P to fp16 before P V
# (relative 2**-11 per weight) and rounds the output to fp16 (relative 2**-11), and
# |o| <= max |v| (about 4 for standard normal values): 4 * 4 * 2**-11 ~ 8e-3.
# fp32: sums of at most a few hundred terms of size <= 4 in fp32 (eps 1.2e-7) stay
# well under 1e-5. (On a GPU fp32 tl.dot uses TF32, eps 2**-11: use the fp16 tolerance.)
ATOL = {torch.float16: 1e-2, torch.float32: 1e-5 if runtime.device() == "cpu" else 1e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq_len", [64, 45], ids=["multiple-of-block", "ragged"])
def test_minimal_kernel_matches_float64_reference(rng, dtype, causal, seq_len):
    batch, heads, head_dim = 2, 2, 32
    q, k, v = (torch.from_numpy(rng.standard_normal((batch, heads, seq_len, head_dim))).to(dtype)
               for _ in range(3))
    got = minimal_attention(*(t.to(runtime.device()) for t in (q, k, v)), causal=causal,
                            block_m=16, block_n=16).cpu()
    assert got.dtype == dtype and got.shape == q.shape
    want = reference.attention(*(t.double().numpy() for t in (q, k, v)), causal=causal)
    err = np.abs(got.double().numpy() - want).max()
    assert err < ATOL[dtype], f"max |error| {err:.2e}"


def test_minimal_kernel_refuses_bad_input():
    q = torch.zeros(1, 1, 16, 16)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        minimal_attention(np.zeros((1, 1, 16, 16)), q, q)
    with pytest.raises(ValueError, match="k must match q"):
        minimal_attention(q, torch.zeros(1, 1, 16, 32), q)
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        minimal_attention(*(torch.zeros(1, 1, 16, 24),) * 3)
    with pytest.raises(ValueError, match="block_m"):
        minimal_attention(q, q, q, block_m=24)
    with pytest.raises(TypeError, match="q must be float16"):
        minimal_attention(*(torch.zeros(1, 1, 16, 16, dtype=torch.float64),) * 3)
