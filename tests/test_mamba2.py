"""Mamba-2 (attention_kernels.mamba2): the decode step (`selective_state_update`) against an fp64 step written
from the formula (MATH.md, Mamba-2) for every combination of the optional arguments, the state
updated in place (same storage, any strides, through a slot table), A as one scalar per head (the
stride-0 fast path) and as a full [nheads, headdim, dstate] tensor, groups, odd sizes, NaN kept in
its row, slot tables of any strides; the SSD chunk scan against a step-by-step fp64 loop (T not a
multiple of the chunk, every chunk length from 16 to 256, initial and final states, groups, D and z,
a strided dt, gates of either sign); its gates kernel (dt's bias and softplus, the cumulative decay)
against PyTorch; the PyTorch chunked form; every kind of bad input, and the checks' verdicts
remembered per call signature.

CPU (interpreter): fp32 and fp16 on small shapes. GPU: bf16 at mamba_ssm's test shapes, and the scan
with each config of its output kernel and of the state pass forced one at a time.
"""
import contextlib
import itertools
import math

import pytest
import torch
import triton

from input_cases import Case, bad_input_cases, case_id, expect_refusal
from attention_kernels.common import DEVICE, INTERPRET, ON_GPU, assert_close, tolerance
from attention_kernels.mamba2 import (mamba1_step, mamba2_step, selective_state_update, selective_state_update_ref,
                            ssd_chunk_scan, ssd_chunked_torch, ssd_scan_ref)
from attention_kernels.launch import pow2_at_least_16
from attention_kernels.linear.chunk import CHUNK, GATE_FLOOR
from attention_kernels.mamba2 import chunk as chunk_module
from attention_kernels.mamba2 import decode as decode_module
from attention_kernels.mamba2 import interface as interface_module
from attention_kernels.mamba2 import inputs as inputs_module
from attention_kernels.mamba2.interface import a_is_scalar_per_head

FP32 = tolerance(torch.float32)


def ref_step(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    """The step from the formula, in float64, written here without attention_kernels.mamba2:
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
    A = -torch.rand(H, generator=g) * 2 - 0.05 if a == "scalar" else -torch.rand(H, P, N, generator=g) * 2
    args = dict(state=r(b if slots is None else slots, H, P, N), x=r(b, H, P), dt=r(b, H, P) * 0.5 - 1,
                A=A, B=r(b, G, N), C=r(b, G, N), D=r(H, P), z=r(b, H, P), dt_bias=r(H, P) * 0.5)
    args = {k: v.to(device) for k, v in args.items()}
    if a == "scalar":           # broadcast on the device: .to() of a stride-0 view would materialise it
        args["A"] = args["A"][:, None, None].expand(H, P, N)
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
    A = (-torch.rand(H, 1, N, device=DEVICE) - 0.1).expand(H, P, N)
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


def step_through_slots(args, idx):
    """One step through the slot table idx (batch row i updates slot idx[i] of args["state"]): y and the
    rows' slots against the formula. Returns the cache as it was before, for the caller's other slots."""
    cache = args["state"]
    before = cache.clone()
    y_ref, h_ref = ref_step(**{**args, "state": cache[idx.long()]}, dt_softplus=True)
    y = selective_state_update(**args, dt_softplus=True, state_batch_indices=idx)
    assert_close(y, y_ref, FP32, "y")
    assert_close(cache[idx.long()], h_ref, FP32, "the rows' slots")
    return before


def test_slot_table():
    """state_batch_indices: batch row i updates slot idx[i] of a [slots, ...] cache; other slots keep
    their values, NaN included (a NaN in an unused slot stays there)."""
    args = make_step(b=3, H=4, P=16, N=32, G=2, slots=6)
    idx = torch.tensor([4, 0, 2], device=DEVICE, dtype=torch.int32)
    args["state"][5] = float("nan")
    cache, before = args["state"], step_through_slots(args, idx)
    for s in (1, 3, 5):
        assert torch.equal(cache[s].nan_to_num(), before[s].nan_to_num()) and cache[5].isnan().all()
    # int64 indices and the in-place reference agree
    args2 = make_step(b=3, H=4, P=16, N=32, G=2, slots=6)
    ref_cache = args2["state"].clone()
    y_r = selective_state_update_ref(**{**args2, "state": ref_cache}, state_batch_indices=idx.long())
    y_k = selective_state_update(**args2, state_batch_indices=idx.long())
    assert_close(y_k, y_r, FP32, "y (int64 table)")
    assert_close(args2["state"], ref_cache, FP32, "cache (int64 table)")


@pytest.mark.parametrize("fn", [selective_state_update, selective_state_update_ref], ids=lambda f: f.__name__)
def test_strided_slot_table_writes_only_its_slots(fn):
    """A slot table that is a strided view (values 4, 0 of [4, 9, 0, 9]) over a state that is the first
    5 slots of a larger cache: slots 4 and 0 are updated, and nothing else in the cache is written
    (slot 9, outside the view, included)."""
    args = make_step(b=2, H=4, P=16, N=32, G=2, slots=10)
    big = args["state"]
    idx = torch.tensor([4, 9, 0, 9], dtype=torch.int32, device=DEVICE)[::2]
    assert not idx.is_contiguous() and idx.tolist() == [4, 0]
    before = big.clone()
    y_ref, h_ref = ref_step(**{**args, "state": big[idx.long()]}, dt_softplus=True)
    y = fn(**{**args, "state": big[:5]}, dt_softplus=True, state_batch_indices=idx)
    assert_close(y, y_ref, FP32, "y")
    assert_close(big[idx.long()], h_ref, FP32, "the rows' slots")
    untouched = [s for s in range(10) if s not in (4, 0)]
    assert torch.equal(big[untouched], before[untouched]), "a slot outside the table was written"


@pytest.mark.parametrize("tiles", [(4, 16, 1), (8, 16, 1), (16, 32, 4)], ids=lambda t: "BM{}".format(t[0]))
def test_step_tiles(monkeypatch, tiles):
    """Whatever the tile (BM rows, dstate padded to BN), with tiles short of BM rows (P = 6) and a dstate short of
    BN (N = 9): the formula's result, the slots of the slot table updated and no other."""
    monkeypatch.setattr(decode_module, "step_tiles", lambda P, N: tiles)
    args = make_step(b=3, H=5, P=6, N=9, G=5, slots=7)
    idx = torch.tensor([6, 0, 3], device=DEVICE, dtype=torch.int32)
    cache, before = args["state"], step_through_slots(args, idx)
    for s in (1, 2, 4, 5):
        assert torch.equal(cache[s], before[s])


@pytest.mark.parametrize("tiles", [(4, 16, 1), (8, 16, 1)], ids=["BM4", "BM8"])
def test_step_whole_tiles_and_tied_headdim(monkeypatch, tiles):
    """A model's case: dt, dt_bias and D hold one number per head, broadcast over headdim with stride 0 as A
    is, so the kernel reads them as numbers (TIE_HDIM); every tile is whole and its rows lie back to back, so
    it computes no masks for the state (EVEN). The formula's result, and both flags taken."""
    monkeypatch.setattr(decode_module, "step_tiles", lambda P, N: tiles)
    flags = {}
    launch = decode_module.launch

    def spy(*a, **constexprs):
        flags.update(constexprs)
        return launch(*a, **constexprs)

    monkeypatch.setattr(decode_module, "launch", spy)
    args = make_step(b=2, H=4, P=16, N=16, G=2)
    for name in ("dt", "dt_bias", "D"):
        args[name] = args[name][..., :1].expand_as(args[name])
    y_ref, h_ref = ref_step(**args, dt_softplus=True)
    state = args["state"].clone()
    y = selective_state_update(**{**args, "state": state}, dt_softplus=True)
    assert flags["TIE_HDIM"] and flags["EVEN"]
    assert_close(y, y_ref, FP32, "y")
    assert_close(state, h_ref, FP32, "state")


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
    Case("A-per-head-unbroadcast", _with(A=lambda a: a["A"][:, :1, :1]), ValueError,
         r"A must be \[nheads, headdim, dstate\] = \[4, 8, 16\], got \[4, 1, 1\]"),
    Case("B-dstate", _with(B=lambda a: a["B"][..., :8]), ValueError, r"B must be \[b, ngroups, dstate\]"),
    Case("C-groups", _with(C=lambda a: a["C"][:, :1]), ValueError, r"C must be \[b, ngroups, dstate\]"),
    Case("groups-divide", _with(B=lambda a: torch.randn(2, 3, 16, device=DEVICE),
                                C=lambda a: torch.randn(2, 3, 16, device=DEVICE)),
         ValueError, "3 groups, which must divide nheads"),
    Case("D-shape", _with(D=lambda a: a["D"][0]), ValueError, "D must have 2 dims"),
    Case("dt_bias-shape", _with(dt_bias=lambda a: a["dt_bias"][:, :3]), ValueError, r"dt_bias must be \[nheads"),
    Case("z-shape", _with(z=lambda a: a["z"][:1]), ValueError, r"z must be \[b, nheads, headdim\]"),
    Case("x-empty", _with(x=lambda a: a["x"][:0]), ValueError, r"x must have every size"),
    Case("z-dtype-differs", _with(z=lambda a: a["z"].half()), TypeError, "must share one dtype"),
    Case("dt_softplus-int", _with(dt_softplus=lambda a: 1), TypeError, "dt_softplus must be a bool"),
    Case("slots-float", _with(state_batch_indices=lambda a: torch.zeros(2, device=DEVICE)),
         TypeError,
         "state_batch_indices has dtype float32"),
    Case("slots-shape", _with(state_batch_indices=lambda a: torch.zeros(3, dtype=torch.int32, device=DEVICE)),
         ValueError,
         r"state_batch_indices must be \[b\]"),
] + ([] if ON_GPU else [        # the values are read on the CPU only (interface.py says why)
    Case("slots-out-of-range", _with(state_batch_indices=lambda a: torch.tensor([0, 2], dtype=torch.int32)),
         ValueError, r"state_batch_indices must lie in \[0, 1\]"),
    Case("slots-negative", _with(state_batch_indices=lambda a: torch.tensor([-1, 0])), ValueError,
         "state_batch_indices must lie in"),
])
KERNEL_STEP_CASES = [
    Case("dstate-too-big", _with(state=lambda a: torch.randn(2, 4, 8, 512, device=DEVICE),
                                 A=lambda a: torch.randn(4, 8, 512, device=DEVICE),
                                 B=lambda a: torch.randn(2, 2, 512, device=DEVICE),
                                 C=lambda a: torch.randn(2, 2, 512, device=DEVICE)),
         ValueError, "dstate <= 256"),
]


