"""FlashAttention-2 (attention_kernels.flash_attn): forward and all three gradients against an fp64/fp32
reference written from the formula, GQA/MQA/MHA, odd lengths, T != S, bottom-right causal
masks, empty rows, large scores, NaN and inf where the mask hides them, and every kind of bad
input, for the kernel and the references.

Tolerances come from attention_kernels.common.tolerance: the kernels multiply fp32 inputs in TF32 on a GPU
(tl.dot's default) and exactly under the interpreter.
"""
import math

import pytest
import torch

from input_cases import bad_input_cases, case_id, expect_refusal
from attention_kernels.common import DEVICE, ON_GPU, TF32, rel_err, tolerance
from attention_kernels.flash_attn import attention_eager, attention_ref, backward, causal_mask, flash_attn_func, interface
from attention_kernels.flash_attn.reference import online_softmax_steps
from lse_cases import check_returned_lse, lse_reference
from reference_cases import (HIDDEN_KEY_CASES, HIDDEN_QUERY_CASES, KEY_POISONS, ROW_POISONS, assert_matches_reference,
                             compare_poisoned_row, compare_rows, on_heads, poison_key, poison_row, rows_seeing_key)


def _tols(dtype):
    """(forward, gradients): the gradients pass through two more matmuls and the rounding of P and
    dS to the input dtype, so they get three times the forward's tolerance."""
    fwd = tolerance(dtype, tf32_dots=True)
    return fwd, 3 * fwd


def _inputs(B, T, S, HQ, HKV, D, dtype, scale=1.0, device=DEVICE):
    mk = lambda *shape: (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype).requires_grad_()
    return mk(B, T, HQ, D), mk(B, S, HKV, D), mk(B, S, HKV, D)


def _reference(q, k, v, causal, g, ref_dtype=torch.float64, softmax_scale=None):
    """attention_ref's output and gradients (q, k, v) for the incoming gradient g."""
    qr, kr, vr = (t.detach().to(ref_dtype).requires_grad_() for t in (q, k, v))
    o = attention_ref(qr, kr, vr, causal=causal, softmax_scale=softmax_scale, compute_dtype=ref_dtype)
    return (o, *torch.autograd.grad(o, (qr, kr, vr), g.to(ref_dtype)))


def _check(B, T, S, HQ, HKV, D, causal, dtype, scale=1.0, ref_dtype=torch.float64, softmax_scale=None, tol=None):
    q, k, v = _inputs(B, T, S, HQ, HKV, D, dtype, scale)
    o = flash_attn_func(q, k, v, causal=causal, softmax_scale=softmax_scale)
    g = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), g)
    refs = _reference(q, k, v, causal, g, ref_dtype, softmax_scale)
    tol_f, tol_b = tol or _tols(dtype)
    assert o.shape == q.shape and o.dtype == dtype
    assert_matches_reference(("o", "dq", "dk", "dv"), (o, *grads), refs, (tol_f, tol_b, tol_b, tol_b))
    return o, grads


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_return_lse_is_the_natural_log_sum_exp(causal):
    """return_lse=True adds the rows' log-sum-exp (natural log, fp32, [B, Hq, T], as flash-attn's
    softmax_lse, not differentiable); the output is the same call's output without it, with or
    without autograd."""
    q, k, v = _inputs(2, 70, 90, 4, 2, 32, torch.float32)
    o, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    check_returned_lse(o, lse, (2, 4, 70), flash_attn_func(q, k, v, causal=causal))
    assert rel_err(lse, lse_reference(q, k, causal)) <= tolerance(torch.float32, tf32_dots=True)
    with torch.no_grad():
        o2, lse2 = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    assert torch.equal(o2, o) and torch.equal(lse2, lse)


def test_return_lse_of_a_row_that_sees_no_key_is_inf():
    q, k, v = _inputs(1, 9, 4, 2, 2, 32, torch.float32)  # causal with T > S: rows 0..4 see nothing
    _, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert torch.isinf(lse[..., :5]).all() and (lse[..., :5] > 0).all() and torch.isfinite(lse[..., 5:]).all()


def test_return_lse_keeps_the_gradients():
    q, k, v = _inputs(1, 40, 40, 2, 2, 32, torch.float32)
    g = torch.randn(1, 40, 2, 32, device=DEVICE)
    o, _ = flash_attn_func(q, k, v, causal=True, return_lse=True)
    with_lse = torch.autograd.grad(o, (q, k, v), g)
    without = torch.autograd.grad(flash_attn_func(q, k, v, causal=True), (q, k, v), g)
    for a, b in zip(with_lse, without):
        assert torch.equal(a, b)


