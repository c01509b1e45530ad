"""fla's call on Lightning Attention (attention_kernels/lightning/compat.py): chunk_lightning_attn and
fused_recurrent_lightning_attn with fla's arguments against the fp64 loop with fla's decay written from
its formula (g_h = -(8 / H) · (1 - layer_idx / num_layers) · h, scale 1/√K), against chunk_lightning
with the same slopes (bitwise), packed sequences with fla's int64 offsets, gradients, refusals.

CPU (interpreter): fp32, T = 70, H = 4, K = V = 16.
"""
import inspect

import pytest
import torch

from attention_kernels.common import DEVICE, assert_close, tolerance
from attention_kernels.lightning import (chunk_lightning, chunk_lightning_attn, fla_lightning_slopes,
                               fused_recurrent_lightning_attn, naive_recurrent_lightning)

FP32 = tolerance(torch.float32)
B, T, H, K = 1, 70, 4, 16


def make_inputs(batch=B, requires_grad=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, T, H, K, generator=gen).to(DEVICE).requires_grad_(requires_grad) for _ in range(3))
    h0 = (0.5 * torch.randn(batch, H, K, K, generator=gen)).to(DEVICE).requires_grad_(requires_grad)
    return q, k, v, h0


def fla_decay(layer_idx, num_layers):
    """fla's log decay per head, from its formula (fla/ops/lightning_attn/chunk.py)."""
    return torch.tensor([-(8 / H) * (1 - layer_idx / num_layers) * h for h in range(H)], dtype=torch.float64)


@pytest.mark.parametrize("form", [chunk_lightning_attn, fused_recurrent_lightning_attn])
def test_fla_call_against_the_loop(form):
    q, k, v, h0 = make_inputs(batch=2)
    o, final = form(q, k, v, 3, 8, initial_state=h0, output_final_state=True)
    o_ref, final_ref = naive_recurrent_lightning(q.double(), k.double(), v.double(), -fla_decay(3, 8).to(DEVICE),
                                                 scale=K ** -0.5, initial_state=h0.double(), output_final_state=True)
    assert_close(o, o_ref, FP32, "o")
    assert_close(final, final_ref, FP32, "final_state")
    assert form(q, k, v, 3, 8)[1] is None


def test_slopes_are_fla_s_not_minimax_s():
    assert torch.equal(fla_lightning_slopes(H, 3, 8), -fla_decay(3, 8).float())
    assert fla_lightning_slopes(H, 3, 8)[0] == 0                      # head 0 keeps everything


def test_packed_with_int64_offsets_and_gradients():
    q, k, v, _ = make_inputs(requires_grad=True)
    gen = torch.Generator().manual_seed(1)
    h0 = (0.5 * torch.randn(3, H, K, K, generator=gen)).to(DEVICE).requires_grad_(True)
    do = torch.randn(B, T, H, K, generator=gen).to(DEVICE)
    cu = torch.tensor([0, 5, 45, 70], dtype=torch.int64, device=DEVICE)
    o, final = chunk_lightning_attn(q, k, v, 1, 4, scale=0.3, initial_state=h0, output_final_state=True,
                                    cu_seqlens=cu)
    grads = torch.autograd.grad((o * do).sum() + final.square().sum(), (q, k, v, h0))
    o_ref, final_ref = chunk_lightning(q, k, v, fla_lightning_slopes(H, 1, 4).to(DEVICE), scale=0.3,
                                       initial_state=h0, output_final_state=True, cu_seqlens=cu.int())
    grads_ref = torch.autograd.grad((o_ref * do).sum() + final_ref.square().sum(), (q, k, v, h0))
    assert torch.equal(o, o_ref) and torch.equal(final, final_ref)
    for name, g, g_ref in zip("q k v h0".split(), grads, grads_ref, strict=True):
        assert g_ref.abs().max() > 0 and torch.equal(g, g_ref), name


@pytest.mark.parametrize("form, kwargs, match", [
    (chunk_lightning_attn, dict(head_first=True), "head_first"),
    (fused_recurrent_lightning_attn, dict(reverse=True), "reverse"),
    (chunk_lightning_attn, dict(layer_idx=-1), "layer_idx"),
    (chunk_lightning_attn, dict(num_layers=0), "num_layers"),
])
def test_refusals(form, kwargs, match):
    q, k, v, _ = make_inputs()
    args = dict(layer_idx=0, num_layers=4) | kwargs
    with pytest.raises(ValueError, match=match):
        form(q, k, v, **args)


def test_signatures_follow_fla():
    assert list(inspect.signature(chunk_lightning_attn).parameters) == [
        "q", "k", "v", "layer_idx", "num_layers", "scale", "initial_state", "output_final_state", "cu_seqlens",
        "head_first"]
    assert list(inspect.signature(fused_recurrent_lightning_attn).parameters) == [
        "q", "k", "v", "layer_idx", "num_layers", "scale", "initial_state", "output_final_state", "reverse",
        "cu_seqlens", "head_first"]
