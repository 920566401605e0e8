"""Review round 4, the public API as a flash-attn / SDPA user meets it: what they write works or
fails with an error that names the argument, never with a silent wrong answer (kernels run
where they run: Triton's CPU interpreter here, in float32)."""
from __future__ import annotations

import inspect
import subprocess
import sys

import numpy as np
import pytest
import torch

import flashbook
from flashbook import reference, runtime
from flashbook.kernels.configs import Config

DEVICE = runtime.device()


def _qkv(*shape, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g).to(DEVICE).requires_grad_(grad) for _ in range(3))


def test_submodules_are_reachable_after_a_plain_import():
    """``flashbook.kernels.flash_decode`` as the pages write it, in a fresh process: the NumPy
    modules load without triton, the kernels on first use."""
    code = ("import sys, flashbook\n"
            "assert 'triton' not in sys.modules\n"
            "flashbook.tiled.forward; flashbook.reference.attention; flashbook.resources.results_dir\n"
            "assert 'triton' not in sys.modules, 'a NumPy module imported triton'\n"
            "flashbook.kernels.flash_decode; flashbook.distributed\n"
            "assert {'kernels', 'tiled', 'masks', 'resources'} <= set(dir(flashbook))\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        flashbook.nonexistent


def test_a_strided_cu_seqlens_is_refused_not_read_as_contiguous():
    """The kernels read cu_seqlens[b] at offset b: a strided view used to give garbage (5e20) or
    write outside o. Refused, naming the argument; its contiguous copy gives the right answer."""
    q, k, v = (x.reshape(30, 2, 16) for x in _qkv(1, 2, 30, 16))
    cu_view = torch.tensor([0, 99, 10, 99, 30], dtype=torch.int32, device=DEVICE)[::2]
    assert cu_view.tolist() == [0, 10, 30] and not cu_view.is_contiguous()
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be contiguous .* cu_seqlens_q\.contiguous\(\)"):
        flashbook.flash_attention_varlen(q, k, v, cu_view, cu_view.contiguous(), 20, 20)
    with pytest.raises(ValueError, match="cu_seqlens_k must be contiguous"):
        flashbook.flash_attention_varlen(q, k, v, cu_view.contiguous(), cu_view, 20, 20, check_values=False)
    o = flashbook.flash_attention_varlen(q, k, v, cu_view.contiguous(), cu_view.contiguous(), 20, 20)
    for a, b in ((0, 10), (10, 30)):
        want = reference.torch_attention(*(x[a:b].transpose(0, 1)[None].double() for x in (q, k, v)))[0]
        assert (o[a:b].transpose(0, 1).double() - want).abs().max() < 1e-5


def test_an_empty_cu_seqlens_says_so():
    q, k, v = (x.reshape(8, 1, 16) for x in _qkv(1, 1, 8, 16))
    empty = torch.tensor([], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="cu_seqlens_q must hold at least one value .* got an empty tensor"):
        flashbook.flash_attention_varlen(q, k, v, empty, empty, 0, 0)
    cu = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)   # 3 padding rows after the last document
    with pytest.raises(ValueError, match="must end at the packed length 8, got 5 .rows after the last document"):
        flashbook.flash_attention_varlen(q, k, v, cu, cu, 5, 5)


def test_a_gradient_of_the_gradient_raises_instead_of_dropping_its_terms():
    """With create_graph=True the kernels' gradients would come back as constants and a gradient
    penalty would silently lose its attention terms: refused where it is asked for."""
    q, k, v = _qkv(1, 2, 16, 16, grad=True)
    w = torch.randn(16, dtype=q.dtype, device=DEVICE, requires_grad=True)
    o = flashbook.flash_attention(q, k, v, causal=True)
    with pytest.raises(RuntimeError, match="flash_attention has no double backward"):
        torch.autograd.grad((o * w).sum(), q, create_graph=True)
    qp, kp, vp = (x.detach().reshape(16, 2, 16).requires_grad_() for x in (q, k, v))   # packed documents too
    cu = torch.tensor([0, 7, 16], dtype=torch.int32, device=DEVICE)
    op = flashbook.flash_attention_varlen(qp, kp, vp, cu, cu, 9, 9, causal=True)
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad((op * w).sum(), qp, create_graph=True)
    # one backward, as before: against torch autograd on float64
    o = flashbook.flash_attention(q, k, v, causal=True)
    gq, = torch.autograd.grad((o * w.detach()).sum(), q)
    q2, k2, v2 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = reference.torch_attention(q2, k2, v2, causal=True)
    assert (gq.double() - torch.autograd.grad((ref * w.detach().double()).sum(), q2)[0]).abs().max() < 1e-4


