"""Decoding against a KV cache (attention_kernels.flash_attn.flash_attn_with_kvcache): the output and the
log-sum-exp against an fp64 reference written from the formula, softmax(q kᵀ · scale) v over each
sequence's first cache_seqlens[b] keys, GQA by repeating the KV heads; lengths that differ per
sequence, are no block multiple, or are 1 or 0; one and several slices; one and several query tokens
with the causal mask; the new tokens written into the cache; bad input refused before any launch.

Under the interpreter a program's tile is 16 keys: the lengths below cross it.
"""
import math

import pytest
import torch

from input_cases import bad_input_cases, case_id, expect_refusal
from attention_kernels.common import DEVICE, INTERPRET, rel_err, tolerance
from attention_kernels.flash_attn import decode, flash_attn_with_kvcache

DTYPES = [torch.float32, torch.float16]


def decode_ref(q, k_cache, v_cache, lengths, causal=False, softmax_scale=None):
    """fp64 (o [B, S_q, Hq, D], lse [B, Hq, S_q]) from the formula, one sequence at a time: query i of S_q
    sees keys j < L (L = lengths[b]) with, causal, j <= i + L - S_q; a row that sees no key outputs 0
    and has lse -inf."""
    B, S_q, HQ, D = q.shape
    group = HQ // k_cache.shape[2]
    scale = D ** -0.5 if softmax_scale is None else softmax_scale
    outs, lses = [], []
    for b in range(B):
        L = int(lengths[b])
        k = k_cache[b, :L].double().repeat_interleave(group, dim=1)   # [L, Hq, D]
        v = v_cache[b, :L].double().repeat_interleave(group, dim=1)
        s = torch.einsum("thd,shd->hts", q[b].double(), k) * scale   # [Hq, S_q, L]
        if causal:
            seen = torch.arange(L)[None, :] <= torch.arange(S_q)[:, None] + L - S_q
            s = s.masked_fill(~seen.to(s.device), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)   # rows that see nothing: 0
        outs.append(torch.einsum("hts,shd->thd", p, v))
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def _inputs(B, S_q, HQ, HKV, D, T_cache, dtype, new=0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mk = lambda *shape: torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)  # noqa: E731
    q = mk(B, S_q, HQ, D)
    k_cache, v_cache = mk(B, T_cache, HKV, D), mk(B, T_cache, HKV, D)
    k, v = (mk(B, new, HKV, D), mk(B, new, HKV, D)) if new else (None, None)
    return q, k_cache, v_cache, k, v


def _check(o, lse, ref_o, ref_lse, dtype):
    tol = tolerance(dtype, tf32_dots=True)
    assert not o.isnan().any()
    assert rel_err(o, ref_o) < tol, rel_err(o, ref_o)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), seen.cpu()) and (lse[~seen] == float("-inf")).all()
    # the LSE comes from fp32 scores of the inputs as given: close whatever their dtype
    assert (lse[seen].double() - ref_lse[seen]).abs().max() < 1e-3 * max(1.0, ref_lse[seen].abs().max().item())


CASES = {  # id: (B, S_q, Hq, Hkv, D, T_cache, lengths)
    "mha-D64": (3, 1, 4, 4, 64, 50, [1, 37, 50]),
    "gqa4-D128": (2, 1, 8, 2, 128, 70, [70, 17]),
    "mqa8-D64": (3, 1, 8, 1, 64, 45, [16, 1, 45]),
}


@pytest.mark.parametrize("num_splits", [1, 3, 0], ids=["one-slice", "3-slices", "chosen"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_one_token_matches_the_reference(case, dtype, num_splits):
    """One query token per sequence (a decode step), group sizes 1, 4 and 8, lengths per sequence that
    differ, are no multiple of the tile, and include 1: o and the LSE against fp64, in one slice, in three
    (some empty for the short sequences) and in as many as the cost model picks."""
    B, S_q, HQ, HKV, D, T, lengths = CASES[case]
    q, k_cache, v_cache, _, _ = _inputs(B, S_q, HQ, HKV, D, T, dtype)
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    o, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, num_splits=num_splits,
                                     return_softmax_lse=True)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == (B, HQ, S_q) and lse.dtype == torch.float32
    _check(o, lse, *decode_ref(q, k_cache, v_cache, lens), dtype)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("S_q, HQ, HKV", [(3, 8, 2), (9, 8, 1)], ids=["3-tokens-gqa4", "9-tokens-mqa8"])
def test_several_tokens_with_the_causal_mask(S_q, HQ, HKV, causal, num_splits):
    """Several query tokens: causal aligns them to the end of each sequence (query i sees keys
    j <= i + L - S_q); a sequence shorter than S_q leaves rows that see no key (output 0, lse -inf).
    9 tokens of a group of 8 are 72 rows: more than one program's (64), so two programs share a slice."""
    q, k_cache, v_cache, _, _ = _inputs(3, S_q, HQ, HKV, 64, 40, torch.float32)
    lens = torch.tensor([40, 2, 19], dtype=torch.int32, device=DEVICE)
    o, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, causal=causal, num_splits=num_splits,
                                     return_softmax_lse=True)
    ref_o, ref_lse = decode_ref(q, k_cache, v_cache, lens, causal)
    _check(o, lse, ref_o, ref_lse, torch.float32)
    if causal:
        assert torch.equal(o[1, 0], torch.zeros_like(o[1, 0]))   # sequence 1, token 0 sees keys j <= -1: none


