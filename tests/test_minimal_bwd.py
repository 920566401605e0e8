"""The minimal backward kernels that chapter 8 reads first (flashbook.kernels.minimal).

``minimal_backward`` takes the forward's output and lse (from the library's
``flash_forward``, since ``minimal_fwd`` saves no lse) and returns dQ, dK, dV. They are
checked against PyTorch autograd in float64 on the same (rounded) inputs, causal and not,
with sequence lengths that are and are not a multiple of the block, under several seeds,
on the interpreter (fp16 and fp32; the interpreter gives garbage for bf16), and in bf16
on a GPU (``pytest -m gpu``). The buffers the wrapper allocates are poisoned with NaN
first, so an element no kernel writes shows up as an error.

The tolerance is chapter 8's rule (``checks.within_twice_yardstick``), which follows from
the dtype: the *yardstick* is the same attention in plain PyTorch in the input dtype, so
its error against float64 is what that dtype's rounding costs on these very inputs; the
kernels may err at most twice as much, plus a floor of 8 sqrt(head_dim) float32 ulps and
half a rounding step of the dtype at the largest gradient (the final rounding to the
dtype). On a GPU, fp32 inputs would be multiplied in TF32 (Triton's default, which the
minimal kernels keep), which plain fp32 PyTorch does not: hence bf16 there.
"""
import numpy as np
import pytest
import torch

from flashbook import runtime
from flashbook.kernels import checks, flash_forward
from flashbook.kernels import minimal
from flashbook.kernels.minimal import minimal_backward

HEAD_DIM = 32


def _poisoned_backward(*args, **kwargs):
    """``minimal_backward`` with every buffer it allocates (dq, dk, dv) starting as NaN, so that
    an element no kernel writes stays NaN."""
    real = torch.empty_like
    allocated = []

    def poisoned(t, *a, **kw):
        allocated.append(real(t, *a, **kw).fill_(float("nan")))
        return allocated[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(minimal.torch, "empty_like", poisoned)
        got = minimal_backward(*args, **kwargs)
    assert len(allocated) == 3 and all(any(x is a for a in allocated) for x in got)   # the poisoned buffers
    return got


def _check(dtype, causal, seq_len, seed, device, *, batch=2, heads=2, block_m=16, block_n=16):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(batch, heads, seq_len, HEAD_DIM, generator=gen).to(dtype) for _ in range(4))
    o, lse = flash_forward(*(t.to(device) for t in (q, k, v)), causal=causal)
    got = _poisoned_backward(*(t.to(device) for t in (q, k, v)), o, lse, do.to(device), causal=causal,
                             block_m=block_m, block_n=block_n)
    truth = checks.torch_grads(q, k, v, do, causal=causal, dtype=torch.float64)[1:]      # autograd, float64
    yardstick = checks.torch_grads(q.to(device), k.to(device), v.to(device), do.to(device), causal=causal,
                                   dtype=dtype)[1:]
    # dQ and dK may also carry the error of the forward's rounded o, read for delta (the book's rule)
    allow = checks.output_error_allowance(q, k, v, do, o.cpu(), causal=causal)[1:]
    for name, x, want, yard, a in zip(("dq", "dk", "dv"), got, truth, yardstick, allow):
        assert x.shape == q.shape and x.dtype == dtype and x.device.type == torch.device(device).type, name
        assert not torch.isnan(x).any(), f"{name}: elements left unwritten (NaN), seed {seed}"
        problem = checks.within_twice_yardstick(name, x.cpu(), want, yard.cpu(), head_dim=HEAD_DIM, allow=a)
        assert problem is None, f"seed {seed}: {problem}"


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq_len", [64, 45], ids=["multiple-of-block", "ragged"])
def test_minimal_backward_matches_float64_autograd(dtype, causal, seq_len, seed):
    if runtime.device() != "cpu" and dtype == torch.float32:
        pytest.skip("on a GPU fp32 tl.dot is TF32: the gpu test checks bf16 there")
    _check(dtype, causal, seq_len, seed, runtime.device())


def test_minimal_backward_blocks_of_different_sizes():
    """BLOCK_M != BLOCK_N: the dK/dV kernel's causal start and the dQ kernel's end still
    pick every tile a row or key needs."""
    for block_m, block_n in ((16, 32), (32, 16)):
        _check(torch.float16, True, 50, 3, runtime.device(), batch=1, block_m=block_m, block_n=block_n)


@pytest.mark.gpu
@pytest.mark.skipif(runtime.device() != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq_len", [512, 300], ids=["multiple-of-block", "ragged"])
def test_minimal_backward_bf16_on_a_gpu(causal, seq_len):
    for seed in (0, 1):
        _check(torch.bfloat16, causal, seq_len, seed, "cuda", block_m=32, block_n=32)


def test_minimal_backward_refuses_bad_input():
    x = torch.zeros(1, 1, 16, 16)
    lse = torch.zeros(1, 1, 16)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        minimal_backward(np.zeros((1, 1, 16, 16)), x, x, x, lse, x)
    with pytest.raises(TypeError, match="lse must be a torch.Tensor"):
        minimal_backward(x, x, x, x, None, x)
    with pytest.raises(ValueError, match="q must be 4-d"):
        minimal_backward(*(torch.zeros(1, 16, 16),) * 5, lse)
    with pytest.raises(ValueError, match="k must match q"):
        minimal_backward(x, torch.zeros(1, 1, 16, 32), x, x, lse, x)
    with pytest.raises(ValueError, match="v must match q"):
        minimal_backward(x, x, torch.zeros(1, 1, 16, 16, dtype=torch.float16), x, lse, x)
    with pytest.raises(ValueError, match="o must match q"):
        minimal_backward(x, x, x, torch.zeros(1, 1, 17, 16), lse, x)
    with pytest.raises(ValueError, match="do must match q"):
        minimal_backward(x, x, x, x, lse, torch.zeros(2, 1, 16, 16))
    with pytest.raises(ValueError, match="lse must be float32 of shape"):
        minimal_backward(x, x, x, x, torch.zeros(1, 1, 17), x)
    with pytest.raises(ValueError, match="lse must be float32"):
        minimal_backward(x, x, x, x, lse.double(), x)
    with pytest.raises(TypeError, match="q must be float16"):
        minimal_backward(*(torch.zeros(1, 1, 16, 16, dtype=torch.float64),) * 4, lse, x.double())
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        minimal_backward(*(torch.zeros(1, 1, 16, 24),) * 4, lse, torch.zeros(1, 1, 16, 24))
    with pytest.raises(ValueError, match="block_n"):
        minimal_backward(x, x, x, x, lse, x, block_n=24)
    with pytest.raises(ValueError, match="block_m"):
        minimal_backward(x, x, x, x, lse, x, block_m=True)
