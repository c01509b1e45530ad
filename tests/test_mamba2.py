"""Mamba-2 (kernels.mamba2): the decode step (`selective_state_update`) against an fp64 step written
from the formula (MATH.md, Mamba-2) for every combination of the optional arguments, the state
updated in place (same storage, any strides, through a slot table), A as one scalar per head (the
stride-0 fast path) and as a full [nheads, headdim, dstate] tensor, groups, odd sizes, NaN kept in
its row; the SSD chunk scan against a step-by-step fp64 loop (T not a multiple of the chunk, initial
and final states, groups, D and z); the PyTorch chunked form; every kind of bad input.

CPU (interpreter): fp32 and fp16 on small shapes. GPU: bf16 at mamba_ssm's test shapes.
"""
import itertools

import pytest
import torch
import torch.nn.functional as F

from input_cases import Case, bad_input_cases, case_id, expect_refusal
from kernels.common import DEVICE, ON_GPU, assert_close, tolerance
from kernels.mamba2 import (mamba1_step, mamba2_step, selective_state_update, selective_state_update_ref,
                            ssd_chunk_scan, ssd_chunked_torch, ssd_scan_ref)
from kernels.mamba2 import decode as decode_module
from kernels.mamba2 import interface as interface_module
from kernels.mamba2.interface import a_is_scalar_per_head

FP32 = tolerance(torch.float32)


def ref_step(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """The step from the formula, in float64, written here without kernels.mamba2:
    dt = softplus(dt + dt_bias); h = exp(dt·A) h + dt·x ⊗ B; y = h·C + D·x; y ⊙ silu(z)."""
    d = lambda t: None if t is None else t.double()                      # noqa: E731
    state, x, dt, A, B, C, D, z, dt_bias = map(d, (state, x, dt, A, B, C, D, z, dt_bias))
    H, G = x.shape[1], B.shape[1]
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = torch.log1p(torch.exp(dt))
    h = torch.empty_like(state)
    y = torch.empty_like(x)
    for i in range(x.shape[0]):
        for hd in range(H):
            g = hd // (H // G)
            h[i, hd] = torch.exp(dt[i, hd, :, None] * A[hd]) * state[i, hd] \
                + (dt[i, hd] * x[i, hd])[:, None] * B[i, g][None, :]
            y[i, hd] = h[i, hd] @ C[i, g]
    if D is not None:
        y = y + D * x
    if z is not None:
        y = y * z * torch.sigmoid(z)
    return y, h


def make_step(b=2, H=4, P=48, N=60, G=2, dtype=torch.float32, a="scalar", device=DEVICE, slots=None):
    """Good step arguments. a: "scalar" (one A per head, stride-0 broadcast) or "full"."""
    g = torch.Generator().manual_seed(b * 1000 + H * 100 + P + N + G)
    r = lambda *s: torch.randn(*s, generator=g)                           # noqa: E731
    A_head = -torch.rand(H, generator=g) * 2 - 0.05
    A = A_head[:, None, None].expand(H, P, N) if a == "scalar" else -torch.rand(H, P, N, generator=g) * 2
    args = dict(state=r(b if slots is None else slots, H, P, N), x=r(b, H, P), dt=r(b, H, P) * 0.5 - 1,
                A=A, B=r(b, G, N), C=r(b, G, N), D=r(H, P), z=r(b, H, P), dt_bias=r(H, P) * 0.5)
    args = {k: v.to(device) for k, v in args.items()}
    for k in ("x", "B", "C", "z"):
        args[k] = args[k].to(dtype)
    return args


OPTIONAL = ("D", "z", "dt_bias", "dt_softplus")
COMBOS = list(itertools.product([False, True], repeat=4))


def _subset(args, combo):
    out = {k: v for k, v in args.items() if k not in ("D", "z", "dt_bias")}
    for name, on in zip(OPTIONAL[:3], combo[:3]):
        if on:
            out[name] = args[name]
    out["dt_softplus"] = combo[3]
    return out


# ------------------------------------------------------------------ the decode step
@pytest.mark.parametrize("a", ["scalar", "full"])
@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(n for n, on in zip(OPTIONAL, c) if on) or "plain")
def test_step_every_optional_argument(combo, a):
    args = _subset(make_step(a=a), combo)
    y_ref, h_ref = ref_step(**args)
    state = args["state"]
    ptr, before = state.data_ptr(), state.clone()
    y = selective_state_update(**args)
    assert y.shape == args["x"].shape and y.dtype == args["x"].dtype
    assert not torch.isnan(y).any() and not torch.isnan(state).any()
    assert state.data_ptr() == ptr and not torch.equal(state, before)      # updated where it lies
    assert_close(y, y_ref, FP32, "y")
    assert_close(state, h_ref, FP32, "state")


