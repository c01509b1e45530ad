"""FlashAttention-2 on packed sequences (attention_kernels.flash_attn.flash_attn_varlen_func): output and all
three gradients against each sequence alone through the fp64 reference, packed again; lengths 0, 1,
block multiples and longer than a block, query and key lengths that differ (bottom-right causal),
GQA and MQA; a NaN in one sequence stays in that sequence; the log-sum-exp; bad offsets refused.

Under the interpreter the forward's query tile is 32 rows and the backward's 32 rows (dQ) or keys
(dK/dV): the lengths below cross those boundaries.
"""
import math

import pytest
import torch

from input_cases import bad_input_cases, case_id, expect_refusal
from attention_kernels.common import DEVICE, rel_err, tolerance
from attention_kernels.flash_attn import attention_varlen_ref, backward, flash_attn_varlen_func, interface
from attention_kernels.flash_attn.bench import cu_seqlens, packed_lengths
from lse_cases import check_returned_lse, lse_reference


def _tols(dtype):
    """(forward, gradients), as in test_flash_attn."""
    fwd = tolerance(dtype, tf32_dots=True)
    return fwd, 3 * fwd


def _packed(lengths_q, lengths_k, HQ, HKV, D, dtype, device=DEVICE):
    """Random q [total_q, HQ, D], k, v [total_k, HKV, D] (requiring grad) and the two offsets."""
    mk = lambda *shape: torch.randn(*shape, device=device).to(dtype).requires_grad_()  # noqa: E731
    q, k, v = mk(sum(lengths_q), HQ, D), mk(sum(lengths_k), HKV, D), mk(sum(lengths_k), HKV, D)
    return q, k, v, cu_seqlens(lengths_q, device), cu_seqlens(lengths_k, device)


def _call(q, k, v, cu_q, cu_k, causal, **kw):
    max_q, max_k = (max(1, int((cu[1:] - cu[:-1]).max())) for cu in (cu_q, cu_k))
    return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, **kw)


@pytest.fixture(params=[1, 2], ids=["1launch", "2launches"])
def launches(request, monkeypatch):
    """The backward as one launch or as two, whatever the size would pick."""
    monkeypatch.setattr(interface, "ONE_LAUNCH_MAX_FLOPS", math.inf if request.param == 1 else 0.0)
    return request.param