@pytest.mark.parametrize("case", bad_input_cases(STEP_TENSORS) + STEP_CASES + KERNEL_STEP_CASES, ids=case_id)
def test_step_refuses(case):
    expect_refusal(selective_state_update, _step_good, case)


@pytest.mark.parametrize("case", bad_input_cases(STEP_TENSORS, kernel=False) + STEP_CASES, ids=case_id)
def test_step_reference_refuses(case):
    expect_refusal(mamba2_step if case.id[:5] != "slots" else selective_state_update_ref, _step_good, case)


IN_PLACE_CASES = [
    Case("state-expanded", _with(state=lambda a: a["state"][:1].expand_as(a["state"])), ValueError,
         "state is updated in place and must not be expanded: stride 0 on dim 0"),
    Case("state-expanded-headdim", _with(state=lambda a: a["state"][:, :, :1].expand_as(a["state"])), ValueError,
         "stride 0 on dim 2"),
] + ([] if ON_GPU else [        # the values are read on the CPU only (interface.py says why)
    Case("slots-twice", _with(state_batch_indices=lambda a: torch.tensor([1, 1], dtype=torch.int32)), ValueError,
         "state_batch_indices holds slot 1 more than once"),
])


@pytest.mark.parametrize("fn", [selective_state_update, selective_state_update_ref], ids=lambda f: f.__name__)
@pytest.mark.parametrize("case", IN_PLACE_CASES, ids=case_id)
def test_in_place_without_a_defined_result_refused(case, fn):
    """The forms that update the state in place refuse a state whose elements share memory (a broadcast,
    stride 0) and, on the CPU, a slot table that names a slot twice: either update has no defined
    result. The pure step takes a broadcast state (it writes none)."""
    expect_refusal(fn, _step_good, case)
    if case.id.startswith("state"):
        args = _step_good()
        case.mutate(args)
        y, _ = mamba2_step(**args)
        y_ref, _ = ref_step(**args)
        assert_close(y, y_ref, FP32, "the pure step on a broadcast state")


# ------------------------------------------------------------------ the SSD chunk scan
def make_scan(Bt=2, T=70, H=4, P=16, N=32, G=2, dtype=torch.float32, device=DEVICE, D_per_channel=True):
    """Good scan arguments: x, dt, A, B, C, D, z, dt_bias (dt around softplus(-1) ≈ 0.3, A in [-2, -0.05])."""
    g = torch.Generator().manual_seed(Bt * 7 + T * 5 + H * 3 + P + N + G)
    r = lambda *s: torch.randn(*s, generator=g)                           # noqa: E731
    x, z = r(Bt, T, H, P), r(Bt, T, H, P)
    dt = r(Bt, T, H) * 0.5 - 1
    A = -torch.rand(H, generator=g) * 2 - 0.05
    B, C = r(Bt, T, G, N), r(Bt, T, G, N)
    D = r(H, P) if D_per_channel else r(H)
    bias = r(H) * 0.5
    out = [x.to(dtype), dt, A, B.to(dtype), C.to(dtype), D, z.to(dtype), bias]
    return [t.to(device) for t in out]


