"""A peer for ``python -m flashbook.bench --peer``: PyTorch's cuDNN attention.

    python -m flashbook.bench --peer benchmarks/peers/torch_cudnn.py --out DIR

It shows what a peer file must provide: a function ``attention(q, k, v, causal, scale)``
on (batch, heads, seq, head_dim) tensors that returns the output, differentiable if the
peer has a backward. This one is PyTorch's scaled_dot_product_attention pinned to the
cuDNN backend (the fastest attention PyTorch ships for Hopper), so the peer run puts our
kernel beside cuDNN at the shapes of Triton's tutorial comparison. Any other kernel file
with the same function (Triton's tutorial ``06-fused-attention.py`` among them) runs the
same way.
"""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention


def attention(q, k, v, causal, scale):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