CASES = {  # id: (query lengths, key lengths, Hq, Hkv, D)
    # self-attention lengths: empty, one, a block multiple, longer than a block; GQA-2
    "self-0-1-16-33-5-Hq4-Hkv2-D32": ([16, 0, 33, 1, 5], [16, 0, 33, 1, 5], 4, 2, 32),
    # cross lengths: T > S, T < S, T = S = 1, queries without keys, keys without queries; MQA
    "cross-Hq2-Hkv1-D64": ([40, 7, 1, 9, 0], [9, 20, 1, 0, 6], 2, 1, 64),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_each_sequence_alone(case, causal, launches):
    """fp32: o, dq, dk, dv against `attention_varlen_ref` (each sequence alone through the fp64
    reference, packed again); rows of a sequence without keys and keys of a sequence without queries
    get exactly 0."""
    lengths_q, lengths_k, HQ, HKV, D = CASES[case]
    _check(lengths_q, lengths_k, HQ, HKV, D, causal, torch.float32)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fp16(causal):
    _check([16, 0, 33, 1, 5], [20, 3, 33, 1, 0], 4, 2, 32, causal, torch.float16)


@pytest.mark.parametrize("parts", [1, 2, 4], ids=["parts1", "parts2", "parts4"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa_group_split(causal, parts, launches, monkeypatch):
    """MQA with a group of 4: one dK/dV program walks the group, or the group is split into parts
    whose fp32 partial sums are added after the launch; the same gradients either way."""
    monkeypatch.setattr(backward, "group_parts", lambda group, programs: parts)
    _check([40, 0, 7, 33], [9, 3, 20, 33], 4, 1, 32, causal, torch.float32)


def _check(lengths_q, lengths_k, HQ, HKV, D, causal, dtype, ref_dtype=torch.float64):
    q, k, v, cu_q, cu_k = _packed(lengths_q, lengths_k, HQ, HKV, D, dtype)
    o = _call(q, k, v, cu_q, cu_k, causal)
    g = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), g)
    qr, kr, vr = (t.detach().to(ref_dtype).requires_grad_() for t in (q, k, v))
    o_ref = attention_varlen_ref(qr, kr, vr, cu_q, cu_k, causal, compute_dtype=ref_dtype)
    refs = (o_ref, *torch.autograd.grad(o_ref, (qr, kr, vr), g.to(ref_dtype)))
    tol_f, tol_b = _tols(dtype)
    assert o.shape == q.shape and o.dtype == dtype
    for name, out, ref, tol in zip(("o", "dq", "dk", "dv"), (o, *grads), refs, (tol_f, tol_b, tol_b, tol_b)):
        assert not torch.isnan(out).any(), f"{name} has NaN"
        err = rel_err(out, ref)
        assert err <= tol, f"{name}: relative error {err:.2e} > {tol:.0e}"
    for n, (lq, lk) in enumerate(zip(lengths_q, lengths_k)):
        rows_q, rows_k = slice(cu_q[n], cu_q[n + 1]), slice(cu_k[n], cu_k[n + 1])
        if lk == 0:  # nothing to attend to
            assert not o[rows_q].any() and not grads[0][rows_q].any()
        if lq == 0:  # nobody attends
            assert not grads[1][rows_k].any() and not grads[2][rows_k].any()


def test_inference_path_is_the_autograd_path():
    q, k, v, cu_q, cu_k = _packed([16, 0, 33, 1, 5], [16, 0, 33, 1, 5], 4, 2, 32, torch.float32)
    with torch.no_grad():
        o_inf, lse_inf = _call(q, k, v, cu_q, cu_k, True, return_lse=True)
    o, lse = _call(q, k, v, cu_q, cu_k, True, return_lse=True)
    assert torch.equal(o, o_inf) and torch.equal(lse, lse_inf) and o.requires_grad and not lse.requires_grad


def test_strided_inputs():
    """q, k, v as views of one packed qkv tensor [total, 3, H, D] (how a fused projection hands them
    out): the same output and gradients as contiguous copies."""
    lengths, H, D = [9, 0, 33], 2, 32
    qkv = torch.randn(sum(lengths), 3, H, D, device=DEVICE, requires_grad=True)
    cu = cu_seqlens(lengths, DEVICE)
    o = _call(*qkv.unbind(1), cu, cu, True)
    g = torch.randn_like(o)
    (dqkv,) = torch.autograd.grad(o, (qkv,), g)
    copies = [t.detach().contiguous().requires_grad_() for t in qkv.unbind(1)]
    o_copy = _call(*copies, cu, cu, True)
    assert torch.equal(o, o_copy)
    assert torch.equal(dqkv, torch.stack(torch.autograd.grad(o_copy, copies, g), dim=1))


# ------------------------------------------------------------------ the log-sum-exp
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_lse_is_the_natural_log_sum_exp(causal):
    """[Hq, total_q] fp32, each sequence's rows against torch.logsumexp of its own scores; +inf on
    rows that see no key (a sequence without keys, or causal rows above a shorter key sequence)."""
    lengths_q, lengths_k, HQ, HKV, D = CASES["cross-Hq2-Hkv1-D64"]
    q, k, v, cu_q, cu_k = _packed(lengths_q, lengths_k, HQ, HKV, D, torch.float32)
    o, lse = _call(q, k, v, cu_q, cu_k, causal, return_lse=True)
    check_returned_lse(o, lse, (HQ, sum(lengths_q)), _call(q, k, v, cu_q, cu_k, causal))
    ref = torch.full(lse.shape, math.inf, dtype=torch.float64)
    for n in range(len(lengths_q)):
        q0, q1, k0, k1 = cu_q[n].item(), cu_q[n + 1].item(), cu_k[n].item(), cu_k[n + 1].item()
        if q1 > q0 and k1 > k0:
            ref[:, q0:q1] = lse_reference(q[None, q0:q1], k[None, k0:k1], causal)[0]
    ref = ref.masked_fill(ref == -math.inf, math.inf)
    seen = torch.isfinite(ref)
    assert (~seen).any() and torch.equal(torch.isinf(lse) & (lse > 0), ~seen)
    assert rel_err(lse[seen], ref[seen]) <= tolerance(torch.float32, tf32_dots=True)


# ------------------------------------------------------------------ NaN stays in its sequence
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, computing with NaN as asked
@pytest.mark.parametrize("poison, n_launches", [("q", 1), ("k", 2), ("v", 1), ("do", 1), ("do", 2)],
                         ids=["q-1launch", "k-2launches", "v-1launch", "do-1launch", "do-2launches"])
def test_nan_stays_in_its_sequence(poison, n_launches, monkeypatch):
    """A NaN in one sequence's q, k, v or dO (every head, every row of it): the other sequences' o,
    dq, dk and dv are bit for bit those of the clean run, and the poisoned sequence does show NaN.
    dO is the one the two backward forms treat differently (delta stored or recomputed): both run."""
    monkeypatch.setattr(interface, "ONE_LAUNCH_MAX_FLOPS", math.inf if n_launches == 1 else 0.0)
    lengths, HQ, HKV, D = [20, 33, 1, 12], 2, 1, 32
    q, k, v, cu, _ = _packed(lengths, lengths, HQ, HKV, D, torch.float32)
    g = torch.randn(q.shape)
    o_clean = _call(q, k, v, cu, cu, True)
    clean = (o_clean, *torch.autograd.grad(o_clean, (q, k, v), g))
    bad = slice(20, 53)  # the second sequence
    with torch.no_grad():
        {"q": q, "k": k, "v": v, "do": g}[poison][bad] = math.nan
    o = _call(q, k, v, cu, cu, True)
    dirty = (o, *torch.autograd.grad(o, (q, k, v), g))
    others = torch.ones(q.shape[0], dtype=torch.bool)
    others[bad] = False
    for name, a, b in zip(("o", "dq", "dk", "dv"), dirty, clean):
        assert torch.equal(a[others], b[others]), f"{name}: the NaN reached another sequence"
    assert torch.isnan(dirty[1][bad]).any(), "the poisoned sequence must show the NaN (else the test proves nothing)"


# ------------------------------------------------------------------ bad input
def _good_args():
    q, k, v, cu, _ = _packed([3, 5], [3, 5], 4, 2, 32, torch.float32)
    return {"q": q.detach(), "k": k.detach(), "v": v.detach(), "cu_seqlens_q": cu, "cu_seqlens_k": cu.clone(),
            "max_seqlen_q": 5, "max_seqlen_k": 5}


@pytest.mark.parametrize("case", bad_input_cases(["q", "k", "v"]), ids=case_id)
def test_refuses_bad_tensors(case):
    expect_refusal(flash_attn_varlen_func, _good_args, case)


def _offsets(name, values):
    return lambda a: a.update({name: torch.tensor(values, dtype=torch.int32, device=DEVICE)})


BAD = {  # id: (change to the good arguments, exception, words of its message)
    "cu-q-int64": (lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"].long()), TypeError,
                   "cu_seqlens_q has dtype int64"),
    "cu-k-float": (lambda a: a.update(cu_seqlens_k=a["cu_seqlens_k"].float()), TypeError,
                   "cu_seqlens_k has dtype float32"),
    "cu-q-2d": (lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"][None]), ValueError, "cu_seqlens_q must have 1 dims"),
    "cu-q-list": (lambda a: a.update(cu_seqlens_q=[0, 3, 8]), TypeError, "cu_seqlens_q must be a torch.Tensor"),
    "cu-k-meta": (lambda a: a.update(cu_seqlens_k=a["cu_seqlens_k"].to("meta")), ValueError,
                  "cu_seqlens_k is on meta"),
    "cu-q-one-entry": (_offsets("cu_seqlens_q", [0]), ValueError, "cu_seqlens_q must hold N \\+ 1 >= 2"),
    "cu-q-first-not-0": (_offsets("cu_seqlens_q", [1, 3, 8]), ValueError, "cu_seqlens_q must start at 0, got 1"),
    "cu-k-last-not-total": (_offsets("cu_seqlens_k", [0, 3, 7]), ValueError,
                            "cu_seqlens_k must end at the packed length 8 .*got 7"),
    "cu-q-decreasing": (_offsets("cu_seqlens_q", [0, 5, 3, 8]), ValueError, "cu_seqlens_q must be non-decreasing"),
    "cu-lengths-differ": (_offsets("cu_seqlens_k", [0, 3, 3, 8]), ValueError,
                          "cu_seqlens_q and cu_seqlens_k must both be N \\+ 1 long"),
    "q-4d": (lambda a: a.update(q=a["q"][None]), ValueError, "q must have 3 dims"),
    "heads-not-a-multiple": (lambda a: a.update(k=a["k"].repeat(1, 3, 1)[:, :3], v=a["v"].repeat(1, 3, 1)[:, :3]),
                             ValueError, "multiple"),
    "head-dim-48": (lambda a: a.update({n: a[n][..., :16].repeat(1, 1, 3) for n in "qkv"}), ValueError,
                    "head dim D of q, k, v must be one of"),
    "max-seqlen-q-float": (lambda a: a.update(max_seqlen_q=5.0), TypeError, "max_seqlen_q must be an int"),
    "max-seqlen-k-0": (lambda a: a.update(max_seqlen_k=0), ValueError, "max_seqlen_k must be in"),
    "dropout": (lambda a: a.update(dropout_p=0.1), ValueError, "dropout_p must be 0.0"),
    "dropout-str": (lambda a: a.update(dropout_p="0"), TypeError, "dropout_p must be a float"),
    "causal-int": (lambda a: a.update(causal=1), TypeError, "causal must be a bool"),
    "scale-zero": (lambda a: a.update(softmax_scale=0.0), ValueError, "softmax_scale must be finite and > 0"),
    "return-lse-int": (lambda a: a.update(return_lse=1), TypeError, "return_lse must be a bool"),
    "window": (lambda a: a.update(window_size=(4, 4)), ValueError, "window_size must be"),
    "softcap": (lambda a: a.update(softcap=50.0), ValueError, "softcap must be 0.0"),
    "alibi": (lambda a: a.update(alibi_slopes=torch.ones(4)), ValueError, "alibi_slopes must be None"),
    "block-table": (lambda a: a.update(block_table=torch.zeros(2, 1, dtype=torch.int32)), ValueError,
                    "block_table must be None"),
    "deterministic-none": (lambda a: a.update(deterministic=None), TypeError, "deterministic must be a bool"),
    "probs-and-lse": (lambda a: a.update(return_attn_probs=True, return_lse=True), ValueError,
                      "return_attn_probs and return_lse"),
}


def test_takes_flash_attn_positional_order():
    """flash-attn's positions (dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
    deterministic, return_attn_probs, block_table after the offsets and longest lengths): the book's keyword
    call's tensors; return_attn_probs=True gives (o, lse, None); window (-1, 0) is the causal mask."""
    q, k, v, cu_q, cu_k = _packed([5, 9, 2], [7, 9, 4], 4, 2, 32, torch.float32)
    o, lse = _call(q, k, v, cu_q, cu_k, True, softmax_scale=0.2, return_lse=True)
    o2, lse2, probs = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 9, 0.0, 0.2, True, (-1, -1), 0.0, None,
                                             True, True, None)
    assert torch.equal(o, o2) and torch.equal(lse, lse2) and probs is None
    o3 = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 9, softmax_scale=0.2, window_size=(-1, 0))
    assert torch.equal(o, o3)
    assert not torch.equal(o, _call(q, k, v, cu_q, cu_k, False, softmax_scale=0.2))   # the test can fail