def scan_ref64(x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, h0=None):
    """The loop over tokens, written here from the formula, in float64: returns (y, final state)."""
    d = lambda t: None if t is None else t.double()                      # noqa: E731
    x, dt, A, B, C, D, z, dt_bias, h0 = map(d, (x, dt, A, B, C, D, z, dt_bias, h0))
    Bt, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = torch.log1p(torch.exp(dt))
    Bh, Ch = B.repeat_interleave(H // G, dim=2), C.repeat_interleave(H // G, dim=2)
    h = torch.zeros(Bt, H, P, N, dtype=torch.float64, device=x.device) if h0 is None else h0.clone()
    y = torch.empty_like(x)
    for t in range(T):
        h = torch.exp(dt[:, t] * A)[..., None, None] * h \
            + (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        y[:, t] = (h * Ch[:, t, :, None, :]).sum(-1)
    if D is not None:
        y = y + x * (D if D.dim() == 2 else D[:, None])
    if z is not None:
        y = y * z * torch.sigmoid(z)
    return y, h


@pytest.mark.parametrize("T", [1, 63, 64, 65, 130])
def test_scan_lengths_initial_and_final_states(T):
    x, dt, A, B, C, D, z, bias = make_scan(T=T)
    h0 = torch.randn(2, 4, 16, 32, device=DEVICE)
    y_ref, h_ref = scan_ref64(x, dt, A, B, C, D, z, bias, True, h0)
    y, h = ssd_chunk_scan(x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True, initial_states=h0,
                          return_final_states=True)
    assert y.shape == x.shape and h.shape == h0.shape and h.dtype == torch.float32
    assert not torch.isnan(y).any()
    assert_close(y, y_ref, FP32, "y")
    assert_close(h, h_ref, FP32, "final state")


CHUNK_SIZES = [16, 32, 64, 128, 256]


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES, ids=lambda L: f"chunk{L}")
def test_scan_chunk_sizes(chunk_size):
    """Every chunk length against the fp64 loop, at T = 300: a whole chunk of 256 and a partial one
    (of 44 tokens), several chunks at the shorter lengths; initial and final states, groups, D, z."""
    Bt, T, H, P, N, G = 1, 300, 4, 16, 32, 2
    x, dt, A, B, C, D, z, bias = make_scan(Bt, T, H, P, N, G)
    h0 = torch.randn(Bt, H, P, N, device=DEVICE)
    y_ref, h_ref = scan_ref64(x, dt, A, B, C, D, z, bias, True, h0)
    y, h = ssd_chunk_scan(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=bias, dt_softplus=True,
                          initial_states=h0, return_final_states=True)
    assert not torch.isnan(y).any()
    assert_close(y, y_ref, FP32, "y")
    assert_close(h, h_ref, FP32, "final state")


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES, ids=lambda L: f"chunk{L}")
def test_training_forward_stores_the_ungated_output(chunk_size):
    """The training forward with z (the op that keeps the output before the gate for the backward): y as the
    plain forward gives it, and beside it o + D ⊙ x, the fp64 loop's output without z, at every chunk length
    (T = 300, two batch rows)."""
    Bt, T, H, P, N, G = 2, 300, 4, 16, 32, 2
    x, dt, A, B, C, D, z, bias = make_scan(Bt, T, H, P, N, G)
    args = (x, dt, A, B, C, chunk_size, D, z, bias, True, None, False, None)
    y, y_ungated, final = interface_module._ssd_chunk_scan_fwd_keeping_ungated(*args)
    assert final is None and y_ungated.dtype == x.dtype and y_ungated.shape == x.shape
    assert torch.equal(y, interface_module._ssd_chunk_scan_fwd(*args)[0])
    assert_close(y_ungated, scan_ref64(x, dt, A, B, C, D, None, bias, True)[0], FP32, "y_ungated")


@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(n for n, on in zip(OPTIONAL, c) if on) or "plain")
def test_scan_every_optional_argument(combo):
    x, dt, A, B, C, D, z, bias = make_scan(T=67, D_per_channel=combo[0] and combo[1])
    # without the softplus, dt + dt_bias must be >= 0 by itself (the decay e^{dt·A} <= 1)
    bias = bias if combo[3] else bias.abs()
    kw = {n: t for n, t, on in zip(("D", "z", "dt_bias"), (D, z, bias), combo) if on}
    dtr = dt if combo[3] else dt.abs() * 0.3
    y_ref, _ = scan_ref64(x, dtr, A, B, C, dt_softplus=combo[3], **kw)
    y = ssd_chunk_scan(x, dtr, A, B, C, dt_softplus=combo[3], **kw)
    assert isinstance(y, torch.Tensor)
    assert_close(y, y_ref, FP32, "y")


@pytest.mark.parametrize("shape", [(1, 100, 4, 16, 32, 1), (1, 100, 4, 16, 32, 4), (2, 77, 6, 48, 60, 3),
                                   (1, 65, 2, 64, 128, 2), (1, 20, 1, 1, 1, 1)],
                         ids=lambda s: "B{}-T{}-H{}-P{}-N{}-G{}".format(*s))
def test_scan_shapes_and_groups(shape):
    x, dt, A, B, C, D, z, bias = make_scan(*shape)
    h0 = torch.randn(shape[0], shape[2], shape[3], shape[4], device=DEVICE)
    y_ref, h_ref = scan_ref64(x, dt, A, B, C, D, z, bias, True, h0)
    y, h = ssd_chunk_scan(x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True, initial_states=h0,
                          return_final_states=True)
    assert_close(y, y_ref, FP32, "y")
    assert_close(h, h_ref, FP32, "final state")


def test_scan_fp16():
    x, dt, A, B, C, D, z, bias = make_scan(T=130, dtype=torch.float16)
    y_ref, h_ref = scan_ref64(x, dt, A, B, C, D, z, bias, True)
    y, h = ssd_chunk_scan(x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True, return_final_states=True)
    assert y.dtype == torch.float16 and not torch.isnan(y).any()
    assert_close(y, y_ref, tolerance(torch.float16), "y")
    assert_close(h, h_ref, tolerance(torch.float16), "final state")


def test_scan_nan_stays_after_its_token():
    """A NaN in token 70's x reaches rows >= 70 of its head (through the state) and no earlier row,
    nor another head."""
    x, dt, A, B, C, D, z, bias = make_scan(Bt=1, T=130, H=4)
    x[0, 70, 1, 3] = float("nan")
    y = ssd_chunk_scan(x, dt, A, B, C, dt_bias=bias, dt_softplus=True)
    assert torch.isfinite(y[:, :70]).all() and torch.isfinite(y[:, :, [0, 2, 3]]).all()
    assert y[0, 70:, 1].isnan().any(dim=-1).all()


def test_scan_strong_decay_forgets():
    """dt·A ≈ -40 per token: the state forgets within a token, so the output at t depends on token t
    alone (y_t = (C_t·B_t) dt_t x_t), in every chunk."""
    x, dt, A, B, C, _, _, _ = make_scan(Bt=1, T=100, H=2, G=1)
    dt = torch.full_like(dt, 20.0)
    A = torch.full_like(A, -2.0)
    y = ssd_chunk_scan(x, dt, A, B, C, initial_states=torch.randn(1, 2, 16, 32, device=DEVICE) * 1e3)
    cb = (C[0, :, 0] * B[0, :, 0]).sum(-1)                                 # [T]
    assert_close(y[0], cb[:, None, None] * 20.0 * x[0], FP32, "y")