def test_return_lse_is_a_keyword_bool():
    q, k, v = _inputs(1, 8, 8, 2, 2, 32, torch.float32)
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        flash_attn_func(q, k, v, return_lse=1)
    with pytest.raises(TypeError, match="positional"):   # return_attn_probs is the last positional one
        flash_attn_func(q, k, v, 0.0, None, True, (-1, -1), 0.0, None, False, False, True)


# ------------------------------------------------------------------ flash-attn's call, as its callers make it
def test_takes_flash_attn_positional_order():
    """flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, ...) in flash-attn's positions, and every
    flash-attn keyword at its default: the same tensors as the book's keyword call, gradients included."""
    q, k, v = _inputs(2, 37, 45, 4, 2, 32, torch.float32)
    g = torch.randn(2, 37, 4, 32, device=DEVICE)
    ours = flash_attn_func(q, k, v, causal=True, softmax_scale=0.3)
    theirs = flash_attn_func(q, k, v, 0.0, 0.3, True, (-1, -1), 0.0, None, False, False)
    keywords = flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=0.3, causal=True, window_size=[-1, -1],
                               softcap=0.0, alibi_slopes=None, deterministic=True, return_attn_probs=False)
    assert torch.equal(ours, theirs) and torch.equal(ours, keywords)
    for a, b in zip(torch.autograd.grad(ours, (q, k, v), g), torch.autograd.grad(keywords, (q, k, v), g)):
        assert torch.equal(a, b)   # deterministic=True changes nothing: the backward uses no atomics


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_window_minus_one_zero_is_the_causal_mask(causal):
    """flash-attn's window (-1, 0), keys up to i + S - T and none after, is the bottom-right causal mask."""
    q, k, v = _inputs(1, 20, 33, 2, 2, 32, torch.float32)
    assert torch.equal(flash_attn_func(q, k, v, causal=causal, window_size=(-1, 0)),
                       flash_attn_func(q, k, v, causal=True))
    assert not torch.equal(flash_attn_func(q, k, v), flash_attn_func(q, k, v, causal=True))   # the test can fail


def test_return_attn_probs_is_out_lse_none():
    q, k, v = _inputs(1, 30, 30, 4, 2, 32, torch.float32)
    o, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    o2, lse2, probs = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(o, o2) and torch.equal(lse, lse2) and probs is None and lse2.shape == (1, 4, 30)


PEER_OPTION_CASES = {  # id: (flash-attn keywords, exception, words of its message)
    "dropout": ({"dropout_p": 0.1}, ValueError, "dropout_p must be 0.0"),
    "dropout-bool": ({"dropout_p": False}, TypeError, "dropout_p must be a float"),
    "window-left": ({"window_size": (16, 0)}, ValueError, "window_size must be .* no sliding window"),
    "window-right": ({"window_size": (-1, 4)}, ValueError, "window_size must be"),
    "window-both": ({"window_size": (8, 8)}, ValueError, "window_size must be"),
    "window-int": ({"window_size": -1}, TypeError, "window_size must be a pair"),
    "window-three": ({"window_size": (-1, -1, -1)}, TypeError, "window_size must be a pair"),
    "window-float": ({"window_size": (-1.0, -1)}, TypeError, "window_size\\[0\\] must be an int"),
    "softcap": ({"softcap": 30.0}, ValueError, "softcap must be 0.0"),
    "softcap-str": ({"softcap": "0"}, TypeError, "softcap must be a float"),
    "alibi": ({"alibi_slopes": torch.ones(4)}, ValueError, "alibi_slopes must be None"),
    "deterministic-int": ({"deterministic": 1}, TypeError, "deterministic must be a bool"),
    "probs-int": ({"return_attn_probs": 1}, TypeError, "return_attn_probs must be a bool"),
    "probs-and-lse": ({"return_attn_probs": True, "return_lse": True}, ValueError, "return_attn_probs and return_lse"),
}


@pytest.mark.parametrize("case", list(PEER_OPTION_CASES))
def test_refuses_what_flash_attn_offers_and_these_kernels_lack(case):
    options, exc, words = PEER_OPTION_CASES[case]
    with pytest.raises(exc, match=words):
        flash_attn_func(**_good_args(), **options)


def test_softcap_zero_or_below_is_off():
    """flash-attn caps only for softcap > 0; 0 and below are the plain scores."""
    args = _good_args()
    assert torch.equal(flash_attn_func(**args, softcap=-1.0), flash_attn_func(**args))


@pytest.fixture(params=[1, 2], ids=["1launch", "2launches"])
def launches(request, monkeypatch):
    """Run the backward as one launch (dK/dV programs compute delta from O) or as two (the dQ
    launch stores delta, the dK/dV launch reads it), whatever the size would pick."""
    monkeypatch.setattr(interface, "ONE_LAUNCH_MAX_FLOPS", math.inf if request.param == 1 else 0.0)
    return request.param