@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1), (3, 4, 48, 60, 1), (2, 4, 64, 16, 4), (2, 6, 33, 128, 3),
                                   (1, 2, 16, 256, 2)], ids=lambda s: "b{}-H{}-P{}-N{}-G{}".format(*s))
def test_step_shapes_and_groups(shape):
    b, H, P, N, G = shape
    args = make_step(b, H, P, N, G)
    y_ref, h_ref = ref_step(**args, dt_softplus=True)
    y = selective_state_update(**args, dt_softplus=True)
    assert_close(y, y_ref, FP32, "y")
    assert_close(args["state"], h_ref, FP32, "state")


def test_step_fp16_inputs():
    args = make_step(dtype=torch.float16)
    y_ref, h_ref = ref_step(**args, dt_softplus=True)
    y = selective_state_update(**args, dt_softplus=True)
    assert y.dtype == torch.float16
    assert_close(y, y_ref, tolerance(torch.float16), "y")
    assert_close(args["state"], h_ref, FP32, "state")     # fp32 state, fp16 inputs read exactly


def test_groups_share_B_and_C():
    """ngroups < nheads: heads of one group read the same B and C; changing group 1's B changes only
    the heads of group 1 (H = 6, G = 3: heads 2 and 3)."""
    args = make_step(b=1, H=6, P=16, N=32, G=3)
    y = selective_state_update(**{**args, "state": args["state"].clone()})
    B2 = args["B"].clone()
    B2[:, 1] += 1.0
    y2 = selective_state_update(**{**args, "state": args["state"].clone(), "B": B2})
    changed = (y2 - y).abs().amax(dim=(0, 2)) > 0
    assert changed.tolist() == [False, False, True, True, False, False]


def test_a_fast_path_is_taken_and_agrees(monkeypatch):
    """A broadcast from [nheads] with stride 0 sets the kernel's A_SCALAR; the same numbers held as a
    full tensor take the general path; both give the formula's result."""
    seen = []
    launch = decode_module.selective_state_update_fwd

    def spy(*a, **k):
        seen.append(a[-1])
        return launch(*a, **k)

    monkeypatch.setattr(interface_module, "selective_state_update_fwd", spy)
    args = make_step(a="scalar")
    assert args["A"].stride() == (1, 0, 0) and a_is_scalar_per_head(args["A"])
    y_ref, h_ref = ref_step(**args, dt_softplus=True)
    st = args["state"].clone()
    y_fast = selective_state_update(**{**args, "state": st}, dt_softplus=True)
    st_full = args["state"].clone()
    y_full = selective_state_update(**{**args, "state": st_full, "A": args["A"].contiguous()}, dt_softplus=True)
    assert seen == [True, False]
    for y, s, name in ((y_fast, st, "fast"), (y_full, st_full, "full")):
        assert_close(y, y_ref, FP32, f"{name} y")
        assert_close(s, h_ref, FP32, f"{name} state")


def test_a_broadcast_on_one_axis_takes_the_general_path():
    """A varying along dstate but broadcast along headdim (stride 0 on one axis only) is not one
    scalar per head: the general path, still right."""
    H, P, N = 4, 48, 60
    A = (-torch.rand(H, 1, N) - 0.1).expand(H, P, N).to(DEVICE)
    assert not a_is_scalar_per_head(A)
    args = {**make_step(), "A": A}
    y_ref, h_ref = ref_step(**args)
    y = selective_state_update(**args)
    assert_close(y, y_ref, FP32, "y")
    assert_close(args["state"], h_ref, FP32, "state")


def test_state_with_strides_updated_in_place():
    """A state that is a view into a larger buffer (every stride non-default) is updated where it lies:
    the kernel takes its strides, and no copy is written back."""
    args = make_step(b=2, H=4, P=16, N=32, G=2)
    big = torch.randn(3, 5, 18, 70, device=DEVICE)
    view = big[1:3, :4, 1:17, 5:5 + 64:2]
    assert view.shape == (2, 4, 16, 32) and not view.is_contiguous()
    view.copy_(args["state"])
    outside = big.clone()
    y_ref, h_ref = ref_step(**args, dt_softplus=True)
    y = selective_state_update(**{**args, "state": view}, dt_softplus=True)
    assert_close(y, y_ref, FP32, "y")
    assert_close(view, h_ref, FP32, "state (the view)")
    mask = torch.ones_like(big, dtype=torch.bool)
    mask[1:3, :4, 1:17, 5:5 + 64:2] = False
    assert torch.equal(big[mask], outside[mask]), "the kernel wrote outside the state's elements"


