"""The Gluon FlashAttention forward for Hopper (attention_kernels/flash_attn/gluon_forward.py), called directly
(flash_attn_func's choice of it: tests/test_flash_attn_dispatch.py).

On any machine: it compiles for sm_90a with no spills and with wgmma and TMA copies (ptxas judges it), and its
call refuses what it cannot take. On a Hopper GPU: its output against the fp64 reference written from the formula
(attention_ref) and its base-2 LSE against the formula's, on lengths that are not tile multiples, GQA 4:1, with
the causal mask and without, and rows that see no key.
"""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attention_kernels.common import rel_err, tolerance
from attention_kernels.flash_attn import attention_ref, causal_mask
from attention_kernels.launch import TESTED_TRITON, triton_tested

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "flash_attn_gluon_compile.py"


def _gluon_forward():
    from attention_kernels.flash_attn import gluon_forward
    return gluon_forward


def test_gluon_forward_compiles_for_hopper_without_spills():
    """No GPU needed: D = 128, causal, bf16 compiled for sm_90a; ptxas reports no spills, the wgmma pipeline is
    not serialized, shared memory fits, and the PTX holds wgmma and TMA copies (the script exits 1 otherwise)."""
    if not triton_tested():
        pytest.skip(f"the Gluon kernels run on Triton {', '.join(TESTED_TRITON)} only "
                    "(attention_kernels.launch.TESTED_TRITON)")
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", "128", "causal"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "spill stores 0 B, spill loads 0 B" in out and "OK" in out, out[-3000:]
    assert "'wgmma': 0" not in out and "'tma_load': 0" not in out, out[-3000:]


def test_gluon_pingpong_compiles_with_its_handover():
    """No GPU needed: the ping-pong loop (D = 64, causal, bf16) compiled for sm_90a beside the in-order loop: no
    spills in either, and each warpgroup's turn barriers in the PTX (mbarrier waits and arrives at 3 sites more
    than its K and V ones; the script exits 1 otherwise)."""
    if not triton_tested():
        pytest.skip(f"the Gluon kernels run on Triton {', '.join(TESTED_TRITON)} only "
                    "(attention_kernels.launch.TESTED_TRITON)")
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", "64", "causal", "pingpong"], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "=== fa_fwd_ws_d64_causal_pingpong" in out and out.count("spill stores 0 B, spill loads 0 B") == 2, out
    assert "ping-pong mbar_wait" in out and "ping-pong mbar_arrive" in out and "OK" in out, out[-3000:]


def test_gluon_forward_refuses_overlap_with_pingpong():
    """The two loops are alternatives: asking for both is refused by name, before any launch."""
    q = torch.randn(1, 8, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="pingpong and overlap"):
        _gluon_forward().gluon_attention_fwd(q, q, q, causal=False, overlap=True, pingpong=True)