def _id(shape):
    B, T, S, HQ, HKV, D = shape
    return f"B{B}-T{T}-S{S}-Hq{HQ}-Hkv{HKV}-D{D}"


# ------------------------------------------------------------------ CPU (interpreter) and GPU
CPU_SHAPES = [
    (1, 77, 77, 4, 2, 32),   # GQA-2, odd length
    (2, 33, 33, 2, 2, 64),   # MHA, B=2
    (1, 1, 50, 4, 1, 32),    # decode: one query token against a cache, MQA
    (1, 40, 100, 2, 1, 64),  # T < S (chunked prefill)
    (1, 100, 40, 2, 2, 32),  # T > S: with causal, the first 60 rows see no key
    (1, 130, 17, 4, 4, 32),  # several query blocks, one ragged key block
    (1, 1, 1, 4, 2, 32),     # one query, one key: dq is exactly 0
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=_id)
def test_matches_reference(shape, causal, dtype, launches):
    _check(*shape, causal, dtype)


# ------------------------------------------------------------------ GQA: the group split over programs
@pytest.fixture(params=[1, 2, "group"], ids=["parts1", "parts2", "parts-group"])
def parts(request, monkeypatch):
    """Split each GQA group's query heads into this many parts, a dK/dV program each, whatever the
    size would pick: 1 (one program walks the whole group, summing in registers), 2 (two programs,
    their fp32 partial sums added after the launch; 1 for an odd group) or one head a part."""
    pick = {1: lambda group: 1, 2: lambda group: math.gcd(2, group), "group": lambda group: group}[request.param]
    monkeypatch.setattr(backward, "group_parts", lambda group, programs: pick(group))
    return request.param