@pytest.mark.parametrize("bad,field", [((-16, 32, 4, 1), "block_m"), ((0, 32, 4, 1), "block_m"),
                                       ((48, 32, 4, 1), "block_m"), ((32, 24, 4, 1), "block_n"),
                                       ((32, 32, 3, 1), "num_warps"), ((32, 32, 4, 0), "num_stages"),
                                       ((32.0, 32, 4, 1), "block_m"), ((True, 32, 4, 1), "block_m")])
def test_a_config_with_impossible_tiles_is_refused_naming_the_field(bad, field):
    """Config(-16, ...) used to run and return garbage (error 6e12); 0 and 48 failed deep inside."""
    with pytest.raises(ValueError, match=rf"Config\.{field} must be"):
        Config(*bad)
    assert str(Config(np.int64(32), 16, 4, 1)) == "BM32-BN16-w4-s1"   # numpy ints are ints


def test_flash_decode_refuses_inputs_that_need_a_gradient():
    from flashbook.kernels import flash_decode

    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 1, 16, generator=g).to(DEVICE).requires_grad_()
    kc, vc = (torch.randn(2, 2, 40, 16, generator=g).to(DEVICE) for _ in range(2))
    with pytest.raises(RuntimeError, match="flash_decode has no backward .* torch.no_grad"):
        flash_decode(q, kc, vc)
    with torch.no_grad():
        o = flash_decode(q, kc, vc)
    want = reference.torch_attention(q.detach().double(), kc.double(), vc.double(), causal=True)
    assert (o.double() - want).abs().max() < 1e-5
    assert "Inference only" in inspect.getdoc(flash_decode)


def test_flash_decode_takes_an_int_cache_length_as_flash_attn_does():
    from flashbook.kernels import flash_decode

    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 1, 16, generator=g).to(DEVICE)
    kc, vc = (torch.randn(2, 2, 40, 16, generator=g).to(DEVICE) for _ in range(2))
    lengths = torch.full((2,), 23, dtype=torch.int32, device=DEVICE)
    assert torch.equal(flash_decode(q, kc, vc, cache_seqlens=23), flash_decode(q, kc, vc, cache_seqlens=lengths))
    want = reference.torch_attention(q.double(), kc[:, :, :23].double(), vc[:, :, :23].double(), causal=True)
    assert (flash_decode(q, kc, vc, cache_seqlens=23).double() - want).abs().max() < 1e-5


def test_flash_attns_do_nothing_keywords_are_accepted_and_the_rest_refused():
    """A call ported from flash_attn_func keeps dropout_p=0.0 (eval mode), deterministic and
    return_attn_probs=False; each value flashbook cannot honour is refused, naming it."""
    q, k, v = _qkv(1, 2, 12, 16, seed=3)
    plain = flashbook.flash_attention(q, k, v, causal=True)
    same = flashbook.flash_attention(q, k, v, causal=True, dropout_p=0.0, deterministic=True, return_attn_probs=False)
    assert torch.equal(plain, same)
    with pytest.raises(ValueError, match="dropout_p must be 0.0: flashbook has no dropout"):
        flashbook.flash_attention(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match="return_attn_probs must be False"):
        flashbook.flash_attention(q, k, v, return_attn_probs=True)
    with pytest.raises(ValueError, match="deterministic=True needs dq_mode='separate'"):
        flashbook.flash_attention(q, k, v, deterministic=True, dq_mode="atomic")
    with pytest.raises(TypeError, match="deterministic must be True or False"):
        flashbook.flash_attention(q, k, v, deterministic="yes")
    qp, kp, vp = (x[0].transpose(0, 1).contiguous() for x in (q, k, v))   # (total, heads, d)
    cu = torch.tensor([0, 12], dtype=torch.int32, device=DEVICE)
    packed = flashbook.flash_attention_varlen(qp, kp, vp, cu, cu, 12, 12, causal=True, dropout_p=0.0,
                                              deterministic=False)
    assert (packed.transpose(0, 1)[None] - plain).abs().max() < 1e-6
    with pytest.raises(ValueError, match="dropout_p must be 0.0"):
        flashbook.flash_attention_varlen(qp, kp, vp, cu, cu, 12, 12, dropout_p=0.5)


def test_a_head_count_mismatch_names_the_layout():
    """flash-attn's (batch, seq, heads, head_dim) passed as it is: where the heads cannot divide,
    the error says which layout flashbook takes and how to pass flash-attn's."""
    q = torch.randn(1, 16, 8, 32, device=DEVICE)
    kv = torch.randn(1, 15, 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"the layout is \(batch, heads, seq, head_dim\).*x\.transpose\(1, 2\)"):
        flashbook.flash_attention(q, kv, kv)