def test_torch_forms_agree():
    """The PyTorch chunked form (any chunk size) and the token loop equal the loop written here."""
    x, dt, A, B, C, D, z, bias = (t.double() for t in make_scan(T=70, D_per_channel=False))
    h0 = torch.randn(2, 4, 16, 32, dtype=torch.float64, device=x.device)
    y_ref, h_ref = scan_ref64(x, dt, A, B, C, D, z, bias, True, h0)
    for fn, L in ((ssd_scan_ref, 64), (ssd_chunked_torch, 16), (ssd_chunked_torch, 64)):
        y, h = fn(x, dt, A, B, C, chunk_size=L, D=D, z=z, dt_bias=bias, dt_softplus=True, initial_states=h0,
                  return_final_states=True)
        assert_close(y, y_ref, 1e-12, f"{fn.__name__}({L}) y")
        assert_close(h, h_ref, 1e-12, f"{fn.__name__}({L}) state")


def growing_inputs(kind, x, dt, A, bias):
    """Gates dt·A > 0 for some tokens, as a caller's mistake makes them. "A_log-as-A": A = log(-A) in
    [-3, 0.72], both signs, with the softplus; "negative-dt": dt + dt_bias about -1 without the
    softplus, A a tenth of a model's, so that the state grows by about e^13 over 130 tokens (within
    fp32). Returns dt, A, dt_bias, dt_softplus."""
    if kind == "A_log-as-A":
        return dt, torch.log(-A), bias, True
    return -dt.abs(), A * 0.1, -bias.abs() * 0.1, False


@pytest.mark.parametrize("kind", ["A_log-as-A", "negative-dt"])
def test_growing_gates_every_form(kind):
    """No form clamps a gate: with dt·A > 0 the scan (its intra-chunk decay included), the step, the
    in-place step and the PyTorch forms all compute the recurrence, as the fp64 loop does."""
    Bt, T, H, P, N, G = 1, 130, 4, 16, 32, 2
    x, dt, A, B, C, D, z, bias = make_scan(Bt, T, H, P, N, G)
    dt, A, bias, softplus = growing_inputs(kind, x, dt, A, bias)
    h0 = torch.randn(Bt, H, P, N, device=DEVICE)
    y_ref, h_ref = scan_ref64(x, dt, A, B, C, D, z, bias, softplus, h0)
    kw = dict(D=D, z=z, dt_bias=bias, dt_softplus=softplus, initial_states=h0, return_final_states=True)
    y, h = ssd_chunk_scan(x, dt, A, B, C, **kw)
    assert torch.isfinite(y).all()
    for t0 in range(0, T, 64):      # chunk by chunk: the grown state would hide a later chunk's own part
        assert_close(y[:, t0:t0 + 64], y_ref[:, t0:t0 + 64], FP32, f"ssd_chunk_scan y from token {t0}")
    assert_close(h, h_ref, FP32, "ssd_chunk_scan final state")
    f64 = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    for fn, L in ((ssd_scan_ref, 64), (ssd_chunked_torch, 64), (ssd_chunked_torch, 16)):
        y64, h64 = fn(*(t.double() for t in (x, dt, A, B, C)), chunk_size=L, **f64)
        assert_close(y64, y_ref, 1e-10, f"{fn.__name__}({L}) y")
        assert_close(h64, h_ref, 1e-10, f"{fn.__name__}({L}) final state")
    # the step from the scan's state at token 100, with the same gates, in the decode layout
    t = 100
    step = dict(x=x[:, t], dt=dt[:, t, :, None].expand(Bt, H, P), A=A[:, None, None].expand(H, P, N),
                B=B[:, t], C=C[:, t], D=D, z=z[:, t], dt_bias=bias[:, None].expand(H, P), dt_softplus=softplus)
    _, h_t = scan_ref64(x[:, :t], dt[:, :t], A, B[:, :t], C[:, :t], D, z[:, :t], bias, softplus, h0)
    y_step_ref, h_step_ref = ref_step(h_t, **step)
    assert_close(y_step_ref, y_ref[:, t], 1e-10, "the fp64 step against the fp64 loop")
    state = h_t.float()
    assert_close(selective_state_update(state, **step), y_step_ref, FP32, "selective_state_update y")
    assert_close(state, h_step_ref, FP32, "selective_state_update state")
    step64 = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in step.items()}
    y_pure, h_pure = mamba2_step(h_t, **step64)
    assert_close(y_pure, y_step_ref, 1e-10, "mamba2_step y")
    assert_close(h_pure, h_step_ref, 1e-10, "mamba2_step state")
    state64 = h_t.clone()
    assert_close(selective_state_update_ref(state64, **step64), y_step_ref, 1e-10, "selective_state_update_ref y")
    assert_close(state64, h_step_ref, 1e-10, "selective_state_update_ref state")


@contextlib.contextmanager
def only_config(kernel, config):
    """Within: the autotuned `kernel` runs `config` and nothing else (its list of configs holds that
    one, and its cache of picks is empty); its configs and picks are restored after."""
    configs, picks = kernel.configs, dict(kernel.cache)
    kernel.configs = [config]
    kernel.cache.clear()
    try:
        yield
    finally:
        kernel.configs = configs
        kernel.cache.clear()
        kernel.cache.update(picks)


# ------------------------------------------------------------------ the gates kernel of the scan
def _dt_view(Bt, T, H, layout, dtype):
    """dt [Bt, T, H] as a caller may hold it: contiguous, a slice of a wider projection (every second
    column of it), or the transpose of a [Bt, H, T] tensor."""
    if layout == "contiguous":
        return torch.randn(Bt, T, H, device=DEVICE).to(dtype)
    if layout == "slice":
        return torch.randn(Bt, T, 2 * H + 3, device=DEVICE).to(dtype)[:, :, 1:1 + 2 * H:2]
    return torch.randn(Bt, H, T, device=DEVICE).to(dtype).transpose(1, 2)


@pytest.mark.parametrize("layout", ["contiguous", "slice", "transposed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("bias, softplus", [(True, True), (False, True), (True, False), (False, False)],
                         ids=["bias-softplus", "softplus", "bias", "plain"])
def test_gates_kernel(bias, softplus, dtype, layout):
    """ssd_gates against PyTorch: dtf = softplus(dt + dt_bias) and b = the in-chunk cumulative sum
    of dtf·A, gates below GATE_FLOOR counted as GATE_FLOOR (a huge dt and an infinite one included),
    for dt of any strides; T and H not multiples of the blocks."""
    Bt, T, H = 2, 130, 5
    dt = _dt_view(Bt, T, H, layout, dtype)
    if not softplus:
        dt = dt.abs()                        # dt >= 0 without the softplus (every decay <= 1)
    dt[0, 5, 0] = 500.0                      # dt·A far below the floor: counted as GATE_FLOOR
    dt[1, 70, 2] = math.inf                  # dt·A = -inf: the same
    dt_bias = torch.rand(H, device=DEVICE) * 0.5 if bias else None
    A = -torch.rand(H, device=DEVICE) * 2 - 0.05
    dtf = torch.empty(Bt, T, H, device=DEVICE)
    b = torch.empty(Bt, T, H, 1, device=DEVICE)
    chunk_module.ssd_gates(dt, dt_bias, A, softplus, dtf, b)

    ref = dt.double() + (0 if dt_bias is None else dt_bias.double())
    if softplus:
        ref = torch.nn.functional.softplus(ref)
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(dtf), finite) and dtf[1, 70, 2] == math.inf
    assert_close(dtf[finite], ref[finite], FP32, "dt after bias and softplus")
    g = (ref * A.double()).clamp(min=GATE_FLOOR)
    b_ref = torch.cat([c.cumsum(1) for c in g.split(CHUNK, dim=1)], dim=1)
    assert torch.isfinite(b).all()
    assert_close(b[..., 0], b_ref, FP32, "b, the in-chunk cumulative log decay")