GQA_SHAPES = [
    (1, 77, 77, 8, 2, 32),   # group of 4, odd length
    (2, 45, 61, 6, 3, 32),   # group of 2, B = 2, T < S
    (1, 50, 37, 4, 1, 64),   # MQA, T > S: with causal, the first 13 rows see no key
    (1, 33, 90, 8, 1, 32),   # MQA, group of 8, T < S, several key blocks
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", GQA_SHAPES, ids=_id)
def test_gqa_group_split(shape, causal, parts, launches):
    """fp32: dK and dV summed over the group are the same whether one program walks the whole group
    or the group is split into parts whose partial sums are added after the launch."""
    _check(*shape, causal, torch.float32)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa_group_split_fp16(causal, parts):
    _check(1, 77, 77, 8, 2, 32, causal, torch.float16)


@pytest.mark.parametrize("group, programs, expected", [
    (1, 8, 1),        # MHA: nothing to split
    (8, 2048, 1),     # enough programs already: the group stays in one program
    (4, 256, 4),      # GQA 32/8 at T = 4K (B = 1, BN = 128): 256 programs, 4 parts reach 1024
    (32, 128, 8),     # MQA 32/1 at T = 16K: 8 parts of 4 heads reach 1024
    (32, 32, 32),     # MQA 32/1 at T = 4K: one head a part
    (6, 200, 6),      # no divisor reaches MIN_PROGRAMS: one head a part
    (6, 300, 6),      # 4 parts would reach it, but 4 does not divide 6
    (6, 400, 3),
])
def test_group_parts(group, programs, expected):
    """The fewest parts, a divisor of the group, that give MIN_PROGRAMS dK/dV programs."""
    assert backward.MIN_PROGRAMS == 1024
    assert backward.group_parts(group, programs) == expected


def test_softmax_scale_argument():
    _check(1, 50, 70, 2, 1, 32, True, torch.float32, softmax_scale=0.3)


def test_empty_rows_are_zero():
    """causal with T > S: query i sees keys j <= i + S - T; rows i < T - S see none -> output 0, grads 0."""
    T, S = 100, 40
    q, k, v = _inputs(1, T, S, 2, 1, 32, torch.float32)
    o = flash_attn_func(q, k, v, causal=True)
    assert torch.all(o[:, : T - S] == 0) and torch.all(o[:, T - S:].abs().sum(-1) > 0)
    (dq,) = torch.autograd.grad(o, (q,), torch.randn_like(o))
    assert torch.all(dq[:, : T - S] == 0) and not torch.isnan(dq).any()


def test_single_query_causal_sees_whole_cache():
    q, k, v = _inputs(1, 1, 90, 4, 2, 64, torch.float32)
    a = flash_attn_func(q, k, v, causal=True)
    b = flash_attn_func(q, k, v, causal=False)
    assert rel_err(a, b) <= tolerance(torch.float32)  # the same products, summed through other code paths


def test_inference_path_matches_autograd_path():
    """Without inputs that need grad (or under no_grad) the wrapper skips autograd: same output."""
    q, k, v = _inputs(1, 50, 70, 4, 2, 32, torch.float32)
    o = flash_attn_func(q, k, v, causal=True)
    with torch.no_grad():
        o_ng = flash_attn_func(q, k, v, causal=True)
    o_plain = flash_attn_func(q.detach(), k.detach(), v.detach(), causal=True)
    assert o.requires_grad and not o_ng.requires_grad and not o_plain.requires_grad
    assert torch.equal(o.detach(), o_ng) and torch.equal(o_ng, o_plain)


# (o, dq, dk, dv) tolerances with scores of 1e3. fp32 (interpreter only: TF32 would round such a score
# by about 0.5) rounds a score by ~1e-4 absolute, which P and every gradient carry. fp16's scores are
# exact products summed in fp32 on every machine; but dq and dk sum dS = P (dP - delta) over keys, a
# sum that cancels to 0 in each row, and with P almost one-hot fp16's rounding of dS shows there as a
# few percent (4e-2 measured at this shape); o and dv do not cancel.
LARGE_SCORE_TOLS = {torch.float32: (1e-3, 1e-3, 1e-3, 1e-3),
                    torch.float16: (tolerance(torch.float16), 0.1, 0.1, 3 * tolerance(torch.float16))}


@pytest.mark.parametrize("dtype", [
    pytest.param(torch.float32, marks=pytest.mark.skipif(TF32, reason="TF32 rounds a score of 1e3 by ~0.5")),
    torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_large_scores_do_not_overflow(causal, dtype):
    """|scores| around 1e3: exp would overflow without the running max."""
    q, k, v = _inputs(1, 70, 70, 2, 1, 32, dtype, scale=math.sqrt(1000.0))
    o = flash_attn_func(q, k, v, causal=causal)
    g = torch.randn_like(o)
    outs = (o, *torch.autograd.grad(o, (q, k, v), g))
    for name, out, ref, tol in zip(("o", "dq", "dk", "dv"), outs, _reference(q, k, v, causal, g),
                                   LARGE_SCORE_TOLS[dtype]):
        assert torch.isfinite(out).all(), f"{name} is not finite"
        err = rel_err(out, ref)
        assert err <= tol, f"{name}: relative error {err:.2e} > {tol:.0e}"


def test_strided_inputs():
    """Views of one packed qkv tensor and transposed [B, H, T, D] views are copied to contiguous
    first (the kernels derive strides from shapes); out.sum() sends a stride-0 gradient."""
    tol_f, tol_b = _tols(torch.float32)
    B, T, H, D = 1, 45, 2, 32
    qkv = torch.randn(B, T, 3, H, D, device=DEVICE)
    q, k, v = qkv.unbind(2)
    o = flash_attn_func(q, k, v, causal=True)
    assert rel_err(o, attention_ref(q, k, v, causal=True)) <= tol_f

    q, k, v = (torch.randn(B, H, T, D, device=DEVICE).transpose(1, 2).requires_grad_() for _ in range(3))
    flash_attn_func(q, k, v, causal=True).sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    attention_ref(q64, k64, v64, causal=True).sum().backward()
    for name, got, ref in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert rel_err(got, ref) <= tol_b, name


def test_misaligned_inputs():
    """Contiguous tensors that start 2 bytes past a 16-byte boundary: `launch` must not reuse the
    kernel compiled for aligned pointers (on the GPU that would be a misaligned vector load)."""
    dtype = torch.float16
    B, T, H, D = 1, 40, 2, 64
    aligned = [torch.randn(B, T, H, D, device=DEVICE, dtype=dtype) for _ in range(3)]
    flash_attn_func(*aligned, causal=True)  # compile (and remember) the aligned variant first
    shifted = []
    for t in aligned:
        flat = torch.empty(t.numel() + 1, device=DEVICE, dtype=dtype)
        shifted.append(flat[1:].view_as(t).copy_(t))
    assert all(t.data_ptr() % 16 for t in shifted)
    o = flash_attn_func(*shifted, causal=True)
    assert rel_err(o, attention_ref(*aligned, causal=True, out_dtype=torch.float64)) <= tolerance(dtype)


def test_inputs_are_not_modified():
    q, k, v = _inputs(1, 50, 70, 4, 2, 32, torch.float32)
    before = [t.detach().clone() for t in (q, k, v)]
    o = flash_attn_func(q, k, v, causal=True)
    torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
    attention_ref(q, k, v, causal=True)
    attention_eager(q, k, v, causal=True)
    assert all(torch.equal(t, b) for t, b in zip((q, k, v), before))


def test_one_launch_decision():
    """One launch for a small backward (causal T = 1K at B = 1, H = 32, D = 128), two beyond."""
    q, k = (torch.empty(1, 1024, 32, 128, device="meta") for _ in "qk")
    assert interface._one_launch(q, k, causal=True)
    assert not interface._one_launch(q, k, causal=False)


def test_launch_falls_back_when_a_tile_does_not_fit(monkeypatch):
    """`launch` tries the next tile when Triton reports OutOfResources, and remembers the choice (a kernel
    that compiles nothing, as under the interpreter: every call through the dispatcher, the grid given whole)."""
    from triton.runtime.errors import OutOfResources

    from attention_kernels import launch

    tried = []

    class FakeKernel:
        def __getitem__(self, grid):
            def run(*args, BM, BN, num_warps, num_stages, **constexprs):
                tried.append((BM, BN, grid))
                if BM == 128:
                    raise OutOfResources(300_000, 232_448, "shared memory")
            return run

    monkeypatch.setattr(launch, "_CHOSEN", {})
    tiles, key = [(128, 64, 8, 3), (64, 32, 4, 1)], ("test-fake-kernel",)
    for _ in range(2):
        launch.launch(FakeKernel(), lambda BM, BN: (1000 // BM,), tiles, key)
    assert tried == [(128, 64, (7, 1, 1)), (64, 32, (15, 1, 1)), (64, 32, (15, 1, 1))]


# ------------------------------------------------------------------ NaN and inf where the mask hides them
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, computing with NaN as asked
@pytest.mark.parametrize("poison", KEY_POISONS)
@pytest.mark.parametrize("shape, key", HIDDEN_KEY_CASES, ids=[f"{_id(s)}-key{j}" for s, j in HIDDEN_KEY_CASES])
def test_hidden_key_does_not_leak(shape, key, poison):
    """A NaN or inf in K or V at one key (KV head 0) reaches exactly the rows that see that key (of
    that head's query heads), in o and in dq; every other row equals the reference computed with
    that value zeroed. dV does not depend on V: with V poisoned it stays finite everywhere."""
    B, T, S, HQ, HKV, D = shape
    q, k, v = _inputs(*shape, torch.float32)
    clean = [t.detach().clone() for t in (q, k, v)]
    poison_key(k, v, key, poison)
    o = flash_attn_func(q, k, v, causal=True)
    g = torch.randn_like(o)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), g)
    o_ref, dq_ref, dk_ref, dv_ref = _reference(*clean, True, g)
    group = HQ // HKV
    poisoned = on_heads(rows_seeing_key(T, S, key, DEVICE), torch.arange(HQ, device=DEVICE) < group)  # [1, T, HQ]
    tol_f, tol_b = _tols(torch.float32)
    compare_rows("o", o, o_ref, poisoned.expand(B, T, HQ), tol_f)
    compare_rows("dq", dq, dq_ref, poisoned.expand(B, T, HQ), tol_b)
    if poison != "nan-in-k":
        assert rel_err(dv, dv_ref) <= tol_b
    # the reference gets the forward right on the poisoned input too
    ref_bad = ~torch.isfinite(attention_ref(q, k, v, causal=True)).all(dim=-1)
    assert torch.equal(ref_bad, poisoned.expand(B, T, HQ))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, computing with NaN as asked
@pytest.mark.parametrize("poison", ROW_POISONS)
@pytest.mark.parametrize("shape, row", HIDDEN_QUERY_CASES, ids=[f"{_id(s)}-row{r}" for s, r in HIDDEN_QUERY_CASES])
def test_hidden_query_does_not_leak(shape, row, poison, launches):
    """A NaN in Q or dO at one query row (query head 0) reaches that row's o and dq only. A NaN in dO
    reaches the dK of exactly the keys that row sees (KV head 0), a NaN in Q their dV; every other
    key's equals the reference computed with that value zeroed. (The other pairing, dV with a NaN in
    dO and dK with a NaN in Q, still spreads to hidden keys through 0 * NaN: see the dK/dV kernel.)"""
    B, T, S, HQ, HKV, D = shape
    q, k, v = _inputs(*shape, torch.float32)
    clean = [t.detach().clone() for t in (q, k, v)]
    g = torch.randn(B, T, HQ, D, device=DEVICE)
    g_clean = g.clone()
    poison_row(q, g, row, poison)
    o = flash_attn_func(q, k, v, causal=True)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), g)
    o_ref, dq_ref, dk_ref, dv_ref = _reference(*clean, True, g_clean)
    tol_f, tol_b = _tols(torch.float32)
    at_row = compare_poisoned_row((dq, dk, dv), (dq_ref, dk_ref, dv_ref), T, S, HQ, HKV, row, poison, tol_b)
    if poison == "nan-in-q":
        compare_rows("o", o, o_ref, at_row, tol_f)
    else:
        assert rel_err(o, o_ref) <= tol_f


# ------------------------------------------------------------------ bad input
def _good_args():
    return {"q": torch.randn(1, 8, 4, 32, device=DEVICE), "k": torch.randn(1, 8, 2, 32, device=DEVICE),
            "v": torch.randn(1, 8, 2, 32, device=DEVICE)}


REFERENCES = {"attention_ref": attention_ref, "attention_eager": attention_eager}
EVERY_FUNCTION = {"flash_attn_func": flash_attn_func, **REFERENCES}


@pytest.mark.parametrize("case", bad_input_cases(["q", "k", "v"]), ids=case_id)
def test_kernel_refuses(case):
    expect_refusal(flash_attn_func, _good_args, case)


@pytest.mark.parametrize("case", bad_input_cases(["q", "k", "v"], kernel=False), ids=case_id)
@pytest.mark.parametrize("fn", list(REFERENCES))
def test_references_refuse(fn, case):
    expect_refusal(REFERENCES[fn], _good_args, case)


def _slice(name, index):
    def mutate(args):
        args[name] = args[name][index]
    return mutate


def _set(**values):
    return lambda args: args.update(values)


FAMILY_CASES = {  # id: (change to the good arguments, exception, words of its message)
    "batch-mismatch": (lambda a: a.update(k=a["k"].expand(2, -1, -1, -1), v=a["v"].expand(2, -1, -1, -1)),
                       ValueError, "k must have shape"),
    "head-dim-mismatch": (lambda a: a.update(k=a["k"][..., :16], v=a["v"][..., :16]), ValueError, "k must have shape"),
    "k-v-shapes-differ": (_slice("v", (slice(None), slice(0, 5))), ValueError, "v must have shape"),
    "heads-not-a-multiple": (lambda a: a.update(k=torch.randn(1, 8, 3, 32, device=DEVICE),
                                                v=torch.randn(1, 8, 3, 32, device=DEVICE)), ValueError, "multiple"),
    "mixed-dtypes": (lambda a: a.update(k=a["k"].half()), TypeError, "share one dtype"),
    "mixed-devices": (lambda a: a.update(k=a["k"].to("cpu" if ON_GPU else "meta")), ValueError, "one device"),
    "all-on-meta": (lambda a: a.update({n: t.to("meta") for n, t in a.items()}), ValueError, "meta"),
    "empty-B": (lambda a: a.update({n: t[:0] for n, t in a.items()}), ValueError, "every size >= 1"),
    "empty-T": (_slice("q", (slice(None), slice(0, 0))), ValueError, "q must have every size >= 1"),
    "empty-S": (lambda a: a.update(k=a["k"][:, :0], v=a["v"][:, :0]), ValueError, "k must have every size >= 1"),
    "empty-Hq": (_slice("q", (slice(None), slice(None), slice(0, 0))), ValueError, "q must have every size >= 1"),
    "empty-Hkv": (lambda a: a.update(k=a["k"][:, :, :0], v=a["v"][:, :, :0]), ValueError, "k must have every size"),
    "empty-D": (lambda a: a.update({n: t[..., :0] for n, t in a.items()}), ValueError, "every size >= 1"),
    "scale-bool": (_set(softmax_scale=True), TypeError, "softmax_scale must be a float"),
    "scale-str": (_set(softmax_scale="0.1"), TypeError, "softmax_scale must be a float"),
    "scale-zero": (_set(softmax_scale=0.0), ValueError, "softmax_scale must be finite and > 0"),
    "scale-negative": (_set(softmax_scale=-1.0), ValueError, "softmax_scale must be finite and > 0"),
    "scale-nan": (_set(softmax_scale=math.nan), ValueError, "softmax_scale must be finite and > 0"),
    "scale-inf": (_set(softmax_scale=math.inf), ValueError, "softmax_scale must be finite and > 0"),
    "causal-int": (_set(causal=1), TypeError, "causal must be a bool"),
    "causal-str": (_set(causal="yes"), TypeError, "causal must be a bool"),
    "causal-none": (_set(causal=None), TypeError, "causal must be a bool"),
}


@pytest.mark.parametrize("case", list(FAMILY_CASES))
@pytest.mark.parametrize("fn", list(EVERY_FUNCTION))
def test_refuses_bad_shapes_and_scalars(fn, case):
    change, exc, words = FAMILY_CASES[case]
    args = _good_args()
    change(args)
    with pytest.raises(exc, match=words):
        EVERY_FUNCTION[fn](**args)


def test_kernel_refuses_unsupported_head_dim():
    args = {name: t[..., :16].repeat(1, 1, 1, 3) for name, t in _good_args().items()}  # D = 48
    with pytest.raises(ValueError, match="head dim D of q, k, v must be one of 32, 64, 128, 256, got 48"):
        flash_attn_func(**args)


@pytest.mark.parametrize("arg, value, exc", [("compute_dtype", torch.int32, TypeError),
                                             ("compute_dtype", "float64", TypeError),
                                             ("out_dtype", torch.int64, TypeError)])
def test_reference_refuses_bad_dtypes(arg, value, exc):
    with pytest.raises(exc, match=arg):
        attention_ref(**_good_args(), **{arg: value})


def test_eager_refuses_rows_that_see_nothing():
    args = _good_args()
    args["q"] = torch.randn(1, 9, 4, 32, device=DEVICE)
    with pytest.raises(ValueError, match="T=9 > S=8"):
        attention_eager(**args, causal=True)


def test_references_match_each_other_and_take_strided_inputs():
    q, k, v = (torch.randn(2, 4, 30, 32, device=DEVICE, dtype=torch.float64).transpose(1, 2) for _ in "qkv")
    ref = attention_ref(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert rel_err(attention_ref(q, k, v, causal=True), ref) <= 1e-12
    assert rel_err(attention_eager(q, k, v, causal=True), ref) <= 1e-12


@pytest.mark.parametrize("T, S, exc", [(0, 4, ValueError), (4, -1, ValueError), (2.0, 4, TypeError),
                                       (True, 4, TypeError)], ids=["T0", "S-1", "T-float", "T-bool"])
def test_causal_mask_refuses(T, S, exc):
    with pytest.raises(exc, match="T|S"):
        causal_mask(T, S)


@pytest.mark.parametrize("T, S", [(1, 1), (1, 50), (50, 1), (7, 7), (40, 100), (100, 40), (64, 65)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flops_count_the_visible_pairs(T, S, causal):
    """attention_flops: 4·B·H·D per pair the mask lets through (counted here on the mask itself),
    2.5× that for the backward."""
    from attention_kernels.flash_attn.reference import attention_flops, visible_pairs

    pairs = int(causal_mask(T, S).sum()) if causal else T * S
    assert visible_pairs(T, S, causal) == pairs
    assert attention_flops(2, 3, T, S, 16, causal) == 4 * 2 * 3 * 16 * pairs
    assert attention_flops(2, 3, T, S, 16, causal, backward=True) == 2.5 * 4 * 2 * 3 * 16 * pairs


@pytest.mark.parametrize("hkv", [32, 8, 1])
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_bench_bytes_are_the_tensors(pass_, hkv):
    """bytes_moved: bf16 q, k, v read and o written, 4·B·D·(T·Hq + S·Hkv); the backward also reads dO
    and writes dq, dk, dv: twice that."""
    from attention_kernels.flash_attn import bench

    c = {"B": 2, "T": 96, "H": 32, "Hkv": hkv, "D": 64, "pass": pass_, "causal": False}
    q_numel, kv_numel = 2 * 96 * 32 * 64, 2 * 96 * hkv * 64
    tensors = 2 * q_numel + 2 * kv_numel  # (q, o) and (k, v)
    assert bench.bytes_moved(c) == 2 * tensors * (2 if pass_ == "bwd" else 1)


def test_causal_mask_is_bottom_right_aligned():
    assert causal_mask(2, 3).tolist() == [[True, True, False], [True, True, True]]
    assert causal_mask(3, 2).tolist() == [[False, False], [True, False], [True, True]]


def _softmax_args():
    return {"x": torch.randn(12, dtype=torch.float64), "block": 4}


@pytest.mark.parametrize("case", bad_input_cases(["x"], kernel=False), ids=case_id)
def test_online_softmax_steps_refuses(case):
    expect_refusal(online_softmax_steps, _softmax_args, case)


@pytest.mark.parametrize("change, exc, words", [
    ({"block": 0}, ValueError, "block"), ({"block": True}, TypeError, "block"), ({"block": 2.0}, TypeError, "block"),
    ({"x": torch.tensor([1.0, math.nan])}, ValueError, "finite"), ({"x": torch.zeros(0)}, ValueError, "x must have"),
], ids=["block-0", "block-bool", "block-float", "x-nan", "x-empty"])
def test_online_softmax_steps_refuses_values(change, exc, words):
    with pytest.raises(exc, match=words):
        online_softmax_steps(**{**_softmax_args(), **change})


def test_online_softmax_steps_is_the_softmax():
    x = torch.randn(13, dtype=torch.float64) * 3
    steps, p = online_softmax_steps(x, block=4)
    assert len(steps) == 4 and torch.allclose(p, torch.softmax(x, 0), rtol=1e-12, atol=0)


# ------------------------------------------------------------------ GPU: bf16/fp16, real shapes
# Each new (dtype, causal, D, tile) compiles four kernels (forward, delta, dK/dV, dQ); lengths and
# head counts are not specialised, so the matrix below compiles about 25 kernels in all:
# bf16 D=128 causal and not (x2 dK/dV tiles), fp16 D=128 causal, and bf16 D=32, 64, 256 once each.
ARTICLE_SHAPES = [  # (B, Hq, Hkv, T, D), the source article's four
    (2, 32, 8, 1024, 128),   # GQA-4
    (1, 64, 8, 4096, 128),   # GQA-8
    (1, 32, 32, 512, 128),   # MHA
    (1, 16, 1, 512, 128),    # MQA
]
_article_id = lambda s: f"B{s[0]}-T{s[3]}-Hq{s[1]}-Hkv{s[2]}-D{s[4]}"  # noqa: E731


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", ARTICLE_SHAPES, ids=_article_id)
def test_gpu_article_shapes(shape, causal):
    B, HQ, HKV, T, D = shape
    _check(B, T, T, HQ, HKV, D, causal, torch.bfloat16, ref_dtype=torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [ARTICLE_SHAPES[0], ARTICLE_SHAPES[3]], ids=_article_id)
def test_gpu_article_shapes_fp16(shape):
    B, HQ, HKV, T, D = shape
    _check(B, T, T, HQ, HKV, D, True, torch.float16, ref_dtype=torch.float32)


GPU_ODD = [  # (B, T, S, Hq, Hkv, D), bf16, D = 128
    (1, 1, 1, 8, 2, 128),        # one query, one key
    (2, 1, 1000, 8, 2, 128),     # decode against a cache
    (1, 77, 77, 8, 8, 128),
    (1, 1000, 1000, 8, 1, 128),  # MQA
    (1, 1000, 333, 4, 2, 128),   # T > S: causal rows that see no key
    (1, 333, 1000, 4, 2, 128),   # T < S
    (1, 2000, 2000, 32, 32, 128),  # enough key blocks for the large dK/dV tile (BN = 128)
]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", GPU_ODD, ids=_id)
def test_gpu_odd_lengths(shape, causal, launches):
    _check(*shape, causal, torch.bfloat16, ref_dtype=torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, causal", [
    ((1, 500, 700, 4, 2, 32), False),
    ((2, 77, 300, 16, 4, 64), True),
    ((1, 300, 257, 4, 2, 256), True),
], ids=lambda x: _id(x) if isinstance(x, tuple) else ("causal" if x else "full"))
def test_gpu_head_dims(shape, causal, launches):
    _check(*shape, causal, torch.bfloat16, ref_dtype=torch.float32)


GPU_GQA = [  # (B, T, S, Hq, Hkv, D), bf16: the size picks how the group is split
    (1, 4096, 4096, 32, 1, 128),  # MQA: one query head a part
    (1, 2000, 2000, 32, 8, 128),  # GQA 32/8
    (2, 1000, 1500, 16, 2, 64),   # T < S
    (1, 1500, 700, 8, 1, 128),    # MQA, T > S
]


@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", GPU_GQA, ids=_id)
def test_gpu_gqa(shape, causal, launches):
    _check(*shape, causal, torch.bfloat16, ref_dtype=torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gpu_gqa_split_parts(causal, parts):
    _check(1, 1000, 1000, 16, 2, 128, causal, torch.bfloat16, ref_dtype=torch.float32)


@pytest.mark.gpu
def test_gpu_large_scores_bf16():
    q, k, v = _inputs(1, 1000, 1000, 8, 2, 128, torch.bfloat16, scale=math.sqrt(1000.0))
    o = flash_attn_func(q, k, v, causal=True)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
    for t in (o, dq, dk, dv):
        assert torch.isfinite(t).all()
    assert rel_err(o, attention_ref(q, k, v, causal=True, compute_dtype=torch.float32)) < 3e-2


@pytest.mark.gpu
def test_gpu_memory_linear_in_t():
    """Extra memory of the forward beyond its inputs and output: only the fp32 LSE (4 bytes a row)."""
    extra = []
    for T in (4096, 16384):
        q, k, v = (torch.randn(1, T, 32, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flash_attn_func(q, k, v)  # compile/tune outside the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        o = flash_attn_func(q, k, v)
        torch.cuda.synchronize()
        extra.append(torch.cuda.max_memory_allocated() - base - o.numel() * o.element_size())
        del q, k, v, o
    assert all(e < 64 * 2**20 for e in extra), extra  # eager would need 2 x 16 GiB at T = 16K