@pytest.mark.parametrize("case", list(BAD))
def test_refuses(case):
    change, exc, words = BAD[case]
    args = _good_args()
    change(args)
    with pytest.raises(exc, match=words):
        flash_attn_varlen_func(**args)


def test_reference_refuses_bad_offsets():
    args = _good_args()
    del args["max_seqlen_q"], args["max_seqlen_k"]
    args["cu_seqlens_q"] = torch.tensor([0, 3, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q must end at the packed length 8"):
        attention_varlen_ref(**args)


def test_packed_lengths():
    """Seeded, summing to the total, every length >= 1 and within `longest`, with a long tail."""
    lengths = packed_lengths(16384, seed=0)
    assert lengths == packed_lengths(16384, seed=0) != packed_lengths(16384, seed=1)
    assert sum(lengths) == 16384 and min(lengths) >= 1 and max(lengths) <= 8192
    assert max(lengths) > 4 * sorted(lengths)[len(lengths) // 2]
    assert cu_seqlens([3, 0, 2]).tolist() == [0, 3, 3, 5]


# ------------------------------------------------------------------ GPU: bf16, real shapes
@pytest.mark.gpu
@pytest.mark.gpu_heavy
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("HQ, HKV", [(16, 4), (32, 32)], ids=["Hq16-Hkv4", "Hq32-Hkv32"])
def test_gpu_packed_16k(HQ, HKV, causal, launches):
    """16K tokens of long-tailed lengths (`packed_lengths`), D = 128, bf16, against each sequence
    alone through the fp32 reference."""
    lengths = packed_lengths(16384, seed=0)
    _check(lengths, lengths, HQ, HKV, 128, causal, torch.bfloat16, ref_dtype=torch.float32)


@pytest.mark.gpu
def test_gpu_cross_lengths_bf16():
    """Query and key lengths that differ, empty ones included, several head dims' worth of tiles."""
    lengths_q = [1000, 0, 1, 129, 64, 3000]
    lengths_k = [300, 50, 2048, 129, 0, 3100]
    for causal in (False, True):
        _check(lengths_q, lengths_k, 8, 2, 128, causal, torch.bfloat16, ref_dtype=torch.float32)


@pytest.mark.gpu
def test_gpu_no_device_sync():
    """The checks read no offset back from the GPU: with sync debugging set to raise, a forward and a
    backward go through (a sync would raise a RuntimeError)."""
    lengths = packed_lengths(4096, seed=1)
    q, k, v, cu_q, cu_k = _packed(lengths, lengths, 8, 2, 128, torch.bfloat16)
    o = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths), max(lengths), causal=True)
    g = torch.randn_like(o)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths), max(lengths), causal=True)
        torch.autograd.grad(o, (q, k, v), g)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_gpu_matches_dense_on_equal_lengths():
    """Equal lengths packed are a dense batch: the same output as flash_attn_func, bit for bit."""
    from attention_kernels.flash_attn import flash_attn_func

    B, T, H, D = 4, 1000, 8, 128
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
    cu = cu_seqlens([T] * B, "cuda")
    dense = flash_attn_func(q, k, v, causal=True)
    packed = flash_attn_varlen_func(*(t.flatten(0, 1) for t in (q, k, v)), cu, cu, T, T, causal=True)
    assert torch.equal(packed, dense.flatten(0, 1))