def test_gates_kernel_keeps_nan():
    """A NaN dt is not a reset: its chunk's sum stays NaN from that token on, and only there."""
    dt = torch.randn(1, 80, 3, device=DEVICE)
    dt[0, 10, 1] = math.nan
    dtf, b = torch.empty(1, 80, 3, device=DEVICE), torch.empty(1, 80, 3, 1, device=DEVICE)
    chunk_module.ssd_gates(dt, None, -torch.ones(3, device=DEVICE), True, dtf, b)
    assert torch.isnan(b[0, 10:CHUNK, 1]).all() and dtf[0, 10, 1].isnan()
    assert torch.isfinite(b[0, :10]).all() and torch.isfinite(b[0, CHUNK:]).all()
    assert torch.isfinite(b[0, :, [0, 2]]).all()


def chunk_start_states_ref64(x, dt, A, B, h0, chunk_size):
    """The token loop in float64 (dt already after its softplus), keeping the state at every chunk start
    ([Bt, NT, H, N, P], the layout the output kernel reads) and after the last token ([Bt, H, P, N])."""
    x, dt, A, B = x.double(), dt.double(), A.double(), B.double()
    Bt, T, H, P = x.shape
    Bh = B.repeat_interleave(H // B.shape[2], dim=2)
    h = torch.zeros(Bt, H, P, B.shape[3], dtype=torch.float64, device=x.device) if h0 is None else h0.double()
    starts = []
    for t in range(T):
        if t % chunk_size == 0:
            starts.append(h.transpose(-1, -2))
        h = torch.exp(dt[:, t] * A)[..., None, None] * h \
            + (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
    return torch.stack(starts, dim=1), h


def force_state_path(monkeypatch, path):
    """ssd_state_pass takes `path` ("split" or "sequential") at every chunk length."""
    monkeypatch.setattr(chunk_module, "SPLIT_FROM_CHUNK", 16 if path == "split" else 512)


@pytest.mark.parametrize("path", ["split", "sequential"])
@pytest.mark.parametrize("states_dtype", ["input", "fp32"], ids=["states-in-x-dtype", "states-fp32"])
@pytest.mark.parametrize("with_h0", [False, True], ids=["zero-start", "h0"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("T, chunk_size", [(1, 64), (130, 64), (100, 32), (300, 256)])
def test_state_pass_chunk_starts(T, chunk_size, dtype, with_h0, states_dtype, path, monkeypatch):
    """ssd_state_pass, split (every chunk's own state at once, then the elementwise walk along the chunks)
    and sequential, against the fp64 token loop: the state at every chunk start and the final state, T not
    a multiple of the chunk, a zero or a given initial state, the chunk-start states in x's dtype (the
    split's through an fp32 buffer of local states) or in fp32 (the split's written over the local states
    in place)."""
    force_state_path(monkeypatch, path)
    Bt, H, P, N, G = 2, 4, 16, 32, 2
    x, dt, A, B, *_ = make_scan(Bt, T, H, P, N, G, dtype=dtype)
    h0 = torch.randn(Bt, H, P, N, device=DEVICE) if with_h0 else None
    dtf = torch.empty(Bt, T, H, device=DEVICE)
    b = torch.empty(Bt, T, H, 1, device=DEVICE)
    chunk_module.ssd_gates(dt, None, A, True, dtf, b, chunk_size)
    NT = triton.cdiv(T, chunk_size)
    states = torch.full((Bt, NT, H, N, P), math.nan, dtype=dtype if states_dtype == "input" else torch.float32,
                        device=DEVICE)
    final = torch.full((Bt, H, P, N), math.nan, device=DEVICE)
    chunk_module.ssd_state_pass(B, x, dtf, b, states, h0, final, chunk_size)
    starts_ref, final_ref = chunk_start_states_ref64(x, dtf, A, B, h0, chunk_size)
    tol = FP32 if dtype == torch.float32 else tolerance(dtype)
    assert not states.isnan().any() and not final.isnan().any()
    assert_close(states, starts_ref, tol, "chunk-start states")
    assert_close(final, final_ref, tol, "final state")


class _Launches:
    """An autotuned or plain kernel that notes its name in `launched` each time it is launched."""
    def __init__(self, kernel, name, launched):
        self.kernel, self.name, self.launched = kernel, name, launched

    def __getitem__(self, grid):
        self.launched.append(self.name)
        return self.kernel[grid]


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES, ids=lambda L: f"chunk{L}")
def test_state_pass_split_from_its_chunk_length(chunk_size, monkeypatch):
    """The dispatch rule: chunks shorter than SPLIT_FROM_CHUNK (256) take the sequential pass, one launch;
    chunks of 256 the split, two (every chunk's own state, then the walk)."""
    launched = []
    for name in ("_ssd_state_kernel", "_ssd_chunk_state_kernel", "_ssd_state_pass_kernel"):
        monkeypatch.setattr(chunk_module, name, _Launches(getattr(chunk_module, name), name, launched))
    Bt, T, H, P, N, G = 1, 40, 2, 16, 16, 1
    x, dt, A, B, *_ = make_scan(Bt, T, H, P, N, G)
    dtf, b = torch.empty(Bt, T, H, device=DEVICE), torch.empty(Bt, T, H, 1, device=DEVICE)
    chunk_module.ssd_gates(dt, None, A, True, dtf, b, chunk_size)
    states = torch.empty(Bt, triton.cdiv(T, chunk_size), H, N, P, device=DEVICE)
    chunk_module.ssd_state_pass(B, x, dtf, b, states, None, None, chunk_size)
    split = chunk_size >= 256
    assert chunk_module.SPLIT_FROM_CHUNK == 256
    assert launched == (["_ssd_chunk_state_kernel", "_ssd_state_pass_kernel"] if split else ["_ssd_state_kernel"])


def test_scan_takes_a_strided_dt_and_D_per_head():
    """dt as a slice of a wider tensor and D as one number per head with a stride: read where they
    lie, the same result as the contiguous arguments."""
    x, dt, A, B, C, _, z, bias = make_scan(T=70, D_per_channel=False)
    wide = torch.randn(2, 70, 11, device=DEVICE)
    wide[:, :, 2:6] = dt
    D = torch.randn(4, 3, device=DEVICE)[:, 1]
    y_ref, _ = scan_ref64(x, dt, A, B, C, D, z, bias, True)
    y = ssd_chunk_scan(x, wide[:, :, 2:6], A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True)
    assert_close(y, y_ref, FP32, "y")


# BV = 32 tiles of the output kernel: (128, 32) ended in an illegal memory access on the H200, and an
# autotuned run whose candidates included (64, 32) gave a wrong output at dstate 64. Checked here
# under the interpreter, where the tile logic runs without the compiler.
SUSPECT_OUTPUT_TILES = [(128, 32), (64, 32)]
TILE_CASES = sorted({("output", m["BK"], m["BV"]) for m, _, _ in chunk_module._TILES}
                    | {("output", bk, bv) for bk, bv in SUSPECT_OUTPUT_TILES}
                    | {("state", m["BK"], m["BV"]) for m, _, _ in chunk_module._STATE_TILES}
                    | {("chunk_state", m["BK"], m["BV"]) for m, _, _ in chunk_module._CHUNK_STATE_TILES})


@pytest.mark.skipif(not INTERPRET, reason="the GPU checks its tiles in test_gpu_scan_every_*_config")
@pytest.mark.parametrize("chunk_size", [64, 256], ids=lambda L: f"chunk{L}")
@pytest.mark.parametrize("case", TILE_CASES, ids=lambda c: "{}-BK{}-BV{}".format(*c))
@pytest.mark.parametrize("shape", [(1, 130, 2, 64, 64, 1), (1, 130, 2, 64, 128, 1), (1, 70, 3, 48, 60, 3)],
                         ids=lambda s: "B{}-T{}-H{}-P{}-N{}-G{}".format(*s))
def test_scan_every_gpu_tile_interpreted(shape, case, chunk_size, monkeypatch):
    """The GPU's tiles of the output kernel, of the sequential state pass and of the split's chunk states,
    each forced in turn (its state path forced with it), in fp32 under the interpreter: a tile wider than
    dstate or headdim, one trip over dstate, several, any error in the addressing or the masks that depends
    on the tile shows here; at chunk 256 the walk over a chunk's earlier blocks too."""
    kernel = {"output": chunk_module._ssd_output_kernel, "state": chunk_module._ssd_state_kernel,
              "chunk_state": chunk_module._ssd_chunk_state_kernel}[case[0]]
    if case[0] != "output":
        force_state_path(monkeypatch, "split" if case[0] == "chunk_state" else "sequential")
    Bt, T, H, P, N, G = shape
    x, dt, A, B, C, D, z, bias = make_scan(*shape)
    h0 = torch.randn(Bt, H, P, N, device=DEVICE)
    y_ref, h_ref = scan_ref64(x, dt, A, B, C, D, z, bias, True, h0)
    with only_config(kernel, triton.Config({"BK": case[1], "BV": case[2]})):
        y, h = ssd_chunk_scan(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=bias, dt_softplus=True,
                              initial_states=h0, return_final_states=True)
    assert_close(h, h_ref, FP32, "final state")
    assert_close(y, y_ref, FP32, "y")


# ------------------------------------------------------------------ bad input: the scan
def _scan_good():
    x, dt, A, B, C, D, z, bias = make_scan(Bt=1, T=9, H=2, P=16, N=16, G=1, D_per_channel=False)
    return dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=bias,
                initial_states=torch.zeros(1, 2, 16, 16, device=DEVICE), return_final_states=True)


SCAN_TENSORS = ["x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states"]
SCAN_CASES = [
    Case("dt-shape", _with(dt=lambda a: a["dt"][:, :4]), ValueError, r"dt must be \[batch, seqlen, nheads\]"),
    Case("A-shape", _with(A=lambda a: a["A"][:1]), ValueError, r"A must be \[nheads\]"),
    Case("B-shape", _with(B=lambda a: a["B"][:, :3]), ValueError, r"B must be \[batch, seqlen, ngroups, dstate\]"),
    Case("C-dstate", _with(C=lambda a: a["C"][..., :8]), ValueError, r"C must be \[batch, seqlen, ngroups"),
    Case("B-dstate", _with(B=lambda a: a["B"][..., :8]), ValueError, r"B must be \[batch, seqlen, ngroups"),
    Case("groups-divide", _with(B=lambda a: torch.randn(1, 9, 3, 16, device=DEVICE),
                                C=lambda a: torch.randn(1, 9, 3, 16, device=DEVICE)),
         ValueError, "3 groups, which must divide nheads"),
    Case("D-shape", _with(D=lambda a: torch.randn(3, device=DEVICE)), ValueError,
         r"D must be \[nheads\] or \[nheads, headdim\]"),
    Case("z-shape", _with(z=lambda a: a["z"][:, :4]), ValueError, r"z must be \[batch, seqlen, nheads, headdim\]"),
    Case("dt_bias-shape", _with(dt_bias=lambda a: torch.randn(3, device=DEVICE)), ValueError,
         r"dt_bias must be \[nheads\]"),
    Case("initial_states-shape", _with(initial_states=lambda a: a["initial_states"].transpose(-1, -2)[..., :8]),
         ValueError, r"initial_states must be \[batch, nheads, headdim, dstate\]"),
    Case("x-empty", _with(x=lambda a: a["x"][:, :0], dt=lambda a: a["dt"][:, :0], B=lambda a: a["B"][:, :0],
                          C=lambda a: a["C"][:, :0], z=lambda a: a["z"][:, :0]), ValueError, "x must have every size"),
    Case("chunk_size-float", _with(chunk_size=lambda a: 64.0), TypeError, "chunk_size must be an int"),
    Case("chunk_size-zero", _with(chunk_size=lambda a: 0), ValueError, "chunk_size must be"),
    Case("dt_softplus-str", _with(dt_softplus=lambda a: "yes"), TypeError, "dt_softplus must be a bool"),
    Case("return_final_states-int", _with(return_final_states=lambda a: 1), TypeError,
         "return_final_states must be a bool"),
    Case("x-dtype-differs", _with(B=lambda a: a["B"].half()), TypeError, "must share one dtype"),
]
KERNEL_SCAN_CASES = [
    Case("chunk_size-not-a-kernel-chunk", _with(chunk_size=lambda a: 100), ValueError,
         "chunk_size must be one of 16, 32, 64, 128, 256"),
    Case("chunk_size-512", _with(chunk_size=lambda a: 512), ValueError, "chunk_size must be one of"),
]


@pytest.mark.parametrize("case", bad_input_cases(SCAN_TENSORS) + SCAN_CASES + KERNEL_SCAN_CASES, ids=case_id)
def test_scan_refuses(case):
    expect_refusal(ssd_chunk_scan, _scan_good, case)


@pytest.mark.parametrize("case", bad_input_cases(SCAN_TENSORS, kernel=False) + SCAN_CASES, ids=case_id)
def test_scan_reference_refuses(case):
    expect_refusal(ssd_scan_ref, _scan_good, case)


# ------------------------------------------------------------------ GPU: bf16 at mamba_ssm's test shapes
# mamba_ssm tests the step with heads at dim 2048 / 2064 / 4096 (nheads = dim // headdim), dstate
# 16 / 32 / 64, headdim 64, ngroups 1 / 2 / 4, with and without z, batch 2.
GPU_STEP = [(dim, N, G, hz) for dim in (2048, 2064, 4096) for N in (16, 32, 64) for G in (1, 2, 4)
            for hz in (False, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("dim, N, G, has_z", GPU_STEP, ids=lambda v: str(v))
def test_gpu_step_bf16(dim, N, G, has_z):
    P = 64
    H = dim // P
    args = make_step(b=2, H=H, P=P, N=N, G=G, dtype=torch.bfloat16, device="cuda")
    if not has_z:
        args.pop("z")
    y_ref, h_ref = ref_step(**{k: v.cpu() for k, v in args.items()}, dt_softplus=True)
    y = selective_state_update(**args, dt_softplus=True)
    assert_close(y, y_ref, tolerance(torch.bfloat16), "y")
    assert_close(args["state"], h_ref, FP32, "state")        # bf16 inputs are exact in the fp32 state


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 512, 8, 64, 64, 1), (2, 1000, 16, 64, 128, 2), (1, 2048, 4, 64, 128, 4),
                                   (2, 333, 6, 48, 60, 3)], ids=lambda s: "B{}-T{}-H{}-P{}-N{}-G{}".format(*s))
def test_gpu_scan_bf16(shape):
    x, dt, A, B, C, D, z, bias = make_scan(*shape, dtype=torch.bfloat16, device="cuda")
    h0 = torch.randn(shape[0], shape[2], shape[3], shape[4], device="cuda")
    y_ref, h_ref = ssd_chunked_torch(*(t.double() for t in (x, dt, A, B, C)), D=D.double(), z=z.double(),
                                     dt_bias=bias.double(), dt_softplus=True, initial_states=h0.double(),
                                     return_final_states=True)
    y, h = ssd_chunk_scan(x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True, initial_states=h0,
                          return_final_states=True)
    assert_close(y, y_ref, 2 * tolerance(torch.bfloat16), "y")
    assert_close(h, h_ref, 2 * tolerance(torch.bfloat16), "final state")


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES, ids=lambda L: f"chunk{L}")
def test_gpu_scan_bf16_chunk_sizes(chunk_size):
    """Each chunk length in bf16 on the GPU (compiled, the autotuned tiles), T = 1000: several whole
    chunks and a partial one at every length."""
    shape = (2, 1000, 16, 64, 128, 2)
    x, dt, A, B, C, D, z, bias = make_scan(*shape, dtype=torch.bfloat16, device="cuda")
    h0 = torch.randn(shape[0], shape[2], shape[3], shape[4], device="cuda")
    y_ref, h_ref = ssd_chunked_torch(*(t.double() for t in (x, dt, A, B, C)), D=D.double(), z=z.double(),
                                     dt_bias=bias.double(), dt_softplus=True, initial_states=h0.double(),
                                     return_final_states=True)
    y, h = ssd_chunk_scan(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=bias, dt_softplus=True,
                          initial_states=h0, return_final_states=True)
    assert_close(y, y_ref, 2 * tolerance(torch.bfloat16), "y")
    assert_close(h, h_ref, 2 * tolerance(torch.bfloat16), "final state")