def test_slot_table():
    """state_batch_indices: batch row i updates slot idx[i] of a [slots, ...] cache; other slots keep
    their values, NaN included (a NaN in an unused slot stays there)."""
    args = make_step(b=3, H=4, P=16, N=32, G=2, slots=6)
    idx = torch.tensor([4, 0, 2], device=DEVICE, dtype=torch.int32)
    args["state"][5] = float("nan")
    cache = args["state"]
    before = cache.clone()
    y_ref, h_ref = ref_step(**{**args, "state": cache[idx.long()]}, dt_softplus=True)
    y = selective_state_update(**args, dt_softplus=True, state_batch_indices=idx)
    assert_close(y, y_ref, FP32, "y")
    assert_close(cache[idx.long()], h_ref, FP32, "the rows' slots")
    for s in (1, 3, 5):
        assert torch.equal(cache[s].nan_to_num(), before[s].nan_to_num()) and cache[5].isnan().all()
    # int64 indices and the in-place reference agree
    args2 = make_step(b=3, H=4, P=16, N=32, G=2, slots=6)
    ref_cache = args2["state"].clone()
    y_r = selective_state_update_ref(**{**args2, "state": ref_cache}, state_batch_indices=idx.long())
    y_k = selective_state_update(**args2, state_batch_indices=idx.long())
    assert_close(y_k, y_r, FP32, "y (int64 table)")
    assert_close(args2["state"], ref_cache, FP32, "cache (int64 table)")


def test_nan_stays_in_its_row():
    """A NaN in one batch row's x or state reaches that row's output and nothing else."""
    args = make_step(b=3, H=4, P=16, N=32, G=2)
    args["x"][1, 2, 3] = float("nan")
    args["state"][2, 0, 0, 0] = float("nan")
    y = selective_state_update(**args, dt_softplus=True)
    assert torch.isfinite(y[0]).all() and torch.isfinite(args["state"][0]).all()
    assert y[1, 2, 3].isnan() and torch.isfinite(y[1, [0, 1, 3]]).all()
    assert y[2, 0, 0].isnan() and torch.isfinite(y[2, 1:]).all()


def test_steps_continue_a_prefill():
    """ssd_chunk_scan over 70 tokens, then 5 decode steps from its final state = the loop over 75."""
    Bt, T, H, P, N, G = 1, 75, 4, 16, 32, 2
    x, dt, A, B, C, D, z, bias = make_scan(Bt, T, H, P, N, G)
    y_all, h_all = ssd_scan_ref(*(t.double() for t in (x, dt, A, B, C)), D=D.double(), z=z.double(),
                                dt_bias=bias.double(), dt_softplus=True, return_final_states=True)
    _, h = ssd_chunk_scan(x[:, :70], dt[:, :70], A, B[:, :70], C[:, :70], D=D, z=z[:, :70], dt_bias=bias,
                          dt_softplus=True, return_final_states=True)
    for t in range(70, T):
        y = selective_state_update(h, x[:, t], dt[:, t, :, None].expand(Bt, H, P), A[:, None, None].expand(H, P, N),
                                   B[:, t], C[:, t], D=D, z=z[:, t], dt_bias=bias[:, None].expand(H, P),
                                   dt_softplus=True)
        assert_close(y, y_all[:, t], FP32, f"y at step {t}")
    assert_close(h, h_all, FP32, "state")