def test_a_nan_the_causal_mask_hides_stays_out():
    """A NaN in V at the last key, which only the last of the new tokens sees: the others stay finite."""
    q, k_cache, v_cache, _, _ = _inputs(1, 3, 4, 1, 32, 20, torch.float32)
    lens = torch.tensor([20], dtype=torch.int32, device=DEVICE)
    v_cache[0, 19] = float("nan")
    o = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, causal=True, num_splits=1)
    assert o[0, :2].isfinite().all() and o[0, 2].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_new_tokens_go_into_the_cache(dtype):
    """k and v given: written at positions cache_seqlens[b] ... + S_new - 1 of each sequence, in place (the
    rest of the cache untouched, cache_seqlens unchanged), and attended to as part of it: causal with S_q =
    S_new, each new query sees the cache and the new keys up to its own."""
    B, S_new, HQ, HKV, D, T = 3, 2, 8, 2, 64, 40
    q, k_cache, v_cache, k, v = _inputs(B, S_new, HQ, HKV, D, T, dtype, new=S_new)
    lens = torch.tensor([0, 17, 38], dtype=torch.int32, device=DEVICE)   # the last fills the cache
    k_before, v_before = k_cache.clone(), v_cache.clone()
    o, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, causal=True,
                                     return_softmax_lse=True)
    assert lens.tolist() == [0, 17, 38]
    for b, L in enumerate(lens.tolist()):
        assert torch.equal(k_cache[b, L:L + S_new], k[b]) and torch.equal(v_cache[b, L:L + S_new], v[b])
        rest = torch.ones(T, dtype=torch.bool)
        rest[L:L + S_new] = False
        assert torch.equal(k_cache[b, rest], k_before[b, rest]) and torch.equal(v_cache[b, rest], v_before[b, rest])
    _check(o, lse, *decode_ref(q, k_cache, v_cache, lens + S_new, causal=True), dtype)


def test_an_int_or_no_length():
    """cache_seqlens as an int (every sequence that long) and None (the whole cache) give what the tensor
    of those lengths gives; an int length with k and v appends there."""
    q, k_cache, v_cache, k, v = _inputs(2, 1, 4, 2, 32, 30, torch.float32, new=1)
    full = torch.full((2,), 30, dtype=torch.int32, device=DEVICE)
    assert torch.equal(flash_attn_with_kvcache(q, k_cache, v_cache),
                       flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=full))
    o = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=12, softmax_scale=0.3)
    assert torch.equal(k_cache[:, 12], k[:, 0])
    ref_o, _ = decode_ref(q, k_cache, v_cache, [13, 13], softmax_scale=0.3)
    assert rel_err(o, ref_o) < tolerance(torch.float32, tf32_dots=True)


def test_a_strided_cache_is_read_in_place():
    """A cache that is a view into a larger buffer (its batch stride not the packed one) is read and
    written where it lies, not copied."""
    q, _, _, k, v = _inputs(2, 1, 4, 2, 32, 30, torch.float32, new=1)
    buffer = torch.randn(2, 30, 2, 2, 32, device=DEVICE)   # K and V side by side per position
    k_cache, v_cache = buffer[:, :, 0], buffer[:, :, 1]
    lens = torch.tensor([7, 29], dtype=torch.int32, device=DEVICE)
    o = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, num_splits=2)
    assert torch.equal(buffer[0, 7, 0], k[0, 0]) and torch.equal(buffer[1, 29, 1], v[1, 0])
    ref_o, _ = decode_ref(q, k_cache, v_cache, lens + 1)
    assert rel_err(o, ref_o) < tolerance(torch.float32, tf32_dots=True)


def test_the_split_count_fills_the_gpu():
    """The chosen split: many slices for one sequence of 8 KV heads, none for a batch that fills the SMs."""
    assert decode.decode_splits(1, 8, 1, 4, 65536, torch.device("cpu")) > 8
    assert decode.decode_splits(64, 8, 1, 4, 4096, torch.device("cpu")) == 1