@pytest.mark.parametrize("change, message", [
    (lambda q, k, v: (q.float(), k.float(), v.float()), "bf16 or fp16"),
    (lambda q, k, v: (q[..., :32].contiguous(), k[..., :32].contiguous(), v[..., :32].contiguous()), "head dim"),
    (lambda q, k, v: (q, torch.cat([k, k[:, :, :1]], 2), torch.cat([v, v[:, :, :1]], 2)), "multiple of KV heads"),
    (lambda q, k, v: (q.transpose(1, 2), k, v), "B, T, Hq, D|contiguous"),
])
def test_gluon_forward_refuses_what_it_cannot_take(change, message, monkeypatch):
    """ValueError, saying why, before any launch (the GPU played as a Hopper where there is none)."""
    gf = _gluon_forward()
    q = torch.randn(1, 8, 4, 64, dtype=torch.bfloat16)
    k, v = torch.randn(2, 1, 8, 2, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    with pytest.raises(ValueError, match=message):
        gf.gluon_attention_fwd(*change(q, k, v), causal=False)


def test_gluon_forward_refuses_inputs_that_require_grad():
    """Forward only: an input that requires grad is refused by name, never silently untrainable."""
    gf = _gluon_forward()
    q, k, v = torch.randn(3, 1, 8, 2, 64, dtype=torch.bfloat16).unbind(0)
    with pytest.raises(ValueError, match="^k requires grad"):
        gf.gluon_attention_fwd(q, k.requires_grad_(), v, causal=False)


def test_gluon_forward_refuses_a_tensor_off_hopper():
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
        pytest.skip("this GPU is a Hopper: the kernel runs (see the gpu tests)")
    q = torch.randn(1, 8, 4, 64, dtype=torch.bfloat16, device="cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="Hopper"):
        _gluon_forward().gluon_attention_fwd(q, q, q, causal=False)


def _lse2_reference(q, k, causal, scale):
    """log2 sum_j exp2(s_ij * scale * log2 e) in fp64, [B, Hq, T]; +inf where a row sees no key (the kernels'
    convention: it makes P = 0 in the backward)."""
    HQ = q.shape[2]
    kk = k.double().repeat_interleave(HQ // k.shape[2], dim=2)
    s = torch.einsum("bthd,bshd->bhts", q.double(), kk) * scale
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[1], k.shape[1], device=q.device), -math.inf)
    lse = torch.logsumexp(s, dim=-1) / math.log(2)
    return torch.where(torch.isneginf(lse), math.inf, lse)


def _check_against_reference(B, T, S, HQ, HKV, D, causal, dtype, loop):
    q = torch.randn(B, T, HQ, D, device="cuda", dtype=dtype)
    k, v = torch.randn(2, B, S, HKV, D, device="cuda", dtype=dtype)
    scale = D ** -0.5
    o, lse = _gluon_forward().gluon_attention_fwd(q, k, v, causal=causal, softmax_scale=scale, **loop)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == (B, HQ, T) and lse.dtype == torch.float32
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    ref = attention_ref(q, k, v, causal=causal, softmax_scale=scale, compute_dtype=torch.float64,
                        out_dtype=torch.float64)
    tol = tolerance(dtype, tf32_dots=True)   # the forward's tolerance (tests/test_flash_attn.py `_tols`)
    err = rel_err(o, ref)
    assert err <= tol, f"o: relative error {err:.2e} > {tol:.0e}"
    lse_ref = _lse2_reference(q, k, causal, scale)
    empty = torch.isinf(lse_ref)
    assert torch.equal(torch.isinf(lse), empty) and (lse[empty] > 0).all(), "rows that see no key: lse must be +inf"
    assert not o[empty.transpose(1, 2)].any(), "rows that see no key: o must be 0"
    if (~empty).any():
        err = rel_err(lse[~empty], lse_ref[~empty])
        assert err <= tolerance(torch.float32, tf32_dots=True), f"lse: relative error {err:.2e}"


# the consumers' loops, as gluon_attention_fwd's keywords
LOOPS = pytest.mark.parametrize("loop", [dict(overlap=False), dict(overlap=True), dict(pingpong=True)],
                                ids=["in-order", "overlapped", "pingpong"])


@pytest.mark.gpu
@LOOPS
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("T", [1, 77, 1000, 4100])
def test_gpu_gluon_forward_matches_reference(T, D, causal, loop):
    """T = S, not multiples of the 128-row query block or the 128-key tile; GQA 4:1 (8 query heads, 2 KV);
    the three consumer loops (in order, the next tile's scores issued before the softmax, the warpgroups taking
    turns on the tensor cores)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon forward runs on Hopper only")
    _check_against_reference(2, T, T, 8, 2, D, causal, torch.bfloat16, loop)


@pytest.mark.gpu
@LOOPS
@pytest.mark.parametrize("T, S", [(77, 1000), (1000, 77), (300, 5)], ids=["T<S", "T>S", "rows-see-nothing"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_gluon_forward_unequal_lengths_causal(T, S, dtype, loop):
    """T != S under the bottom-right causal mask: with T > S the first T - S rows see no key (o = 0, lse = +inf)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon forward runs on Hopper only")
    _check_against_reference(2, T, S, 8, 2, 128, True, dtype, loop)
    _check_against_reference(1, T, S, 4, 1, 64, False, dtype, loop)


@pytest.mark.gpu
@LOOPS
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_gluon_forward_hidden_nan_reaches_only_rows_that_see_it(D, loop):
    """A NaN and an inf in V at keys inside the sequence (one on a diagonal tile, one in the middle of a tile
    with rows on both sides of it), causal: rows before each key stay finite and equal the formula's with those
    values zeroed; rows at or after it are NaN (0 * NaN stays out of the masked products)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon forward runs on Hopper only")
    T, bad = 300, (130, 200)
    q, k, v = torch.randn(3, 1, T, 2, D, device="cuda", dtype=torch.bfloat16)
    v[0, bad[0], 0, 3], v[0, bad[1], 1, 5] = float("nan"), float("inf")
    o, _ = _gluon_forward().gluon_attention_fwd(q, k, v, causal=True, **loop)
    ref = attention_ref(q, k, torch.nan_to_num(v, nan=0.0, posinf=0.0), causal=True, compute_dtype=torch.float64,
                        out_dtype=torch.float64)
    for head, key in enumerate(bad):
        before = o[0, :key, head]
        assert torch.isfinite(before).all(), f"head {head}: a row before key {key} was reached by its value"
        err = rel_err(before, ref[0, :key, head])
        assert err <= tolerance(torch.bfloat16, tf32_dots=True), f"head {head}: relative error {err:.2e}"
        assert not torch.isfinite(o[0, key:, head]).all(dim=-1).any(), f"head {head}: a row seeing key {key} is finite"