def test_references():
    """The PyTorch step (pure and in place) against the loop written here, in fp64; Mamba-1's step
    against its formula."""
    args = {k: (v.double() if v.is_floating_point() else v) for k, v in make_step().items()}
    y_ref, h_ref = ref_step(**args, dt_softplus=True)
    y, h = mamba2_step(**args, dt_softplus=True)
    assert y.dtype == h.dtype == torch.float64
    assert_close(y, y_ref, 1e-12, "y")
    assert_close(h, h_ref, 1e-12, "state")
    st = args["state"].clone()
    assert_close(selective_state_update_ref(**{**args, "state": st}, dt_softplus=True), y_ref, 1e-12, "y in place")
    assert_close(st, h_ref, 1e-12, "state in place")
    # Mamba-1: A per (channel, state), no heads
    b, Dm, N = 2, 8, 4
    s, x, dt, A, Bm, Cm = (torch.randn(b, Dm, N), torch.randn(b, Dm), torch.rand(b, Dm), -torch.rand(Dm, N),
                           torch.randn(b, N), torch.randn(b, N))
    y1, h1 = mamba1_step(s, x, dt, A, Bm, Cm)
    h_exp = torch.exp(dt[..., None] * A) * s + dt[..., None] * x[..., None] * Bm[:, None]
    assert_close(h1, h_exp, 1e-6, "mamba1 state")
    assert_close(y1, torch.einsum("bdn,bn->bd", h_exp, Cm), 1e-6, "mamba1 y")


# ------------------------------------------------------------------ bad input: the step
def _step_good():
    return make_step(b=2, H=4, P=8, N=16, G=2)


def _with(**changes):
    def mutate(args):
        for k, f in changes.items():
            args[k] = f(args)
    return mutate


STEP_TENSORS = ["state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias"]
STEP_CASES = [
    Case("state-shape", _with(state=lambda a: a["state"][:, :, :, :8]), ValueError, r"state must be \["),
    Case("state-batch", _with(state=lambda a: a["state"][:1]), ValueError, r"state must be \[b, nheads"),
    Case("dt-shape", _with(dt=lambda a: a["dt"][:, :, :4]), ValueError, r"dt must be \[b, nheads, headdim\]"),
    Case("A-shape", _with(A=lambda a: a["A"][:2]), ValueError, r"A must be \[nheads, headdim, dstate\]"),
    Case("B-dstate", _with(B=lambda a: a["B"][..., :8]), ValueError, r"B must be \[b, ngroups, dstate\]"),
    Case("C-groups", _with(C=lambda a: a["C"][:, :1]), ValueError, r"C must be \[b, ngroups, dstate\]"),
    Case("groups-divide", _with(B=lambda a: torch.randn(2, 3, 16), C=lambda a: torch.randn(2, 3, 16)),
         ValueError, "3 groups, which must divide nheads"),
    Case("D-shape", _with(D=lambda a: a["D"][0]), ValueError, "D must have 2 dims"),
    Case("dt_bias-shape", _with(dt_bias=lambda a: a["dt_bias"][:, :3]), ValueError, r"dt_bias must be \[nheads"),
    Case("z-shape", _with(z=lambda a: a["z"][:1]), ValueError, r"z must be \[b, nheads, headdim\]"),
    Case("x-empty", _with(x=lambda a: a["x"][:0]), ValueError, r"x must have every size"),
    Case("z-dtype-differs", _with(z=lambda a: a["z"].half()), TypeError, "must share one dtype"),
    Case("dt_softplus-int", _with(dt_softplus=lambda a: 1), TypeError, "dt_softplus must be a bool"),
    Case("slots-float", _with(state_batch_indices=lambda a: torch.zeros(2)), TypeError,
         "state_batch_indices has dtype float32"),
    Case("slots-shape", _with(state_batch_indices=lambda a: torch.zeros(3, dtype=torch.int32)), ValueError,
         r"state_batch_indices must be \[b\]"),
    Case("slots-out-of-range", _with(state_batch_indices=lambda a: torch.tensor([0, 2], dtype=torch.int32)),
         ValueError, r"state_batch_indices must lie in \[0, 1\]"),
    Case("slots-negative", _with(state_batch_indices=lambda a: torch.tensor([-1, 0])), ValueError,
         "state_batch_indices must lie in"),
]
KERNEL_STEP_CASES = [
    Case("dstate-too-big", _with(state=lambda a: torch.randn(2, 4, 8, 512), A=lambda a: torch.randn(4, 8, 512),
                                 B=lambda a: torch.randn(2, 2, 512), C=lambda a: torch.randn(2, 2, 512)),
         ValueError, "dstate <= 256"),
]


@pytest.mark.parametrize("case", bad_input_cases(STEP_TENSORS) + STEP_CASES + KERNEL_STEP_CASES, ids=case_id)
def test_step_refuses(case):
    expect_refusal(selective_state_update, _step_good, case)


@pytest.mark.parametrize("case", bad_input_cases(STEP_TENSORS, kernel=False) + STEP_CASES, ids=case_id)
def test_step_reference_refuses(case):
    expect_refusal(mamba2_step if case.id[:5] != "slots" else selective_state_update_ref, _step_good, case)