# ------------------------------------------------------------------ bad input, refused before any launch
def _good_args():
    q, k_cache, v_cache, k, v = _inputs(2, 1, 4, 2, 32, 20, torch.float32, new=1)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v,
                cache_seqlens=torch.tensor([3, 9], dtype=torch.int32, device=DEVICE))


OPTION_CASES = [  # (argument, value, exception, words)
    ("rotary_cos", "tensor", ValueError, "rotary_cos must be None"),
    ("rotary_sin", "tensor", ValueError, "rotary_sin must be None"),
    ("cache_batch_idx", "tensor", ValueError, "cache_batch_idx must be None"),
    ("cache_leftpad", "tensor", ValueError, "cache_leftpad must be None"),
    ("block_table", "tensor", ValueError, "block_table must be None"),
    ("alibi_slopes", "tensor", ValueError, "alibi_slopes must be None"),
    ("window_size", (4, 0), ValueError, "window_size must be"),
    ("window_size", 3, TypeError, "window_size must be a pair"),
    ("softcap", 30.0, ValueError, "softcap must be 0.0"),
    ("num_splits", -1, ValueError, "num_splits"),
    ("causal", 1, TypeError, "causal must be a bool"),
    ("return_softmax_lse", None, TypeError, "return_softmax_lse must be a bool"),
    ("softmax_scale", -1.0, ValueError, "softmax_scale"),
    ("cache_seqlens", 20, ValueError, "cache_seqlens"),           # no room for the new token
    ("cache_seqlens", "int64", TypeError, "cache_seqlens has dtype int64"),
    ("cache_seqlens", "past", ValueError, "cache_seqlens must be in"),
    ("cache_seqlens", "short", ValueError, "cache_seqlens must have shape"),
    ("v", None, ValueError, "pass both or neither"),
    ("k", "heads", ValueError, "k must have shape"),
    ("q", "heads", ValueError, "multiple of k_cache"),
    ("k_cache", "transposed", ValueError, "k_cache must have a contiguous last dimension"),
    ("v_cache", "short", ValueError, "v_cache must have shape"),
    ("q", "grad", ValueError, "q requires grad"),
    ("k", "grad", ValueError, "k requires grad"),
]


def _option_value(args, name, value):
    if value == "tensor":
        return torch.zeros(2, dtype=torch.int32, device=DEVICE)
    if value == "int64":
        return args["cache_seqlens"].long()
    if value == "past":
        return torch.tensor([3, 20], dtype=torch.int32, device=DEVICE)
    if value == "short" and name == "cache_seqlens":
        return args["cache_seqlens"][:1]
    if value == "short":
        return args[name][:, :10]
    if value == "heads":
        return args[name][:, :, :1] if name == "k" else args[name][:, :, :3]
    if value == "transposed":
        return args[name].transpose(-1, -2).contiguous().transpose(-1, -2)
    if value == "grad":
        return args[name].clone().requires_grad_()
    return value


@pytest.mark.parametrize("name, value, exc, words", OPTION_CASES,
                         ids=[f"{n}-{v if isinstance(v, str) else repr(v)}" for n, v, *_ in OPTION_CASES])
def test_refuses_what_it_does_not_do(name, value, exc, words, monkeypatch):
    """flash-attn's options this kernel lacks, and inputs it cannot take, refused naming the argument,
    with no kernel launched and no cache written."""
    monkeypatch.setattr(decode, "decode_fwd", lambda *a: pytest.fail("launched"))
    args = _good_args()
    before = {n: args[n].clone() for n in ("k_cache", "v_cache") if n != name}   # the caches not replaced
    args[name] = _option_value(args, name, value)
    with pytest.raises(exc, match=words):
        flash_attn_with_kvcache(**args)
    assert all(torch.equal(args[n], before[n]) for n in before)


@pytest.mark.parametrize("case", bad_input_cases(["q", "k_cache", "v_cache"]), ids=case_id)
def test_refuses_bad_tensors(case):
    expect_refusal(flash_attn_with_kvcache, _good_args, case)


# ------------------------------------------------------------------ on the GPU
@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="bf16 needs a GPU")
@pytest.mark.parametrize("B, T, lengths", [(1, 65536, [65536]), (4, 5000, [5000, 1, 4097, 2000])])
def test_bf16_decode_on_the_gpu(B, T, lengths):
    """bf16 at LLaMA-3-8B's head shape (32 query heads, 8 KV heads of 128) with the chosen split, one new
    token appended: o and the LSE against the fp64 reference."""
    q, k_cache, v_cache, k, v = _inputs(B, 1, 32, 8, 128, T + 1, torch.bfloat16, new=1)
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    o, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, return_softmax_lse=True)
    _check(o, lse, *decode_ref(q, k_cache, v_cache, lens + 1), torch.bfloat16)