def test_triton_imported_first_without_a_gpu_is_explained():
    """Without a GPU and with triton imported before flashbook, the kernels cannot run: the
    error says why and what to do, not Triton's '0 active drivers'."""
    if runtime.HAS_CUDA:
        pytest.skip("a machine with a GPU runs the kernels whatever the import order")
    code = ("import os; os.environ.pop('TRITON_INTERPRET', None)\n"
            "import triton, warnings, torch\n"
            "warnings.simplefilter('ignore')\n"
            "import flashbook\n"
            "q = torch.randn(1, 1, 16, 16)\n"
            "try:\n"
            "    flashbook.flash_attention(q, q, q)\n"
            "except RuntimeError as e:\n"
            "    print(e)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert "Triton was imported before flashbook without a GPU" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "import flashbook before triton" in done.stdout


def test_varlen_shape_errors_speak_of_the_tensors_passed():
    """Re-check N2: the errors name the caller's (total, heads, head_dim) shapes and give no
    transpose advice (varlen takes flash-attn's layout as it is)."""
    cu = torch.tensor([0, 10, 30], dtype=torch.int32, device=DEVICE)
    cases = [((30, 3, 32), (30, 2, 32), (30, 2, 32), r"k's number of heads \(2\) must divide q's \(3\).*got q \(30, 3, 32\), k \(30, 2, 32\)$"),
             ((30, 4, 32), (30, 2, 16), (30, 2, 16), r"k must have q's head_dim 32, got k \(30, 2, 16\)$"),
             ((30, 4, 32), (30, 2, 32), (30, 1, 32), r"k and v must have the same number of heads, got k \(30, 2, 32\), v \(30, 1, 32\)$"),
             ((30, 4, 32), (30, 2, 32), (29, 2, 32), r"k and v must have the same sequence length, got k \(30, 2, 32\), v \(29, 2, 32\)$")]
    for qs, ks, vs, words in cases:
        q, k, v = (torch.randn(*s, device=DEVICE) for s in (qs, ks, vs))
        with pytest.raises(ValueError, match=words) as err:
            flashbook.flash_attention_varlen(q, k, v, cu, cu, 20, 20)
        assert "transpose" not in str(err.value) and "(1, " not in str(err.value)


def test_an_int_cache_length_is_checked_on_the_host():
    """Re-check N4: an int needs no device synchronisation to check, so it is checked."""
    from flashbook.kernels import flash_decode

    q = torch.randn(2, 4, 1, 16, device=DEVICE)
    kc = torch.randn(2, 2, 40, 16, device=DEVICE)
    for bad in (-5, 41):
        with pytest.raises(ValueError, match=rf"cache_seqlens must be in \[0, 40\] .the cache's length., got {bad}"):
            flash_decode(q, kc, kc, cache_seqlens=bad)
    assert torch.equal(flash_decode(q, kc, kc, cache_seqlens=np.int64(40)), flash_decode(q, kc, kc))


def test_alibi_slopes_that_want_a_gradient_are_warned_about():
    q = torch.randn(1, 3, 8, 16, device=DEVICE)
    slopes = torch.tensor([0.1, 0.2, 0.3], device=DEVICE, requires_grad=True)
    with pytest.warns(UserWarning, match="alibi_slopes requires a gradient, which flashbook does not compute"):
        flashbook.flash_attention(q, q, q, alibi_slopes=slopes)
    assert slopes.grad is None


def test_a_192_row_tile_is_the_gluon_kernels_alone():
    """Config is the Triton kernels' (tl.arange: powers of two); the Gluon kernel's 192-row
    tiles are its own arguments, and the compile targets pass them as such."""
    with pytest.raises(ValueError, match=r"Config\.block_m must be a power of two"):
        Config(192, 128, 8, 2)
    from flashbook.kernels import hopper_choices, targets

    assert hopper_choices.DEFAULTS[64][0] == 192
    assert 'block_m, block_n, _, stages = job["config"]' in inspect.getsource(targets.run_job)


@pytest.mark.parametrize("argument", ["config", "config_dkdv", "config_dq"])
def test_a_config_given_as_a_tuple_names_its_argument(argument):
    from flashbook.kernels import flash_backward, flash_forward

    q, k, v = (torch.randn(1, 2, 16, 16) for _ in range(3))
    with pytest.raises(TypeError, match=rf"^{argument} must be a flashbook.kernels.Config\(block_m, block_n"):
        if argument == "config":
            flash_forward(q, k, v, config=(32, 32, 4, 2))
        else:
            o, lse = flash_forward(q, k, v)
            flash_backward(q, k, v, o, lse, torch.randn_like(o), **{argument: (32, 32, 4, 2)})