def _config_id(c):
    return "BK{BK}-BV{BV}".format(**c.kwargs) + f"-w{c.num_warps}-s{c.num_stages}"


# The shape whose autotuned run once gave a wrong output (N = 64) beside the same at N = 128, and one
# with odd sizes and groups.
FORCED_SHAPES = [(2, 512, 8, 64, 64, 1), (2, 512, 8, 64, 128, 1), (1, 333, 6, 48, 60, 3)]


def _forced_run(kernel, config, shape, size_names, chunk_size):
    """The scan in bf16 at chunk_size with `kernel` held to `config`, against the fp64 chunked form: y
    and the final state checked apart (the final state comes from the state pass alone)."""
    Bt, T, H, P, N, G = shape
    sizes = {"N": N, "P": P}
    if any(config.kwargs[blk] > pow2_at_least_16(sizes[name]) for blk, name in zip(("BK", "BV"), size_names)):
        pytest.skip("the autotuner never runs a tile wider than the padded size")
    x, dt, A, B, C, D, z, bias = make_scan(*shape, dtype=torch.bfloat16, device="cuda")
    h0 = torch.randn(Bt, H, P, N, device="cuda")
    y_ref, h_ref = ssd_chunked_torch(*(t.double() for t in (x, dt, A, B, C)), D=D.double(), z=z.double(),
                                     dt_bias=bias.double(), dt_softplus=True, initial_states=h0.double(),
                                     return_final_states=True)
    with only_config(kernel, config):
        y, h = ssd_chunk_scan(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=bias, dt_softplus=True,
                              initial_states=h0, return_final_states=True)
        torch.cuda.synchronize()
    assert_close(h, h_ref, 2 * tolerance(torch.bfloat16), "final state")
    assert_close(y, y_ref, 2 * tolerance(torch.bfloat16), "y")


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_size", [64, 256], ids=lambda L: f"chunk{L}")
@pytest.mark.parametrize("config", chunk_module._CONFIGS, ids=_config_id)
@pytest.mark.parametrize("shape", FORCED_SHAPES, ids=lambda s: "B{}-T{}-H{}-P{}-N{}-G{}".format(*s))
def test_gpu_scan_every_output_config(shape, config, chunk_size):
    """Every config of the output kernel, one at a time: an error that depends on the tile shows here
    with the tile's name, instead of in whichever config the autotuner happened to pick."""
    _forced_run(chunk_module._ssd_output_kernel, config, shape, ("N", "P"), chunk_size)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_size", [64, 256], ids=lambda L: f"chunk{L}")
