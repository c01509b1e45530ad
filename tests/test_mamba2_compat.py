"""mamba_ssm's call on the SSD chunk scan (attention_kernels/mamba2/compat.py): mamba_chunk_scan_combined with
mamba_ssm's arguments gives ssd_chunk_scan's answer under mamba_ssm's conventions. Plain and packed calls
(seq_idx with and without cu_seqlens, batch 1 and 2), the initial state belonging to sequence 0, the
final state of the last sequence, the per-sequence states (return_varlen_states), dt_limit against the
fp64 loop, gradients through the alias against those through ssd_chunk_scan, and the refusals.

CPU (interpreter): fp32, T = 70, H = 4, P = N = 16, G = 2.
"""
import math

import pytest
import torch

from attention_kernels.common import DEVICE, assert_close, tolerance
from attention_kernels.mamba2 import mamba_chunk_scan_combined, ssd_chunk_scan, ssd_scan_ref

FP32 = tolerance(torch.float32)
H, P, N, G = 4, 16, 16, 2


def make_inputs(batch=1, T=70, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        t = (torch.randn(*shape, generator=gen) * scale).to(DEVICE)
        return t.requires_grad_(requires_grad)

    return dict(x=rand(batch, T, H, P), dt=rand(batch, T, H), A=(-torch.rand(H, generator=gen) - 0.5).to(DEVICE),
                B=rand(batch, T, G, N, scale=0.5), C=rand(batch, T, G, N, scale=0.5), D=rand(H, P),
                z=rand(batch, T, H, P), dt_bias=rand(H, scale=0.5), h0=rand(batch, H, P, N, scale=0.5))


def offsets(*lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


def labels(cu):
    return torch.repeat_interleave(torch.arange(len(cu) - 1, device=DEVICE),
                                   (cu[1:] - cu[:-1]).long())[None].int()


def test_plain_call_is_ssd_chunk_scan():
    i = make_inputs(batch=2)
    y, final = mamba_chunk_scan_combined(i["x"], i["dt"], i["A"], i["B"], i["C"], 64, D=i["D"], z=i["z"],
                                         dt_bias=i["dt_bias"], initial_states=i["h0"], dt_softplus=True,
                                         return_final_states=True)
    y_ref, final_ref = ssd_chunk_scan(i["x"], i["dt"], i["A"], i["B"], i["C"], 64, D=i["D"], z=i["z"],
                                      dt_bias=i["dt_bias"], dt_softplus=True, initial_states=i["h0"],
                                      return_final_states=True)
    assert torch.equal(y, y_ref) and torch.equal(final, final_ref)
    # y alone without return_final_states, as mamba_ssm returns it
    y_alone = mamba_chunk_scan_combined(i["x"], i["dt"], i["A"], i["B"], i["C"], 64, D=i["D"], z=i["z"],
                                        dt_bias=i["dt_bias"], initial_states=i["h0"], dt_softplus=True)
    assert isinstance(y_alone, torch.Tensor) and torch.equal(y_alone, y_ref)


def test_default_dt_limit_clamps_a_raw_dt_at_zero():
    """Without the softplus, mamba_ssm's default dt_limit (0, inf) still clamps: a negative dt counts as 0."""
    i = make_inputs()
    y = mamba_chunk_scan_combined(i["x"], i["dt"], i["A"], i["B"], i["C"], 32, D=i["D"])
    y_ref = ssd_chunk_scan(i["x"], i["dt"].clamp(min=0), i["A"], i["B"], i["C"], 32, D=i["D"])
    assert (i["dt"] < 0).any() and torch.equal(y, y_ref)


@pytest.mark.parametrize("dt_softplus", [True, False])
def test_dt_limit_against_the_loop(dt_softplus):
    i = make_inputs(T=37)
    limit = (0.3, 1.1)
    y, final = mamba_chunk_scan_combined(i["x"], i["dt"], i["A"], i["B"], i["C"], 16, D=i["D"], z=i["z"],
                                         dt_bias=i["dt_bias"], dt_softplus=dt_softplus, dt_limit=limit,
                                         return_final_states=True)
    raw = i["dt"].double() + i["dt_bias"].double()
    dt = (torch.nn.functional.softplus(raw) if dt_softplus else raw).clamp(*limit)
    assert ((dt == limit[0]) | (dt == limit[1])).any(), "the clamp must bite for the test to mean anything"
    y_ref, final_ref = ssd_scan_ref(i["x"].double(), dt, i["A"].double(), i["B"].double(), i["C"].double(),
                                    D=i["D"].double(), z=i["z"].double(), return_final_states=True)
    assert_close(y, y_ref, FP32, "y")
    assert_close(final, final_ref, FP32, "final_states")


def packed_call(i, cu, seq_idx, **kw):
    return mamba_chunk_scan_combined(i["x"], i["dt"], i["A"], i["B"], i["C"], 64, D=i["D"], z=i["z"],
                                     dt_bias=i["dt_bias"], initial_states=i["h0"], seq_idx=seq_idx, cu_seqlens=cu,
                                     dt_softplus=True, **kw)


def packed_reference(i, cu):
    """ssd_chunk_scan on the same packed rows: the initial state is sequence 0's, the others start at 0."""
    h0 = torch.cat([i["h0"], i["h0"].new_zeros(len(cu) - 2, H, P, N)])
    return ssd_chunk_scan(i["x"], i["dt"], i["A"], i["B"], i["C"], 64, D=i["D"], z=i["z"], dt_bias=i["dt_bias"],
                          dt_softplus=True, initial_states=h0, return_final_states=True, cu_seqlens=cu)


def test_packed_call_with_seq_idx_and_cu_seqlens():
    cu = offsets(5, 40, 25)                                      # T = 70, boundaries inside chunks
    i = make_inputs()
    y_ref, states_ref = packed_reference(i, cu)
    y, final, varlen = packed_call(i, cu, labels(cu), return_final_states=True, return_varlen_states=True)
    assert torch.equal(y, y_ref)
    assert final.shape == (1, H, P, N) and torch.equal(final[0], states_ref[-1])      # the last sequence's
    assert varlen.dtype == i["C"].dtype and torch.equal(varlen, states_ref)
    y2, varlen2 = packed_call(i, cu, labels(cu), return_varlen_states=True, state_dtype=torch.float16)
    assert torch.equal(y2, y_ref) and varlen2.dtype == torch.float16
    # seq_idx alone says the same; cu_seqlens alone (without seq_idx) is not read, as in mamba_ssm
    assert torch.equal(packed_call(i, None, labels(cu)), y_ref)
    y_one = packed_call(i, cu, None)
    assert torch.equal(y_one, packed_call(i, None, None)) and not torch.equal(y_one, y_ref)


def test_packed_rows_of_a_batch():
    """batch 2, seq_idx numbering each row's sequences; row 1 starts at sequence 3 (its initial state unused)."""
    i = make_inputs(batch=2)
    cu0, cu1 = offsets(30, 40), offsets(10, 60)
    seq_idx = torch.cat([labels(cu0), labels(cu1) + 3])
    y, final = packed_call(i, None, seq_idx, return_final_states=True)
    row0 = {k: (v[:1] if v.dim() >= 3 else v) for k, v in i.items()}
    y0, states0 = packed_reference(row0, cu0)
    row1 = {k: (v[1:] if v.dim() >= 3 else v) for k, v in i.items()}
    y1, states1 = ssd_chunk_scan(row1["x"], row1["dt"], i["A"], row1["B"], row1["C"], 64, D=i["D"], z=row1["z"],
                                 dt_bias=i["dt_bias"], dt_softplus=True, return_final_states=True, cu_seqlens=cu1)
    assert torch.equal(y, torch.cat([y0, y1]))
    assert torch.equal(final, torch.stack([states0[-1], states1[-1]]))


def test_gradients_through_the_alias():
    cu = offsets(20, 50)
    names = ("x", "dt", "B", "C", "D", "z", "dt_bias", "h0")
    i = make_inputs(requires_grad=True)
    gen = torch.Generator().manual_seed(1)
    dy = torch.randn(1, 70, H, P, generator=gen).to(DEVICE)
    dh = torch.randn(1, H, P, N, generator=gen).to(DEVICE)
    y, final = packed_call(i, cu, labels(cu), return_final_states=True)
    grads = torch.autograd.grad((y * dy).sum() + (final * dh).sum(), [i[n] for n in names])
    y_ref, states_ref = packed_reference(i, cu)
    grads_ref = torch.autograd.grad((y_ref * dy).sum() + (states_ref[-1:] * dh).sum(), [i[n] for n in names])
    for name, g, g_ref in zip(names, grads, grads_ref, strict=True):
        assert g_ref.abs().max() > 0, name
        assert torch.equal(g, g_ref), name


def test_gradients_through_dt_limit():
    i = make_inputs(T=37, requires_grad=True)
    limit = (0.3, 1.1)
    y = mamba_chunk_scan_combined(i["x"], i["dt"], i["A"], i["B"], i["C"], 64, dt_bias=i["dt_bias"],
                                  dt_softplus=True, dt_limit=limit)
    ddt, dbias = torch.autograd.grad(y.square().sum(), [i["dt"], i["dt_bias"]])
    dt = torch.nn.functional.softplus(i["dt"] + i["dt_bias"])
    y_ref = ssd_chunk_scan(i["x"], dt.clamp(*limit), i["A"], i["B"], i["C"], 64)
    ddt_ref, dbias_ref = torch.autograd.grad(y_ref.square().sum(), [i["dt"], i["dt_bias"]])
    clamped = (dt < limit[0]) | (dt > limit[1])
    assert clamped.any() and (ddt[clamped] == 0).all()          # no gradient where the clamp holds dt
    assert_close(ddt, ddt_ref, FP32, "dt")
    assert_close(dbias, dbias_ref, FP32, "dt_bias")


@pytest.mark.parametrize("kwargs, match", [
    (dict(chunk_indices=torch.zeros(2)), "chunk_indices"),
    (dict(chunk_offsets=torch.zeros(2)), "chunk_offsets"),
    (dict(return_varlen_states=True, seq_idx="labels"), "cu_seqlens"),
    (dict(return_varlen_states=True, cu_seqlens="cu"), "seq_idx"),
    (dict(seq_idx="shifted", cu_seqlens="cu"), "seq_idx and cu_seqlens disagree"),
    (dict(seq_idx="decreasing"), "seq_idx must be non-decreasing"),
    (dict(dt_limit=(1.0, 0.5)), "dt_limit"),
    (dict(dt_limit=0.5), "dt_limit"),
])
def test_refusals(kwargs, match):
    i = make_inputs()
    cu = offsets(30, 40)
    given = {"labels": labels(cu), "cu": cu, "shifted": labels(offsets(31, 39)), "decreasing": labels(cu).flip(1)}
    kwargs = {k: given.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=match):
        mamba_chunk_scan_combined(i["x"], i["dt"], i["A"], i["B"], i["C"], 64, **kwargs)


def test_cu_seqlens_with_seq_idx_needs_batch_one():
    i = make_inputs(batch=2)
    cu = offsets(30, 40)
    with pytest.raises(ValueError, match="batch 1"):
        mamba_chunk_scan_combined(i["x"], i["dt"], i["A"], i["B"], i["C"], 64, seq_idx=labels(cu).expand(2, -1),
                                  cu_seqlens=cu)


def test_signature_follows_mamba_ssm():
    """mamba_ssm's positional order (seq_idx, cu_seqlens, dt_softplus, dt_limit, return_final_states, ...)."""
    import inspect
    params = list(inspect.signature(mamba_chunk_scan_combined).parameters)
    assert params[:17] == ["x", "dt", "A", "B", "C", "chunk_size", "D", "z", "dt_bias", "initial_states", "seq_idx",
                           "cu_seqlens", "dt_softplus", "dt_limit", "return_final_states", "return_varlen_states",
                           "state_dtype"]
    assert inspect.signature(mamba_chunk_scan_combined).parameters["dt_limit"].default == (0.0, math.inf)