@pytest.mark.parametrize("config", chunk_module._STATE_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("shape", FORCED_SHAPES, ids=lambda s: "B{}-T{}-H{}-P{}-N{}-G{}".format(*s))
def test_gpu_scan_every_state_config(shape, config, chunk_size, monkeypatch):
    """Every config of the sequential state pass, one at a time, with B read per group and dt on the keys."""
    force_state_path(monkeypatch, "sequential")
    _forced_run(chunk_module._ssd_state_kernel, config, shape, ("N", "P"), chunk_size)


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_size", [64, 256], ids=lambda L: f"chunk{L}")
@pytest.mark.parametrize("config", chunk_module._CHUNK_STATE_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("shape", FORCED_SHAPES, ids=lambda s: "B{}-T{}-H{}-P{}-N{}-G{}".format(*s))
def test_gpu_scan_every_chunk_state_config(shape, config, chunk_size, monkeypatch):
    """Every config of the split's chunk-state kernel, one at a time, the split forced at both lengths."""
    force_state_path(monkeypatch, "split")
    _forced_run(chunk_module._ssd_chunk_state_kernel, config, shape, ("N", "P"), chunk_size)


@pytest.mark.gpu
def test_gpu_step_allocates_no_state():
    """The step at B = 64, 80 heads x 64 x 128: no state-sized allocation (the state is updated in place)."""
    args = make_step(b=64, H=80, P=64, N=128, G=1, dtype=torch.bfloat16, device="cuda")
    selective_state_update(**args, dt_softplus=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    selective_state_update(**args, dt_softplus=True)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base < args["state"].numel() * 4 // 8


# ------------------------------------------------------------------ the checks' remembered verdicts
def _count_full_checks(monkeypatch):
    """A list that grows by one each time the step's check runs in full (it checks `state` once)."""
    calls = []
    check = inputs_module.check_tensor

    def counted(name, *a, **k):
        calls.extend([name] if name == "state" else [])
        return check(name, *a, **k)

    monkeypatch.setattr(inputs_module, "check_tensor", counted)
    return calls


def test_step_check_runs_once_per_signature(monkeypatch):
    """A second call with the same signature (types, shapes, strides, dtypes, devices, requires_grad,
    grad mode, scalars) skips the checks; a call that differs in a stride, a scalar or the grad mode
    runs them again."""
    inputs_module._check_step_layout.verdicts.clear()
    calls = _count_full_checks(monkeypatch)
    args = make_step(b=2, H=4, P=8, N=16, G=2)
    selective_state_update(**args, dt_softplus=True)
    selective_state_update(**args, dt_softplus=True)
    assert len(calls) == 1
    selective_state_update(**args, dt_softplus=False)                       # a scalar differs
    selective_state_update(**{**args, "dt": args["dt"].transpose(0, 1).contiguous().transpose(0, 1)},
                           dt_softplus=True)                              # a stride differs
    with torch.no_grad():                                                   # the grad mode differs
        selective_state_update(**args, dt_softplus=True)
    assert len(calls) == 4


def test_remembered_verdicts_are_bounded():
    """At most 512 signatures are kept (check_once_per_signature's bound): the oldest goes first."""
    verdicts = inputs_module._check_step_layout.verdicts
    verdicts.clear()
    for b in range(1, 512 + 20):
        inputs_module.check_step_inputs(**make_step(b=b, H=1, P=1, N=1, G=1), kernel=False)
    assert len(verdicts) == 512


@pytest.mark.parametrize("case", bad_input_cases(STEP_TENSORS) + STEP_CASES + KERNEL_STEP_CASES, ids=case_id)
def test_step_refuses_after_a_good_call(case):
    """A good call's remembered verdict never lets a bad call through: each bad call right after a
    good one (same sizes where the case keeps them) is refused with its argument named."""
    selective_state_update(**_step_good())
    expect_refusal(selective_state_update, _step_good, case)


@pytest.mark.parametrize("case", bad_input_cases(SCAN_TENSORS) + SCAN_CASES + KERNEL_SCAN_CASES, ids=case_id)
def test_scan_refuses_after_a_good_call(case):
    ssd_chunk_scan(**_scan_good())
    expect_refusal(ssd_chunk_scan, _scan_good, case)


@pytest.mark.skipif(ON_GPU, reason="a slot table's values are read on the CPU only")
@pytest.mark.parametrize("fn", [selective_state_update, selective_state_update_ref], ids=lambda f: f.__name__)
def test_slot_values_checked_on_every_call(fn):
    """The slot table's values are no part of the signature: a table like a good one (same dtype,
    shape and strides) with a slot out of range or named twice is refused after the good call."""
    args = make_step(b=2, H=4, P=8, N=16, G=2, slots=3)
    fn(**args, state_batch_indices=torch.tensor([2, 0], dtype=torch.int32))
    for idx, words in (([0, 3], r"must lie in \[0, 2\]"), ([1, 1], "holds slot 1 more than once")):
        with pytest.raises(ValueError, match="state_batch_indices " + words):
            fn(**args, state_batch_indices=torch.tensor(idx, dtype=torch.int32))


def test_step_refuses_an_input_that_requires_grad():
    """The decode step has no backward (the scan trains: tests/test_mamba2_backward.py): an input that
    requires grad is refused by name in grad mode, and the same call under torch.no_grad() (a signature
    of its own) runs."""
    args = _step_good()
    args["dt_bias"] = args["dt_bias"].clone().requires_grad_()
    with torch.no_grad():
        selective_state_update(**{**args, "state": args["state"].clone()})
    with pytest.raises(ValueError, match="dt_bias requires grad, and selective_state_update has no backward"):
        selective_state_update(**args)


# ------------------------------------------------------------------ a NaN or inf reaches exactly what the math says
# A 150-token prompt, H = 4 heads in G = 2 groups (heads 0 and 1 read group 0's B and C), the poison at
# token 35 (inside the first 64-token block, whose earlier rows share its products) or 70 (in the
# second block: at chunk 256 the first block's rows must stay clean, and the later rows see the poison
# through the walk over earlier blocks). What each poison must reach: x (a value) of head 0, channel 3:
# rows >= the token of head 0, channel 3; B (a key) of group 0: those rows of heads 0 and 1; C (a
# query) of group 0: the token's row of heads 0 and 1; dt of head 0: rows >= the token of head 0.
SCAN_POISONS = {"nan-in-x": ("x", math.nan), "inf-in-x": ("x", math.inf), "nan-in-B": ("B", math.nan),
                "nan-in-C": ("C", math.nan), "nan-in-dt": ("dt", math.nan)}


@pytest.mark.parametrize("at", [35, 70], ids=lambda t: f"token{t}")
@pytest.mark.parametrize("chunk_size", [64, 256], ids=lambda L: f"chunk{L}")
@pytest.mark.parametrize("poison", list(SCAN_POISONS))
def test_scan_poison_reaches_exactly_its_rows(poison, chunk_size, at):
    name, value = SCAN_POISONS[poison]
    x, dt, A, B, C, D, z, bias = make_scan(Bt=1, T=150, H=4, P=16, N=32, G=2)
    args = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=bias, dt_softplus=True)
    clean = {**args, name: args[name].clone()}
    where = (slice(None), at, 0, 3) if name != "dt" else (slice(None), at, 0)
    clean[name][where] = 0.0
    args[name] = args[name].clone()
    args[name][where] = value
    y = ssd_chunk_scan(**args, chunk_size=chunk_size)
    y_ref, _ = scan_ref64(**{k: v for k, v in clean.items() if k != "dt_softplus"}, dt_softplus=True)
    expect = torch.zeros_like(y, dtype=torch.bool)
    if name == "x":
        expect[:, at:, 0, 3] = True
    elif name == "B":
        expect[:, at:, :2] = True
    elif name == "C":
        expect[:, at, :2] = True
    else:
        expect[:, at:, 0] = True
    bad = ~torch.isfinite(y)
    assert torch.equal(bad, expect), f"non-finite rows {sorted(set(bad.nonzero()[:, 1].tolist()))}"
    assert_close(y[~expect], y_ref[~expect], FP32, "the rows that cannot see the poison")


# ---------------------------------------------------------------- the layer's benchmark (no GPU)
def test_bench_layer_table_declared():
    """mamba2_layer times the scan as a Mamba-2 layer calls it (z=None, then the gated norm), each scan alone."""
    from attention_kernels.mamba2 import bench
    assert bench.LAYER in bench.BENCHMARKS and bench.LAYER.name == "mamba2_layer"
    assert list(bench.LAYER.providers) == ["book: scan + norm", "book: scan", "mamba_ssm: scan + RMSNormGated",
                                           "mamba_ssm: scan"]
    assert {(c["B"], c["T"]) for c in bench.LAYER.cases} == {(b, t) for b in (1, 8) for t in (4096, 16384)}
