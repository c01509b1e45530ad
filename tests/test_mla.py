"""DeepSeek MLA: absorbed == naive, the decode kernels against the reference, and every bad input refused.

CPU (Triton interpreter): small head counts, head dims that are not block multiples
(D_qk=72 / D_v=64, 76 / 60, 64 / 64), fp32 and fp16. On the GPU the same tests run (fp32 products in
TF32 there), and DeepSeek-V3's dims in bf16 for both kernels.
"""
import math

import pytest
import torch

from input_cases import Case, bad_input_cases, case_id, expect_refusal
from attention_kernels.common import DEVICE, ON_GPU, assert_close, tolerance
from attention_kernels.mla import (absorb_query, latent_cache, mla_absorbed, mla_decode, mla_decode_gluon, mla_decode_ref,
                         mla_naive, unabsorb_output, yarn_softmax_scale)


def paged(kv, page):
    """kv [B, T, D] as pages [B * n_pages, page, D] stored in shuffled order (NaN past T), and its block table."""
    B, T, D = kv.shape
    n_pages = math.ceil(T / page)
    padded = torch.full((B, n_pages * page, D), float("nan"), device=kv.device, dtype=kv.dtype)
    padded[:, :T] = kv
    pages = padded.reshape(B * n_pages, page, D)
    perm = torch.randperm(B * n_pages, device=kv.device)
    cache = torch.empty_like(pages)
    cache[perm] = pages                        # page j of the logical layout lives at perm[j]
    return cache, perm.reshape(B, n_pages).to(torch.int32).contiguous()


def make_case(B, s_q, H, D, T, *, dtype=torch.float32, page=None, causal=False, lens=None):
    """Random q and cache, varied lengths (one of them the minimum), NaN past every length.
    Returns q, kv_cache, cache_seqlens, block_table (None unless `page`: a paged cache)."""
    q = torch.randn(B, s_q, H, D, device=DEVICE, dtype=dtype)
    lo = s_q if causal else 1
    if lens is None:
        lens = torch.randint(lo, T + 1, (B,), dtype=torch.int32)
        lens[0] = lo
        lens[-1] = T
    lens = lens.to(device=DEVICE, dtype=torch.int32)
    kv = torch.randn(B, T, D, device=DEVICE, dtype=dtype)
    for b in range(B):
        kv[b, int(lens[b]):] = float("nan")  # never to be read
    if page is None:
        return q, kv, lens, None
    cache, table = paged(kv, page)
    return q, cache, lens, table


def check_decode(q, kv, lens, table, d_v, causal, num_splits, tol, scale=0.13, **kw):
    """mla_decode against mla_decode_ref: out to `tol` (relative), lse to 10 * tol (absolute), nothing NaN."""
    out, lse = mla_decode(q, kv, table, lens, d_v, scale, causal, num_splits=num_splits, **kw)
    ref, ref_lse = mla_decode_ref(q, kv, table, lens, d_v, scale, causal)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert not out.isnan().any() and not lse.isnan().any()
    assert_close(out, ref, tol, "out")
    lse_err = (lse - ref_lse).abs().max().item()
    assert lse_err < 10 * tol, f"lse: max abs error {lse_err:.2e}"
    return out, lse


FP32_TOL = tolerance(torch.float32, tf32_dots=True)  # the Triton kernel multiplies fp32 in TF32 on a GPU

# (B, s_q, H, D_qk, D_v, T, causal, page, num_splits)
CASES = [
    (3, 1, 3, 72, 64, 70, False, None, 1),
    (3, 1, 5, 72, 64, 70, False, None, 3),
    (2, 1, 3, 72, 64, 33, False, None, 8),   # more splits than tiles: empty slices
    (2, 2, 5, 72, 64, 50, True, None, 1),
    (2, 2, 3, 72, 64, 50, True, None, 2),
    (3, 1, 5, 72, 64, 70, False, 16, 2),     # paged, shuffled pages
    (2, 2, 3, 76, 60, 45, True, 7, None),    # odd page size, D_v not a power of two, auto split
    (2, 1, 4, 64, 64, 40, False, None, 2),   # no RoPE part: D_qk == D_v
    (2, 3, 4, 64, 64, 40, True, 8, 2),       # ... causal, paged
    (1, 3, 2, 72, 64, 19, True, None, None),
    (2, 1, 3, 76, 60, 45, False, None, 2),   # contiguous (TMA tiles wider than D_v), D_v not a power of two
]


def _id(c):
    B, s_q, H, D, V, T, causal, page, ns = c
    return (f"B{B}-T{T}-H{H}-D{D}-Dv{V}-sq{s_q}" + ("-causal" if causal else "") + (f"-page{page}" if page else "")
            + f"-split{ns or 'auto'}")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_decode_fp32(case):
    B, s_q, H, D, V, T, causal, page, ns = case
    q, kv, lens, table = make_case(B, s_q, H, D, T, page=page, causal=causal)
    check_decode(q, kv, lens, table, V, causal, ns, FP32_TOL)


@pytest.mark.parametrize("ns", [1, 3], ids=["whole", "split3"])
def test_decode_fp16(ns):
    q, kv, lens, table = make_case(2, 1, 3, 72, 40, dtype=torch.float16)
    check_decode(q, kv, lens, table, 64, False, ns, tolerance(torch.float16))


def test_decode_seqlen_one_everywhere():
    q, kv, lens, _ = make_case(3, 1, 3, 72, 20, lens=torch.ones(3, dtype=torch.int32))
    out, lse = mla_decode(q, kv, None, lens, 64, 0.1, num_splits=4)
    # one visible position: the output is that position's value, the lse its score
    assert_close(out, kv[:, :1, None, :64].expand_as(out), FP32_TOL, "out")  # p = 1 times the value, in TF32
    s = torch.einsum("bshd,bd->bhs", q, kv[:, 0]) * 0.1
    assert_close(lse, s, FP32_TOL, "lse")


@pytest.mark.parametrize("num_splits", [3, 5])
def test_combine_weighs_slices_by_their_lse(num_splits):
    """The split-KV merge alone, against its formula: out = sum_s softmax(lse)_s * partial_s. A slice of lse
    -inf (empty) weighs nothing (its partial here is random, not the 0 a kernel writes); a row with every
    slice empty gives 0 and lse -inf."""
    from attention_kernels.mla import decode

    B, s_q, H, V = 2, 2, 3, 60                    # D_v not a power of two: masked columns
    rows = B * s_q * H                            # (batch, query, head), out's order
    ws_o = torch.randn(rows, num_splits, V, device=DEVICE)
    ws_lse = torch.randn(rows, num_splits, device=DEVICE) * 4   # base 2
    ws_lse[1, 1:] = float("-inf")                 # one slice seen
    ws_lse[4, ::2] = float("-inf")                # every other slice empty
    ws_lse[7] = float("-inf")                     # none seen
    out = torch.empty(B, s_q, H, V, device=DEVICE)
    lse = torch.empty(B, H, s_q, device=DEVICE)
    decode.launch_combine(ws_o, ws_lse, out, lse, num_splits)
    ref_lse = torch.logsumexp(ws_lse * math.log(2), dim=1)
    weights = (ws_lse * math.log(2) - ref_lse[:, None]).exp().nan_to_num(0.0)   # row 7: exp(-inf + inf) -> 0
    got, got_lse = out.reshape(rows, V), lse.transpose(1, 2).reshape(rows)
    assert_close(got, (weights[:, :, None] * ws_o).sum(1), 1e-5, "out")
    assert torch.equal(got[7], torch.zeros(V, device=DEVICE)) and got_lse[7] == float("-inf")
    seen = torch.arange(rows, device=DEVICE) != 7
    assert (got_lse[seen] - ref_lse[seen]).abs().max() < 1e-5


# ---------------------------------------------------------------------------------- paged caches, FlashMLA's layout
PAGE_LENS = [1, 63, 65, 130]   # one position, a page but one, a page and one, two pages and two


def flashmla_pages(kv, lens, page=64, spare=3):
    """kv [B, T, D] as FlashMLA's paged cache: pages [num_blocks, page, D] in shuffled order, `spare` pages no
    sequence uses, NaN in every slot no sequence uses (past each length, and the spare pages), and a block
    table int32 [B, max_blocks] whose entries past each sequence's pages are -1 (never read)."""
    B, T, D = kv.shape
    n_pages = math.ceil(T / page)
    n_blocks = B * n_pages + spare
    cache = torch.full((n_blocks, page, D), float("nan"), device=kv.device, dtype=kv.dtype)
    perm = torch.randperm(n_blocks, device=kv.device)[: B * n_pages].reshape(B, n_pages)
    table = torch.full((B, n_pages), -1, dtype=torch.int32, device=kv.device)
    for b in range(B):
        n = int(lens[b])
        for j in range(math.ceil(n / page)):
            rows = kv[b, j * page: min((j + 1) * page, n)]
            cache[perm[b, j], : rows.shape[0]] = rows
            table[b, j] = perm[b, j]
    return cache, table


@pytest.mark.parametrize("dtype, shape, ns", [
    (torch.float32, "3d", 1), (torch.float32, "4d", 2), (torch.float32, "3d", None), (torch.float16, "4d", 1),
    (torch.float16, "3d", 2),
], ids=["fp32-3d-whole", "fp32-4d-split2", "fp32-3d-split-auto", "fp16-4d-whole", "fp16-3d-split2"])
def test_paged_pages_of_64(dtype, shape, ns):
    """FlashMLA's cache layout through the Triton kernel: pages of 64 in shuffled order, as
    [num_blocks, 64, D] and as [num_blocks, 64, 1, D] (a view, no copy), lengths that end mid-page, NaN in
    every unused page slot and page, -1 in the unused block-table entries."""
    lens = torch.tensor(PAGE_LENS, dtype=torch.int32)
    q, kv, lens, _ = make_case(len(PAGE_LENS), 1, 3, 72, max(PAGE_LENS), dtype=dtype, lens=lens)
    cache, table = flashmla_pages(kv, lens)
    if shape == "4d":
        cache = cache[:, :, None, :]
    tol = FP32_TOL if dtype == torch.float32 else tolerance(torch.float16)
    out, lse = check_decode(q, cache, lens, table, 64, False, ns, tol)
    dense, dense_lse = mla_decode(q, kv, None, lens, 64, 0.13, num_splits=ns)   # the same sequences, contiguous
    assert_close(out, dense, tol, "paged vs dense")


def test_paged_4d_cache_is_read_as_a_view(monkeypatch):
    """The [num_blocks, 64, 1, D] cache reaches the kernel as a view of the same memory."""
    from attention_kernels.mla import decode

    q, kv, lens, _ = make_case(2, 1, 3, 72, 70, lens=torch.tensor([70, 5]))
    cache, table = flashmla_pages(kv, lens)
    cache4 = cache[:, :, None, :]
    seen, launch = [], decode.launch_triton
    monkeypatch.setattr(decode, "launch_triton", lambda *a: seen.append(a[1].data_ptr()) or launch(*a))
    mla_decode(q, cache4, table, lens, 64, 0.1)
    assert seen == [cache4.data_ptr()]


@pytest.mark.parametrize("pages", ["in order", "shuffled"])
def test_paged_benchmark_inputs(pages):
    """The paged benchmark's inputs (attention_kernels/mla/bench.py), built small: in order, the pages are the dense
    cache's own memory; shuffled or not, the kernel reads the same sequences from them."""
    from attention_kernels.mla.bench import _paged_inputs

    case = {"B": 2, "T": 128, "H": 3, "D": 72, "pages": pages}
    q, kv, cache, table, lens = _paged_inputs(case, device=DEVICE, dtype=torch.float32)
    assert cache.shape == (4, 64, 72) and table.shape == (2, 2) and table.dtype == torch.int32
    q2, dense, _, _, _ = _paged_inputs(dict(case, pages="in order"), device=DEVICE, dtype=torch.float32)
    assert torch.equal(q, q2)                     # one seed per case: every provider reads the same numbers
    if pages == "in order":
        assert cache.data_ptr() == kv.data_ptr()
    else:
        assert kv is None and sorted(table.flatten().tolist()) == [0, 1, 2, 3]
    out, _ = check_decode(q, cache, lens, table, 64, False, 1, FP32_TOL)
    ref, _ = mla_decode(q, dense, None, lens, 64, 0.13, num_splits=1)
    assert_close(out, ref, FP32_TOL)


def test_paged_pages_not_back_to_back():
    """Pages of 64 cut out of larger ones (stride(0) != 64 * stride(1)): the Triton kernel reads them right;
    the Gluon kernel, which reads the pages as one matrix of rows, refuses them, saying why."""
    lens = torch.tensor([70, 100], dtype=torch.int32)
    q, kv, lens, _ = make_case(2, 1, 3, 72, 100, lens=lens)
    cache, table = flashmla_pages(kv, lens)
    wide = torch.full((cache.shape[0], 80, 72), float("nan"), device=DEVICE)
    wide[:, :64] = cache
    check_decode(q, wide[:, :64], lens, table, 64, False, 2, FP32_TOL)
    with pytest.raises(ValueError, match="back to back"):
        mla_decode(q, wide[:, :64], table, lens, 64, 0.1, backend="gluon")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B,s_q,H,T", [(2, 1, 128, 17), (1, 2, 4, 37)], ids=["B2-T17-H128-sq1", "B1-T37-H4-sq2"])
def test_absorbed_equals_naive(B, s_q, H, T, dtype):
    """DeepSeek-V3 dimensions: d_c 512, RoPE 64, d_nope 128, d_v 128."""
    c_kv = torch.randn(B, T, 512, dtype=dtype)
    k_pe = torch.randn(B, T, 64, dtype=dtype)
    q_nope = torch.randn(B, s_q, H, 128, dtype=dtype)
    q_pe = torch.randn(B, s_q, H, 64, dtype=dtype)
    W_uk = torch.randn(H, 128, 512, dtype=dtype) / 512 ** 0.5
    W_uv = torch.randn(H, 128, 512, dtype=dtype) / 512 ** 0.5
    scale = yarn_softmax_scale()
    a = mla_absorbed(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, scale)
    n = mla_naive(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, scale)
    assert a.shape == (B, s_q, H, 128) and a.dtype == dtype
    assert_close(a, n, 1e-5 if dtype == torch.float32 else 1e-12)


def _latent_problem(B=2, T=29, H=3, d_c=64, d_r=16, d_nope=32, d_v=32):
    """Small MLA inputs: c_kv, k_pe, q_nope, q_pe (one query token), W_uk, W_uv."""
    return dict(c_kv=torch.randn(B, T, d_c, device=DEVICE), k_pe=torch.randn(B, T, d_r, device=DEVICE),
                q_nope=torch.randn(B, 1, H, d_nope, device=DEVICE), q_pe=torch.randn(B, 1, H, d_r, device=DEVICE),
                W_uk=torch.randn(H, d_nope, d_c, device=DEVICE) / 8, W_uv=torch.randn(H, d_v, d_c, device=DEVICE) / 8)


def test_kernel_path_equals_naive():
    """absorb_query -> mla_decode -> W_uv equals the naive MLA (small dims, fp32)."""
    x = _latent_problem()
    scale = (32 + 16) ** -0.5
    B, T, d_c = x["c_kv"].shape
    lens = torch.full((B,), T, dtype=torch.int32, device=DEVICE)
    q, kv = absorb_query(x["q_nope"], x["q_pe"], x["W_uk"]), latent_cache(x["c_kv"], x["k_pe"])
    out_c, _ = mla_decode(q, kv, None, lens, d_c, scale, num_splits=2)
    assert_close(unabsorb_output(out_c, x["W_uv"]), mla_naive(**x, softmax_scale=scale), FP32_TOL)


def test_yarn_scale():
    assert abs(yarn_softmax_scale() - 0.1352) < 1e-4
    assert abs(yarn_softmax_scale(576, factor=1.0) - 576 ** -0.5) < 1e-12  # no YaRN stretch: mscale = 1
    with pytest.raises(TypeError, match="d_qk"):
        yarn_softmax_scale(192.0)
    with pytest.raises(ValueError, match="factor"):
        yarn_softmax_scale(factor=0.0)


def test_decode_unaligned_rows_use_pointer_loads(monkeypatch):
    """A cache whose row stride is not a multiple of 16 bytes cannot be read by TMA: the Triton kernel must
    be launched on the pointer path (its `tma` argument) and still be right."""
    from attention_kernels.mla import decode

    B, s_q, H, D, V, T = 2, 1, 3, 72, 64, 40
    q, kv, lens, _ = make_case(B, s_q, H, D, T)
    padded = torch.full((B, T, D + 1), float("nan"), device=DEVICE)
    padded[..., :D] = kv
    unaligned = padded[..., :D]                  # row stride 73 floats = 292 bytes
    seen, launch = [], decode.launch_triton

    def spy(*args):
        seen.append(args[-1])                    # tma
        return launch(*args)
    monkeypatch.setattr(decode, "launch_triton", spy)
    check_decode(q, unaligned, lens, None, V, False, 2, FP32_TOL)
    check_decode(q, kv, lens, None, V, False, 2, FP32_TOL)
    assert seen == [False, True]


def test_the_tma_scratch_allocator_is_set_only_around_the_launch():
    from triton.runtime import _allocation

    before = _allocation._allocator.get()
    q, kv, lens, _ = make_case(2, 1, 3, 72, 20)
    check_decode(q, kv, lens, None, 64, False, 1, FP32_TOL)
    assert _allocation._allocator.get() is before


# ---------------------------------------------------------------------------------- strided inputs: right answers
def _strided(kind):
    """A good call whose one input is a strided view (its values as in a dense call)."""
    q, kv, lens, table = make_case(2, 2, 3, 72, 40, page=8 if kind == "block_table" else None, causal=True)
    if kind == "cache_seqlens":                  # every other entry of a longer vector
        lens = torch.stack([lens, torch.zeros_like(lens)], dim=1).reshape(-1)[::2]
    elif kind == "block_table":                  # every other column of a wider table
        table = torch.stack([table, torch.full_like(table, -1)], dim=2).reshape(table.shape[0], -1)[:, ::2]
    elif kind == "kv_cache-rows":                # positions contiguous, not the dims: stride(-1) != 1
        kv = kv.transpose(1, 2).contiguous().transpose(1, 2)
    elif kind == "kv_cache-batch":               # every other sequence of a larger cache
        kv = torch.stack([kv, torch.full_like(kv, float("nan"))], dim=1).reshape(-1, *kv.shape[1:])[::2]
    elif kind == "q":                            # heads and queries swapped in memory
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    return q, kv, lens, table


@pytest.mark.parametrize("kind", ["cache_seqlens", "block_table", "kv_cache-rows", "kv_cache-batch", "q"])
def test_strided_inputs_give_the_right_answer(kind):
    q, kv, lens, table = _strided(kind)
    assert not all(t.is_contiguous() for t in (q, kv, lens) + ((table,) if table is not None else ()))
    for ns in (1, 3):
        check_decode(q, kv, lens, table, 64, True, ns, FP32_TOL)


def test_strided_seqlens_are_not_read_as_dense():
    """torch.tensor([40, 0, 17, 0])[::2] is [40, 17]: read as dense memory it would be [40, 0]."""
    q, kv, _, _ = make_case(2, 1, 3, 72, 40, lens=torch.tensor([40, 40]))
    lens = torch.tensor([40, 0, 17, 0], dtype=torch.int32, device=DEVICE)[::2]
    kv[1, 17:] = float("nan")
    out, _ = mla_decode(q, kv, None, lens, 64, 0.1)
    ref, _ = mla_decode_ref(q, kv, None, lens.contiguous(), 64, 0.1)
    assert_close(out, ref, FP32_TOL)


# ---------------------------------------------------------------------------------- values at masked positions
@pytest.mark.parametrize("ns", [1, 2], ids=["whole", "split2"])
@pytest.mark.parametrize("s_q, page", [(2, None), (3, None), (3, 8)], ids=["sq2", "sq3", "sq3-page8"])
def test_causal_nan_reaches_only_the_queries_that_see_it(s_q, page, ns):
    """Query i sees positions < seqlen - s_q + i + 1, so a NaN at position seqlen - s_q + 1 is seen by queries
    1 .. s_q-1 of its batch element only: exactly those rows are NaN, and every other row equals the
    reference computed with that position zeroed."""
    B, H, D, V, T = 2, 3, 72, 64, 37
    q, kv, lens, _ = make_case(B, s_q, H, D, T, causal=True, lens=torch.tensor([29, T]))
    bad = int(lens[0]) - s_q + 1
    kv[0, bad, 5] = float("nan")
    table, where = None, (0, bad)
    if page:
        kv, table = paged(kv, page)
        where = (int(table[0, bad // page]), bad % page)
    clean = kv.clone()
    clean[where] = 0.0
    out, lse = mla_decode(q, kv, table, lens, V, 0.13, True, num_splits=ns)
    ref, ref_lse = mla_decode_ref(q, clean, table, lens, V, 0.13, True)
    poisoned = torch.zeros(B, s_q, dtype=torch.bool, device=DEVICE)
    poisoned[0, 1:] = True
    assert torch.equal(out.isnan().any(-1).any(-1), poisoned)
    assert torch.equal(lse.isnan().any(1), poisoned)
    assert out[poisoned].isnan().all()
    assert_close(out[~poisoned], ref[~poisoned], FP32_TOL)
    keep = ~poisoned[:, None, :].expand_as(lse)
    assert (lse[keep] - ref_lse[keep]).abs().max() < 10 * FP32_TOL
    # the reference itself keeps the NaN out of the rows that cannot see it
    ref_poisoned, _ = mla_decode_ref(q, kv, table, lens, V, 0.13, True)
    assert torch.equal(ref_poisoned.isnan().any(-1).any(-1), poisoned)


@pytest.mark.parametrize("ns", [1, 3], ids=["whole", "split3"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_lse_of_a_row_that_saw_nan_or_inf(value, ns):
    """A NaN score gives lse NaN (not -inf, which reads as 'saw nothing'); a +inf score gives lse +inf; the
    rows of the other batch element stay finite. The reference says the same."""
    q, kv, lens, _ = make_case(2, 1, 3, 72, 40, lens=torch.tensor([30, 40]))
    q = q.abs()                                   # every product with the +inf below is +inf
    kv[0, 11, 3] = float(value)
    out, lse = mla_decode(q, kv, None, lens, 64, 0.1, num_splits=ns)
    ref, ref_lse = mla_decode_ref(q, kv, None, lens, 64, 0.1)
    special = torch.isnan if value == "nan" else torch.isposinf
    assert special(lse[0]).all() and special(ref_lse[0]).all()
    assert torch.isfinite(lse[1]).all()
    assert out[0].isnan().all() and ref[0].isnan().all()
    assert_close(out[1], ref[1], FP32_TOL)
    assert (lse[1] - ref_lse[1]).abs().max() < 10 * FP32_TOL


# ---------------------------------------------------------------------------------- no input changed
def test_no_input_is_modified():
    q, kv, lens, table = make_case(2, 2, 3, 72, 40, page=8, causal=True)
    x = _latent_problem()
    calls = [
        (mla_decode, dict(q=q, kv_cache=kv, cache_seqlens=lens, softmax_scale=0.1, head_dim_v=64, block_table=table,
                          causal=True, num_splits=2)),
        (mla_decode_ref, dict(q=q, kv_cache=kv, cache_seqlens=lens, softmax_scale=0.1, head_dim_v=64,
                              block_table=table, causal=True)),
        (mla_naive, dict(x, softmax_scale=0.1)),
        (mla_absorbed, dict(x, softmax_scale=0.1)),
        (absorb_query, dict(q_nope=x["q_nope"], q_pe=x["q_pe"], W_uk=x["W_uk"])),
        (latent_cache, dict(c_kv=x["c_kv"], k_pe=x["k_pe"])),
    ]
    for fn, args in calls:
        before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
        fn(**args)
        for k, v in before.items():
            assert torch.equal(args[k].nan_to_num(), v.nan_to_num()), f"{fn.__name__} changed {k}"


# ---------------------------------------------------------------------------------- bad inputs
# Every class of bad input raises before any launch, with the argument named (tests/input_cases.py for the
# classes every family shares, then MLA's own).
def _decode_args(paged_cache=False):
    q, kv, lens, table = make_case(2, 1, 3, 72, 20, page=8 if paged_cache else None)
    return dict(q=q, kv_cache=kv, block_table=table, cache_seqlens=lens, head_dim_v=64, softmax_scale=0.1)


DECODE_TENSORS = ["q", "kv_cache", "cache_seqlens", "block_table"]


def _set(**changes):
    """A mutation: each argument replaced by f(args)."""
    def mutate(args):
        args.update({k: f(args) for k, f in changes.items()})
    return mutate


OTHER_DEVICE = "cpu" if ON_GPU else "meta"  # a device the kernels refuse next to DEVICE
DECODE_CASES = [
    # types and dtypes of the integer tensors, mixed dtypes and devices
    Case("cache_seqlens-int64", _set(cache_seqlens=lambda a: a["cache_seqlens"].long()), TypeError,
         "cache_seqlens has dtype int64"),
    Case("cache_seqlens-float", _set(cache_seqlens=lambda a: a["cache_seqlens"].float()), TypeError,
         "cache_seqlens has dtype float32"),
    Case("block_table-int64", _set(block_table=lambda a: a["block_table"].long()), TypeError,
         "block_table has dtype int64"),
    Case("mixed-dtypes", _set(kv_cache=lambda a: a["kv_cache"].half()), TypeError, "q, kv_cache must share one dtype"),
    Case("mixed-devices", _set(cache_seqlens=lambda a: a["cache_seqlens"].to(OTHER_DEVICE)), ValueError,
         "cache_seqlens (is )?on (cpu|meta)"),
    # shapes
    Case("kv_cache-head-dim", _set(kv_cache=lambda a: a["kv_cache"][..., :70]), ValueError,
         r"kv_cache must have shape \[\*, \*, 72\]"),
    Case("block_table-rows", _set(block_table=lambda a: a["block_table"][:1]), ValueError,
         r"block_table must have shape \[2, \*\]"),
    Case("kv_cache-batch", lambda a: a.update(kv_cache=a["kv_cache"][:1], block_table=None), ValueError,
         r"kv_cache must have shape \[2, \*, 72\]"),
    Case("cache_seqlens-length", _set(cache_seqlens=lambda a: a["cache_seqlens"][:1]), ValueError,
         r"cache_seqlens must have shape \[2\]"),
    Case("kv_cache-4d-two-heads", _set(kv_cache=lambda a: torch.stack([a["kv_cache"]] * 2, dim=2)), ValueError,
         r"kv_cache must have shape \[\*, \*, 1, \*\]"),
    Case("kv_cache-4d-dense", lambda a: a.update(kv_cache=a["kv_cache"][:2, :, None], block_table=None), ValueError,
         "kv_cache must have 3 dims"),
    # empty sizes
    Case("empty-batch", _set(q=lambda a: a["q"][:0], cache_seqlens=lambda a: a["cache_seqlens"][:0],
                             block_table=lambda a: a["block_table"][:0]), ValueError, "q must have every size >= 1"),
    Case("empty-s_q", _set(q=lambda a: a["q"][:, :0]), ValueError, "q must have every size >= 1"),
    Case("empty-heads", _set(q=lambda a: a["q"][:, :, :0]), ValueError, "q must have every size >= 1"),
    Case("empty-pages", _set(kv_cache=lambda a: a["kv_cache"][:, :0]), ValueError,
         "kv_cache must have every size >= 1"),
    Case("empty-block-table", _set(block_table=lambda a: a["block_table"][:, :0]), ValueError,
         "block_table must have every size >= 1"),
    # values the lengths and the pages must have (one device sync, skipped with check_seqlens=False)
    Case("seqlen-0", _set(cache_seqlens=lambda a: torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)),
         ValueError, ">= 1"),
    Case("block_table-too-short", _set(block_table=lambda a: a["block_table"][:, :2]), ValueError,
         "block_table too short"),
    Case("page-outside-the-cache", _set(block_table=lambda a: a["block_table"].clone().fill_(a["kv_cache"].shape[0])),
         ValueError, "page indices outside"),
    Case("causal-shorter-than-s_q", _set(q=lambda a: a["q"].expand(2, 3, 3, 72), causal=lambda a: True,
                                         cache_seqlens=lambda a: torch.tensor([2, 9], dtype=torch.int32,
                                                                              device=DEVICE)),
         ValueError, "causal=True needs"),
    # scalars
    Case("scale-bool", _set(softmax_scale=lambda a: True), TypeError, "softmax_scale must be a float"),
    Case("scale-str", _set(softmax_scale=lambda a: "0.1"), TypeError, "softmax_scale must be a float"),
    Case("scale-zero", _set(softmax_scale=lambda a: 0.0), ValueError, "softmax_scale must be finite and > 0"),
    Case("scale-negative", _set(softmax_scale=lambda a: -1.0), ValueError, "softmax_scale must be finite and > 0"),
    Case("scale-nan", _set(softmax_scale=lambda a: float("nan")), ValueError, "softmax_scale must be finite"),
    Case("scale-inf", _set(softmax_scale=lambda a: float("inf")), ValueError, "softmax_scale must be finite"),
    Case("head_dim_v-too-big", _set(head_dim_v=lambda a: 80), ValueError, "head_dim_v must be in"),
    Case("head_dim_v-zero", _set(head_dim_v=lambda a: 0), ValueError, "head_dim_v must be in"),
    Case("head_dim_v-float", _set(head_dim_v=lambda a: 64.0), TypeError, "head_dim_v must be an int"),
    Case("head_dim_v-bool", _set(head_dim_v=lambda a: True), TypeError, "head_dim_v must be an int"),
    Case("causal-int", _set(causal=lambda a: 1), TypeError, "causal must be a bool"),
]
KERNEL_ONLY_CASES = [
    Case("q-requires-grad", _set(q=lambda a: a["q"].requires_grad_()), ValueError,
         "q requires grad, and mla_decode has no backward"),
    Case("kv_cache-requires-grad", _set(kv_cache=lambda a: a["kv_cache"].requires_grad_()), ValueError,
         "kv_cache requires grad"),
    Case("num_splits-zero", _set(num_splits=lambda a: 0), ValueError, "num_splits must be in"),
    Case("num_splits-bool", _set(num_splits=lambda a: True), TypeError, "num_splits must be an int"),
    Case("num_splits-float", _set(num_splits=lambda a: 2.0), TypeError, "num_splits must be an int"),
    Case("check_seqlens-int", _set(check_seqlens=lambda a: 1), TypeError, "check_seqlens must be a bool"),
    Case("backend-name", _set(backend=lambda a: "cuda"), ValueError, "backend must be one of"),
    Case("gluon-misfit", _set(backend=lambda a: "gluon"), ValueError, "backend='gluon' does not apply here"),
    Case("gluon-page-size", _set(backend=lambda a: "gluon"), ValueError,
         "backend='gluon' does not apply here: its paged cache takes pages of 64 positions.*got page size 8"),
]


@pytest.mark.parametrize("case", bad_input_cases(DECODE_TENSORS, float_tensors=["q", "kv_cache"]) + DECODE_CASES
                         + KERNEL_ONLY_CASES, ids=case_id)
def test_mla_decode_refuses(case):
    expect_refusal(mla_decode, lambda: _decode_args(paged_cache=True), case)


@pytest.mark.parametrize("case", bad_input_cases(DECODE_TENSORS, kernel=False, float_tensors=["q", "kv_cache"])
                         + DECODE_CASES, ids=case_id)
def test_mla_decode_ref_refuses(case):
    expect_refusal(mla_decode_ref, lambda: _decode_args(paged_cache=True), case)


def _verdict(check, args, kernel):
    """What `check` says of a decode call's arguments: the scale, or the exception's type and message."""
    from attention_kernels.mla.inputs import paged_rows

    a = dict(args)
    try:
        a["kv_cache"] = paged_rows(a["kv_cache"], a["block_table"])
        return check(a["q"], a["kv_cache"], a["block_table"], a["cache_seqlens"], a["head_dim_v"],
                     a["softmax_scale"], a.get("causal", False), kernel=kernel)
    except (TypeError, ValueError) as e:
        return type(e), str(e)


CHECK_CASES = [case for case in bad_input_cases(DECODE_TENSORS, float_tensors=["q", "kv_cache"]) + DECODE_CASES
               + KERNEL_ONLY_CASES[:2]]


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "reference"])
def test_the_kept_verdicts_are_the_checks(kernel):
    """check_decode_inputs keeps its verdict per call signature: for the good calls (dense and paged, the default
    scale) and every bad input, seen for the first time or again after the good call, it says what the checks
    say when they run in full."""
    from attention_kernels.mla.inputs import check_decode_inputs

    goods = [_decode_args(), _decode_args(paged_cache=True), dict(_decode_args(), softmax_scale=None)]
    for good in goods:
        verdict = _verdict(check_decode_inputs, good, kernel)
        assert verdict == _verdict(check_decode_inputs.__wrapped__, good, kernel)
        assert isinstance(verdict, float)
    assert goods[2]["softmax_scale"] is None and _verdict(check_decode_inputs, goods[2], kernel) == 72 ** -0.5
    for case in CHECK_CASES:
        for _ in range(2):
            args = _decode_args(paged_cache=True)
            case.mutate(args)
            assert _verdict(check_decode_inputs, args, kernel) == _verdict(check_decode_inputs.__wrapped__, args,
                                                                           kernel), case.id


def test_the_default_scale_is_flashmlas():
    """softmax_scale=None is D_qk ** -0.5 (FlashMLA's default), in the kernels and in the reference."""
    q, kv, lens, _ = make_case(2, 1, 3, 72, 20)
    out, lse = mla_decode(q, kv, None, lens, 64)
    want, want_lse = mla_decode(q, kv, None, lens, 64, 72 ** -0.5)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    ref, _ = mla_decode_ref(q, kv, None, lens, 64)
    assert_close(out, ref, FP32_TOL)


def test_no_grad_lets_an_input_that_requires_grad_through():
    """The kernels have no backward: an input that requires grad is refused where grad mode is on (the case above),
    and taken under torch.no_grad(), where no gradient is asked of it."""
    q, kv, lens, _ = make_case(2, 1, 3, 72, 20)
    want, _ = mla_decode(q, kv, None, lens, 64)
    q.requires_grad_()
    with torch.no_grad():
        out, _ = mla_decode(q, kv, None, lens, 64)
    assert torch.equal(out, want)
    with pytest.raises(ValueError, match="q requires grad"):
        mla_decode(q, kv, None, lens, 64)


def test_mla_decode_ref_refuses_meta_tensors():
    args = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in _decode_args().items()}
    with pytest.raises(ValueError, match="meta device"):
        mla_decode_ref(**args)


def test_mla_decode_ref_takes_fp64():
    q, kv, lens, table = make_case(2, 2, 3, 72, 30, dtype=torch.float64, page=8, causal=True)
    out, lse = mla_decode_ref(q, kv, table, lens, 64, 0.1, True)
    assert out.dtype == lse.dtype == torch.float64 and not out.isnan().any()


# ---------------------------------------------------------------------------------- plans: a call like an earlier one
# With check_seqlens=False, a call's checks and choices are made once per input signature and kept (a plan); a
# later call with that signature only allocates and launches. It must give the same bits, read its own tensors, and
# let no input through that the checks would refuse or that the kernels cannot read as it is.
@pytest.fixture
def fresh_plans(monkeypatch):
    """(the kept plans, empty for this test; a list that grows by one for every call that is checked)."""
    from attention_kernels.mla import interface, planning

    monkeypatch.setattr(planning, "_PLANS", {})
    checked, check = [], interface.check_decode_inputs
    monkeypatch.setattr(interface, "check_decode_inputs", lambda *a, **kw: checked.append(1) or check(*a, **kw))
    return planning._PLANS, checked


def _every_other_sequence(kv):
    """kv's values in every other sequence of a cache twice as large: strided, but read as it is (no copy)."""
    return torch.stack([kv, torch.full_like(kv, float("nan"))], dim=1).reshape(-1, *kv.shape[1:])[::2]


PLANNED = {  # id: (make_case's arguments, D_v, num_splits, whether the cache is every other sequence of a larger one)
    "B2-T40-H3-D72-whole": (dict(B=2, s_q=1, H=3, D=72, T=40), 64, 1, False),
    "B2-T40-H3-D72-fp16-split3": (dict(B=2, s_q=1, H=3, D=72, T=40, dtype=torch.float16), 64, 3, False),
    "B3-T45-H2-D76-sq2-causal-page8-split-auto": (dict(B=3, s_q=2, H=2, D=76, T=45, page=8, causal=True), 60, None,
                                                  False),
    "B2-T40-H3-D72-every-other-sequence-split2": (dict(B=2, s_q=1, H=3, D=72, T=40), 64, 2, True),
}


@pytest.mark.parametrize("case", list(PLANNED.values()), ids=list(PLANNED))
def test_a_planned_call_launches_as_the_first_did(case, fresh_plans):
    """The second call with one signature is not checked again, and gives the first call's bits; a third, with new
    tensors of that signature (new query, shorter lengths), gives the bits of the full path on them."""
    plans, checked = fresh_plans
    shape, V, ns, every_other = case
    q, kv, lens, table = make_case(**shape)
    if every_other:
        kv = _every_other_sequence(kv)
    causal = shape.get("causal", False)
    call = lambda q, lens: mla_decode(q, kv, table, lens, V, 0.13, causal, num_splits=ns,  # noqa: E731
                                      check_seqlens=False)
    first, first_lse = call(q, lens)
    again, again_lse = call(q, lens)
    q2, lens2 = torch.randn_like(q), torch.clamp(lens - 3, min=q.shape[1])
    other, other_lse = call(q2, lens2)
    assert len(plans) == 1 and len(checked) == 1, "the second and third calls were checked again"
    assert torch.equal(again, first) and torch.equal(again_lse, first_lse)
    planned_splits = next(iter(plans.values())).num_splits
    full, full_lse = mla_decode(q2, kv, table, lens2, V, 0.13, causal, num_splits=planned_splits)  # checked
    assert len(checked) == 2
    assert torch.equal(other, full) and torch.equal(other_lse, full_lse)
    ref, _ = mla_decode_ref(q2, kv, table, lens2, V, 0.13, causal)
    assert_close(other, ref, FP32_TOL if q.dtype == torch.float32 else tolerance(torch.float16))


VALUE_CASES = {"seqlen-0", "block_table-too-short", "page-outside-the-cache", "causal-shorter-than-s_q"}  # need a sync
SIGNATURE_CASES = [case for case in bad_input_cases(DECODE_TENSORS, float_tensors=["q", "kv_cache"]) + DECODE_CASES
                   + KERNEL_ONLY_CASES if case.id not in VALUE_CASES]


@pytest.mark.parametrize("case", SIGNATURE_CASES, ids=case_id)
def test_a_plan_lets_no_bad_input_through(case, fresh_plans):
    """Every bad input the checks refuse without reading the lengths is refused as well after a good call with
    otherwise the same inputs, with check_seqlens=False both times (that good call's plan kept)."""
    plans, _ = fresh_plans
    good = dict(_decode_args(paged_cache=True), check_seqlens=False)
    mla_decode(**good)
    assert len(plans) == 1
    expect_refusal(mla_decode, lambda: dict(good), case)


@pytest.mark.parametrize("name, good, bad, exc, match", [
    ("softmax_scale", 1.0, True, TypeError, "softmax_scale must be a float"),
    ("head_dim_v", 64, 64.0, TypeError, "head_dim_v must be an int"),
    ("causal", False, 0, TypeError, "causal must be a bool"),
    ("num_splits", 1, True, TypeError, "num_splits must be an int"),
], ids=["scale-True-after-1.0", "head_dim_v-64.0-after-64", "causal-0-after-False", "num_splits-True-after-1"])
def test_a_plan_tells_equal_scalars_of_other_types_apart(name, good, bad, exc, match, fresh_plans):
    """True == 1 == 1.0 and False == 0, as dict keys too: the plan of a good call must not take a refused one."""
    plans, _ = fresh_plans
    args = dict(_decode_args(), check_seqlens=False, num_splits=2)
    mla_decode(**dict(args, **{name: good}))
    assert len(plans) == 1
    with pytest.raises(exc, match=match):
        mla_decode(**dict(args, **{name: bad}))


def test_flashmla_4d_pages_through_a_plan(fresh_plans, monkeypatch):
    """FlashMLA's [num_blocks, 64, 1, D] cache is planned as it is given, and each call's launch still reads the
    [num_blocks, 64, D] view of that memory; the bits are those of the 3D cache through the full path."""
    from attention_kernels.mla import decode

    plans, checked = fresh_plans
    lens = torch.tensor(PAGE_LENS, dtype=torch.int32)
    q, kv, lens, _ = make_case(len(PAGE_LENS), 1, 3, 72, max(PAGE_LENS), lens=lens)
    cache, table = flashmla_pages(kv, lens)
    cache4 = cache[:, :, None, :]
    seen, launch = [], decode.launch_triton
    monkeypatch.setattr(decode, "launch_triton", lambda *a: seen.append((a[1].dim(), a[1].data_ptr())) or launch(*a))
    call = lambda: mla_decode(q, cache4, table, lens, 64, 0.13, num_splits=2, check_seqlens=False)  # noqa: E731
    first, first_lse = call()
    again, again_lse = call()
    assert len(plans) == 1 and len(checked) == 1
    assert seen == [(3, cache4.data_ptr())] * 2
    full, full_lse = mla_decode(q, cache, table, lens, 64, 0.13, num_splits=2)
    for out, lse in ((first, first_lse), (again, again_lse)):
        assert torch.equal(out, full) and torch.equal(lse, full_lse)


@pytest.mark.parametrize("kind", ["cache_seqlens", "block_table", "kv_cache-rows", "q", "q-off-16-bytes"])
def test_inputs_that_are_copied_get_no_plan(kind, fresh_plans):
    """An input the kernels cannot read as it is (strided that way, or q off a 16-byte boundary) is copied on every
    call, even after a call with dense inputs of the same shapes has been planned; the bits are that call's."""
    plans, checked = fresh_plans
    if kind == "q-off-16-bytes":
        q, kv, lens, table = make_case(2, 2, 3, 72, 40, causal=True)
        q = off_a_16_byte_boundary(q)
    else:
        q, kv, lens, table = _strided(kind)
    dense = [None if t is None else t.clone(memory_format=torch.contiguous_format) for t in (q, kv, lens, table)]
    want, want_lse = mla_decode(*dense[:2], dense[3], dense[2], 64, 0.13, True, num_splits=2, check_seqlens=False)
    assert len(plans) == 1
    for _ in range(2):
        out, lse = mla_decode(q, kv, table, lens, 64, 0.13, True, num_splits=2, check_seqlens=False)
        assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert len(plans) == 1 and len(checked) == 3, "a call whose input was copied was planned"


def test_check_seqlens_is_never_planned(fresh_plans):
    """check_seqlens=True reads the lengths on every call (a bad one is refused after a planned good call with the
    same signature), and keeps no plan."""
    plans, checked = fresh_plans
    args = dict(_decode_args(paged_cache=True), num_splits=2)
    mla_decode(**args)
    assert not plans
    mla_decode(**args, check_seqlens=False)
    mla_decode(**args)
    assert len(plans) == 1 and len(checked) == 3
    args["cache_seqlens"] = torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=">= 1"):
        mla_decode(**args)


def test_a_plan_relaunches_with_each_calls_tensors(fresh_plans, monkeypatch):
    """The route a plan takes on a GPU once its launches have gone straight to the C launcher
    (`attention_kernels.launch.relaunches`), played on the CPU: the launch functions report their launches as direct ones,
    whose relaunch is the launch function again with the arguments it is handed. A planned call reads the stream
    once and hands each launch its own tensors (its inputs; out, lse and the workspace fresh) with the first call's
    other arguments, and gives the full path's bits; with a profiler's launch hook installed it calls the launch
    functions again."""
    from attention_kernels.launch import Launched
    from attention_kernels.mla import decode, planning

    plans, checked = fresh_plans
    called, relaunched = [], []

    class Direct:  # a compiled kernel's DirectLaunch, played by its launch function
        instrumented = False

        def __init__(self, launch):
            self.launch = launch

        def on(self, stream, grid, args):
            relaunched.append((stream, args))
            self.launch(*args)

    def reporting(launch):
        def launch_function(*args):
            called.append(launch.__name__)
            launch(*args)
            return Launched(Direct(launch), (1, 1, 1), args)
        return launch_function
    monkeypatch.setattr(decode, "launch_triton", reporting(decode.launch_triton))
    monkeypatch.setattr(decode, "launch_combine", reporting(decode.launch_combine))
    monkeypatch.setattr(planning, "launch_stream", lambda: (0, 7))
    hooked = [False]
    monkeypatch.setattr(planning, "launch_hooked", lambda: hooked[0])
    q, kv, lens, table = make_case(2, 1, 3, 72, 40, page=8)
    call = lambda q: mla_decode(q, kv, table, lens, 64, 0.13, num_splits=3, check_seqlens=False)  # noqa: E731
    call(q)
    assert called == ["launch_triton", "launch_combine"] and not relaunched
    q2 = torch.randn_like(q)
    out, lse = call(q2)
    assert len(called) == 2 and len(checked) == 1 and len(plans) == 1
    (stream, decode_args), (combine_stream, combine_args) = relaunched
    assert stream == combine_stream == (0, 7)
    # launch_triton's arguments: q, kv_cache, block_table, cache_seqlens, scale, causal, out, lse, ws_o, ws_lse,
    # then num_splits, tma; the combine's: ws_o, ws_lse, out, lse, num_splits
    assert [a is b for a, b in zip(decode_args[:4] + decode_args[6:8], (q2, kv, table, lens, out, lse))] == [True] * 6
    assert decode_args[4:6] == [0.13, False] and decode_args[10:] == [3, False]
    ws_o, ws_lse = decode_args[8:10]
    assert ws_o.shape == (2, 3, 3, 64) and ws_lse.shape == (2, 3, 3)
    assert [a is b for a, b in zip(combine_args[:4], (ws_o, ws_lse, out, lse))] == [True] * 4 and combine_args[4] == 3
    full, full_lse = mla_decode(q2, kv, table, lens, 64, 0.13, num_splits=3)
    assert torch.equal(out, full) and torch.equal(lse, full_lse)
    hooked[0] = True
    del called[:]
    hooked_out, _ = call(q2)
    assert called == ["launch_triton", "launch_combine"] and len(relaunched) == 2
    assert torch.equal(hooked_out, full)


def _gluon_args():
    dtype = torch.bfloat16 if ON_GPU else torch.float32
    q, kv, lens, _ = make_case(2, 1, 64, 576, 20, dtype=dtype)
    return dict(q=q, kv_cache=kv, block_table=None, cache_seqlens=lens, softmax_scale=0.1)


GLUON_CASES = [
    Case("fp16", _set(q=lambda a: a["q"].half(), kv_cache=lambda a: a["kv_cache"].half()), TypeError,
         "q has dtype float16; supported: bfloat16"),
    Case("scale-negative", _set(softmax_scale=lambda a: -1.0), ValueError, "softmax_scale must be finite and > 0"),
    Case("mixed-devices", _set(cache_seqlens=lambda a: a["cache_seqlens"].to(OTHER_DEVICE)), ValueError,
         "cache_seqlens is on"),
    Case("empty-batch", _set(q=lambda a: a["q"][:0], cache_seqlens=lambda a: a["cache_seqlens"][:0],
                             kv_cache=lambda a: a["kv_cache"][:0]), ValueError, "q must have every size >= 1"),
]


@pytest.mark.parametrize("case", bad_input_cases(["q", "kv_cache", "cache_seqlens"], float_tensors=["q", "kv_cache"])
                         + GLUON_CASES, ids=case_id)
def test_mla_decode_gluon_refuses(case):
    expect_refusal(mla_decode_gluon, _gluon_args, case)


def test_mla_decode_gluon_off_hopper():
    """Off a Hopper GPU every call is refused: no bf16 here (the interpreter), or no sm_90 there."""
    if ON_GPU and torch.cuda.get_device_capability()[0] == 9:
        pytest.skip("this GPU is a Hopper: the Gluon kernel runs (see the gpu tests)")
    with pytest.raises((TypeError, ValueError), match="bfloat16|Hopper"):
        mla_decode_gluon(**_gluon_args())


REFERENCES = {  # name: (function, its tensor arguments, whether it takes softmax_scale)
    "mla_naive": (mla_naive, ["c_kv", "k_pe", "q_nope", "q_pe", "W_uk", "W_uv"], True),
    "mla_absorbed": (mla_absorbed, ["c_kv", "k_pe", "q_nope", "q_pe", "W_uk", "W_uv"], True),
    "absorb_query": (absorb_query, ["q_nope", "q_pe", "W_uk"], False),
    "latent_cache": (latent_cache, ["c_kv", "k_pe"], False),
    "unabsorb_output": (unabsorb_output, ["out_c", "W_uv"], False),
}
REFERENCE_CASES = [  # (the arguments a case changes, the case): it applies where the function has them all
    (("W_uk", "q_nope"), Case("W_uk-heads", _set(W_uk=lambda a: a["W_uk"][:2]), ValueError,
                              r"W_uk must have shape \[H, d_nope, d_c\]")),
    (("W_uk", "c_kv"), Case("W_uk-d_c", _set(W_uk=lambda a: a["W_uk"][..., :60]), ValueError,
                            r"W_uk must have shape")),
    (("k_pe", "c_kv"), Case("k_pe-length", _set(k_pe=lambda a: a["k_pe"][:, :20]), ValueError,
                            r"k_pe must have shape \[B, T, d_r\]")),
    (("q_pe", "q_nope"), Case("q_pe-heads", _set(q_pe=lambda a: a["q_pe"][:, :, :1]), ValueError,
                              r"q_pe must have shape \[B, s_q, H, d_r\]")),
    (("W_uv", "W_uk"), Case("W_uv-heads", _set(W_uv=lambda a: a["W_uv"][:1]), ValueError,
                            r"W_uv must have shape \[H, d_v, d_c\]")),
    (("W_uv", "out_c"), Case("out_c-d_c", _set(out_c=lambda a: a["out_c"][..., :8]), ValueError,
                             r"W_uv must have shape \[H, d_v, d_c\]")),
    (("c_kv", "k_pe"), Case("empty-cache", _set(c_kv=lambda a: a["c_kv"][:, :0], k_pe=lambda a: a["k_pe"][:, :0]),
                            ValueError, "c_kv must have every size >= 1")),
    (("q_nope", "q_pe"), Case("empty-s_q", _set(q_nope=lambda a: a["q_nope"][:, :0], q_pe=lambda a: a["q_pe"][:, :0]),
                              ValueError, "q_nope must have every size >= 1")),
    (("out_c",), Case("empty-out_c", _set(out_c=lambda a: a["out_c"][:0]), ValueError,
                      "out_c must have every size >= 1")),
    (("c_kv", "k_pe"), Case("mixed-dtypes", _set(k_pe=lambda a: a["k_pe"].double()), TypeError,
                            "must share one dtype")),
    (("W_uv", "out_c"), Case("mixed-dtypes", _set(W_uv=lambda a: a["W_uv"].half()), TypeError,
                             "must share one dtype")),
    (("softmax_scale",), Case("scale-None", _set(softmax_scale=lambda a: None), TypeError,
                              "softmax_scale is required")),
    (("softmax_scale",), Case("scale-bool", _set(softmax_scale=lambda a: False), TypeError,
                              "softmax_scale must be a float")),
    (("softmax_scale",), Case("scale-zero", _set(softmax_scale=lambda a: 0), ValueError,
                              "softmax_scale must be finite and > 0")),
    (("softmax_scale",), Case("scale-nan", _set(softmax_scale=lambda a: float("nan")), ValueError,
                              "softmax_scale must be finite")),
]


def _reference_cases():
    """(function name, case): the shared classes for each function's tensors, then MLA's own that apply."""
    for name, (_, tensors, scaled) in REFERENCES.items():
        takes = set(tensors) | ({"softmax_scale"} if scaled else set())
        own = [case for changes, case in REFERENCE_CASES if set(changes) <= takes]
        for case in bad_input_cases(tensors, kernel=False) + own:
            yield pytest.param(name, case, id=f"{name}-{case.id}")


def _reference_args(name):
    x = _latent_problem()
    if name in ("mla_naive", "mla_absorbed"):
        return dict(x, softmax_scale=0.1)
    if name == "unabsorb_output":
        return dict(out_c=torch.randn(2, 1, 3, 64, device=DEVICE), W_uv=x["W_uv"])
    return {k: x[k] for k in REFERENCES[name][1]}


@pytest.mark.parametrize("name, case", list(_reference_cases()))
def test_references_refuse(name, case):
    expect_refusal(REFERENCES[name][0], lambda: _reference_args(name), case)


# ---------------------------------------------------------------------------------- GPU: DeepSeek-V3 dims, bf16
BF16_TOL = tolerance(torch.bfloat16)
GPU_CASES = [
    # (B, s_q, H, T, causal, page, num_splits)
    (1, 1, 128, 4096, False, None, None),
    (1, 1, 128, 4096, False, None, 1),
    (4, 1, 128, 3001, False, None, None),
    (3, 2, 128, 2049, True, None, None),
    (5, 1, 16, 1500, False, None, None),
    (4, 2, 16, 1000, True, 64, None),
    (6, 1, 128, 2500, False, 64, 4),
    (128, 1, 128, 1024, False, None, None),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"B{c[0]}-T{c[3]}-H{c[2]}-D576-sq{c[1]}"
                         + ("-causal" if c[4] else "") + (f"-page{c[5]}" if c[5] else "") + f"-split{c[6] or 'auto'}")
def test_decode_gpu_bf16(case):
    B, s_q, H, T, causal, page, ns = case
    q, kv, lens, table = make_case(B, s_q, H, 576, T, dtype=torch.bfloat16, page=page, causal=causal)
    check_decode(q, kv, lens, table, 512, causal, ns, BF16_TOL, scale=yarn_softmax_scale() / 4)


@pytest.mark.gpu
def test_causal_nan_gpu_bf16():
    """The causal path's masking (dot_visible) at DeepSeek's dims, in the GPU's tile configuration."""
    q, kv, lens, _ = make_case(2, 2, 128, 576, 300, dtype=torch.bfloat16, causal=True, lens=torch.tensor([200, 300]))
    clean = kv.clone()
    clean[0, 199] = 0.0
    kv[0, 199, 7] = float("nan")                  # seen by query 1 of batch element 0 only
    out, lse = mla_decode(q, kv, None, lens, 512, 0.1, True)
    ref, _ = mla_decode_ref(q, clean, None, lens, 512, 0.1, True)
    assert out[0, 1].isnan().all() and lse[0, :, 1].isnan().all()
    assert not out[0, 0].isnan().any() and not out[1].isnan().any()
    assert_close(out[0, 0], ref[0, 0], BF16_TOL)
    assert_close(out[1], ref[1], BF16_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 3, 40], ids=["whole", "split3", "split40"])
def test_gluon_gpu_matches_reference_and_triton(num_splits):
    """The hand-scheduled Hopper kernel: lengths around its 64-position tiles, NaN past every length; whole
    sequences, and slices (40 slices leave the short sequences' last slices empty)."""
    lens = torch.tensor([1, 63, 64, 65, 129, 1000, 2047, 3000], dtype=torch.int32)
    q, kv, lens, _ = make_case(8, 1, 128, 576, 3000, dtype=torch.bfloat16, lens=lens)
    scale = yarn_softmax_scale()
    out, lse = mla_decode(q, kv, None, lens, softmax_scale=scale, backend="gluon", num_splits=num_splits)
    ref, ref_lse = mla_decode_ref(q, kv, None, lens, 512, scale, False)
    tri, tri_lse = mla_decode(q, kv, None, lens, softmax_scale=scale, backend="triton", num_splits=num_splits)
    assert not out.isnan().any() and not lse.isnan().any()
    assert_close(out, ref, BF16_TOL, "out vs reference")
    assert (lse - ref_lse).abs().max().item() < 1e-3
    assert_close(out, tri, BF16_TOL, "out vs Triton")
    assert (lse - tri_lse).abs().max().item() < 1e-3
    if num_splits == 1:
        direct, direct_lse = mla_decode_gluon(q, kv, None, lens, softmax_scale=scale)
        assert torch.equal(direct, out) and torch.equal(direct_lse, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 3], ids=["whole", "split3"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_gluon_gpu_lse_of_a_row_that_saw_nan_or_inf(value, num_splits):
    q, kv, lens, _ = make_case(2, 1, 128, 576, 700, dtype=torch.bfloat16, lens=torch.tensor([500, 700]))
    q = q.abs()
    kv[0, 300, 3] = float(value)
    out, lse = mla_decode(q, kv, None, lens, softmax_scale=0.1, backend="gluon", num_splits=num_splits)
    special = torch.isnan if value == "nan" else torch.isposinf
    assert special(lse[0]).all() and torch.isfinite(lse[1]).all()
    assert out[0].isnan().all() and not out[1].isnan().any()


@pytest.mark.gpu
def test_gluon_gpu_one_position_cache():
    """T_max = 1 and no split: integer arguments equal to 1 must not become constants (they cannot cross
    into the kernel's partitions)."""
    q, kv, lens, _ = make_case(2, 1, 128, 576, 1, dtype=torch.bfloat16, lens=torch.tensor([1, 1]))
    out, lse = mla_decode(q, kv, None, lens, softmax_scale=0.1, backend="gluon", num_splits=1)
    ref, ref_lse = mla_decode_ref(q, kv, None, lens, 512, 0.1, False)
    assert_close(out, ref, BF16_TOL)
    assert (lse - ref_lse).abs().max().item() < 1e-3


GLUON_PAGED_LENS = [1, 63, 64, 65, 129, 130, 1000, 3000]


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 3, 40, None], ids=["whole", "split3", "split40", "split-auto"])
@pytest.mark.parametrize("shape", ["3d", "4d"])
def test_gluon_gpu_paged(shape, num_splits):
    """The Gluon kernel on FlashMLA's paged cache (pages of 64, shuffled, NaN in every unused slot and page,
    -1 past each sequence's pages in the block table): right against the reference, equal bit for bit to
    the same kernel on the same sequences stored contiguously (the same tiles meet the same products), and
    close to the Triton kernel on the same pages. 40 slices leave the short sequences' last slices empty."""
    lens = torch.tensor(GLUON_PAGED_LENS, dtype=torch.int32)
    q, kv, lens, _ = make_case(len(lens), 1, 128, 576, int(lens.max()), dtype=torch.bfloat16, lens=lens)
    cache, table = flashmla_pages(kv, lens)
    if shape == "4d":
        cache = cache[:, :, None, :]
    scale = yarn_softmax_scale()
    out, lse = mla_decode(q, cache, table, lens, softmax_scale=scale, backend="gluon", num_splits=num_splits)
    ref, ref_lse = mla_decode_ref(q, cache, table, lens, 512, scale, False)
    assert not out.isnan().any() and not lse.isnan().any()
    assert_close(out, ref, BF16_TOL, "out vs reference")
    assert (lse - ref_lse).abs().max().item() < 1e-3
    dense, dense_lse = mla_decode(q, kv, None, lens, softmax_scale=scale, backend="gluon", num_splits=num_splits)
    assert torch.equal(out, dense) and torch.equal(lse, dense_lse), "paged and dense Gluon results differ"
    tri, tri_lse = mla_decode(q, cache, table, lens, softmax_scale=scale, backend="triton", num_splits=num_splits)
    assert_close(out, tri, BF16_TOL, "out vs Triton")
    if num_splits == 1:
        direct, direct_lse = mla_decode_gluon(q, cache, table, lens, softmax_scale=scale)
        assert torch.equal(direct, out) and torch.equal(direct_lse, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 3], ids=["whole", "split3"])
def test_gluon_gpu_more_sequences_than_sms(num_splits):
    """300 short sequences of random lengths (odd and even tile counts; with 3 slices, short ones leave slices
    empty): more work items than the GPU has SMs, dense and paged, against the reference and paged equal to dense."""
    torch.manual_seed(3)
    lens = torch.randint(1, 700, (300, ), dtype=torch.int32)
    q, kv, lens, _ = make_case(len(lens), 1, 128, 576, int(lens.max()), dtype=torch.bfloat16, lens=lens)
    cache, table = flashmla_pages(kv, lens)
    scale = yarn_softmax_scale()
    ref, ref_lse = mla_decode_ref(q, kv, None, lens, 512, scale, False)
    dense, dense_lse = mla_decode(q, kv, None, lens, softmax_scale=scale, backend="gluon", num_splits=num_splits)
    paged, paged_lse = mla_decode(q, cache, table, lens, softmax_scale=scale, backend="gluon", num_splits=num_splits)
    assert not dense.isnan().any() and not dense_lse.isnan().any()
    assert_close(dense, ref, BF16_TOL, "out vs reference")
    assert (dense_lse - ref_lse).abs().max().item() < 1e-3
    assert torch.equal(paged, dense) and torch.equal(paged_lse, dense_lse), "paged and dense Gluon results differ"


@pytest.mark.gpu
def test_gluon_gpu_paged_one_column_block_table():
    """max_blocks = 1: the block table's row stride is 1, which must not become a constant (it crosses into
    the copy warp's partition)."""
    lens = torch.tensor([1, 40, 64], dtype=torch.int32)
    q, kv, lens, _ = make_case(3, 1, 64, 576, 64, dtype=torch.bfloat16, lens=lens)
    cache, table = flashmla_pages(kv, lens)
    assert table.shape[1] == 1
    out, lse = mla_decode(q, cache, table, lens, softmax_scale=0.1, backend="gluon", num_splits=1)
    ref, ref_lse = mla_decode_ref(q, cache, table, lens, 512, 0.1, False)
    assert_close(out, ref, BF16_TOL)
    assert (lse - ref_lse).abs().max().item() < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_gluon_gpu_repeat_and_graph_replay(paged, monkeypatch):
    """A whole-sequence call compiles the kernel; a split call then launches it directly (no dispatcher) and
    is right; its repeat reuses the workspace; a CUDA graph captures the same call. All give the first split
    call's result, bit for bit; the graph's replay follows new values written into its inputs."""
    from attention_kernels import launch
    monkeypatch.setattr(launch, "_DIRECT", {})
    lens = torch.tensor([100, 2000], dtype=torch.int32)
    q, kv, lens, _ = make_case(2, 1, 128, 576, 2000, dtype=torch.bfloat16, lens=lens)
    table = None
    if paged:
        kv, table = flashmla_pages(kv, lens)
    mla_decode(q, kv, table, lens, softmax_scale=0.1, num_splits=1, check_seqlens=False)
    call = lambda: mla_decode(q, kv, table, lens, softmax_scale=0.1, num_splits=4, check_seqlens=False)  # noqa: E731
    first, first_lse = call()
    ref, ref_lse = mla_decode_ref(q, kv, table, lens, 512, 0.1, False)
    assert_close(first, ref, BF16_TOL, "a split call launched directly after a whole one")
    assert (first_lse - ref_lse).abs().max().item() < 1e-3
    again, again_lse = call()
    assert torch.equal(first, again) and torch.equal(first_lse, again_lse)
    check_graph_replay(call, q)


@pytest.mark.gpu
def test_gluon_gpu_direct_launch_streams_and_hooks():
    """The direct launches (`attention_kernels.launch.DirectLaunch`) keep one TMA scratch per stream: calls on two streams
    at once, each many times over, give the result of a call on the default stream, bit for bit. With a launch
    hook installed (as a profiler does) the launches go through Triton's own path, and the hook sees both."""
    from triton import knobs

    lens = torch.tensor([700, 3000, 1, 64], dtype=torch.int32)
    q, kv, lens, _ = make_case(4, 1, 128, 576, 3000, dtype=torch.bfloat16, lens=lens)
    call = lambda: mla_decode(q, kv, None, lens, softmax_scale=0.1, num_splits=3, check_seqlens=False)  # noqa: E731
    first, first_lse = call()
    first, first_lse = call()   # launched directly
    streams = [torch.cuda.Stream() for _ in range(2)]
    results = []
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    for _ in range(20):
        for stream in streams:
            with torch.cuda.stream(stream):
                results.append(call())
    torch.cuda.synchronize()
    assert all(torch.equal(o, first) and torch.equal(l_, first_lse) for o, l_ in results)
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"])
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        hooked, hooked_lse = call()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    torch.cuda.synchronize()
    assert torch.equal(hooked, first) and torch.equal(hooked_lse, first_lse)
    assert seen == ["_mla_decode_ws_kernel", "_mla_combine_kernel"], seen


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 4])
def test_gluon_gpu_planned_call_equals_the_full_path(B, monkeypatch):
    """A Gluon call on FlashMLA's 4D pages, with slices, planned: the first call takes the full path and keeps the
    plan with both launches; the next ones launch straight through the C launcher (no launch function called) and
    give the full path's bits, on the first call's query and on a new one; so does a CUDA graph capture of the
    planned call, and its replay."""
    from attention_kernels.mla import gluon_decode, planning

    monkeypatch.setattr(planning, "_PLANS", {})
    calls, launch = [], gluon_decode.launch_gluon
    monkeypatch.setattr(gluon_decode, "launch_gluon", lambda *a: calls.append(1) or launch(*a))
    lens = torch.tensor([3000, 1, 65, 2047][:B], dtype=torch.int32)
    q, kv, lens, _ = make_case(B, 1, 128, 576, 3000, dtype=torch.bfloat16, lens=lens)
    cache, table = flashmla_pages(kv, lens)
    cache = cache[:, :, None, :]
    call = lambda q: mla_decode(q, cache, table, lens, softmax_scale=0.1, check_seqlens=False)  # noqa: E731
    first, first_lse = call(q)
    plan, = planning._PLANS.values()
    assert plan.gluon and plan.num_splits > 1 and len(plan.relaunches) == 2 and len(calls) == 1
    again, again_lse = call(q)
    q2 = torch.randn_like(q)
    other, other_lse = call(q2)
    assert len(calls) == 1, "a planned call went through the launch function"
    assert torch.equal(again, first) and torch.equal(again_lse, first_lse)
    full, full_lse = mla_decode(q2, cache, table, lens, softmax_scale=0.1, num_splits=plan.num_splits)  # checked
    assert torch.equal(other, full) and torch.equal(other_lse, full_lse)
    ref, ref_lse = mla_decode_ref(q2, cache, table, lens, 512, 0.1, False)
    assert_close(other, ref, BF16_TOL)
    assert (other_lse - ref_lse).abs().max().item() < 1e-3
    check_graph_replay(lambda: call(q), q)
    assert len(calls) == 2 and len(planning._PLANS) == 1   # (the checked call), and the capture was planned


def check_graph_replay(call, q):
    """`call()` -> (out, lse) captured in a CUDA graph: the replay equals an eager call, and after new values
    are written into q (the same memory) it equals an eager call on them."""
    first, first_lse = call()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):   # warm up outside the capture
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse = call()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(g_out, first) and torch.equal(g_lse, first_lse)
    q.copy_(torch.randn_like(q))
    graph.replay()
    new, new_lse = call()
    torch.cuda.synchronize()
    assert torch.equal(g_out, new) and torch.equal(g_lse, new_lse)


@pytest.mark.gpu
def test_gluon_gpu_direct_call_refuses_what_it_cannot_run():
    q, kv, lens, _ = make_case(2, 1, 3, 576, 20, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="the Gluon kernel does not apply here: it needs s_q = 1"):
        mla_decode_gluon(q, kv, None, lens, softmax_scale=0.1)


def off_a_16_byte_boundary(t):
    """A copy of t whose memory starts one element past a 16-byte boundary (a view into a larger buffer)."""
    flat = torch.empty(t.numel() + 1, device=t.device, dtype=t.dtype)
    shifted = flat[1:].view_as(t).copy_(t)
    assert shifted.data_ptr() % 16 != 0
    return shifted


def test_query_off_a_16_byte_boundary_is_copied_to_one():
    """`dense_inputs` hands the kernels a q whose base is 16-byte aligned (the Gluon kernel's copy engine needs it),
    copying only a q that is not; the values are q's."""
    from attention_kernels.mla.planning import dense_inputs

    q, kv, lens, _ = make_case(2, 1, 4, 72, 20)
    shifted = off_a_16_byte_boundary(q)
    dense_q = dense_inputs(shifted, kv, None, lens)[0]
    assert dense_q.data_ptr() % 16 == 0 and torch.equal(dense_q, q)
    assert dense_inputs(q, kv, None, lens)[0].data_ptr() == q.data_ptr()   # an aligned q is passed on as it is


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "gluon", "triton"])
def test_gpu_query_off_a_16_byte_boundary(backend):
    """The Gluon kernel copies q with the copy engine, which needs a 16-byte aligned base: a q that starts 2 bytes
    past one (a view into a larger buffer) is copied first, and every backend gives the bits of an aligned q."""
    q, kv, lens, _ = make_case(2, 1, 128, 576, 300, dtype=torch.bfloat16)
    shifted = off_a_16_byte_boundary(q)
    out, lse = mla_decode(shifted, kv, None, lens, softmax_scale=0.1, backend=backend)
    aligned, aligned_lse = mla_decode(q, kv, None, lens, softmax_scale=0.1, backend=backend)
    assert torch.equal(out, aligned) and torch.equal(lse, aligned_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("change, gluon", [
    ({}, True),                                  # B=8, H=128, bf16, s_q=1, contiguous: the serving case
    ({"s_q": 2}, False),
    ({"dtype": torch.float16}, False),
    ({"page": 64}, True),
    ({"page": 16}, False),
    ({"num_splits": 2}, True),
], ids=["serving", "s_q-2", "fp16", "paged-64", "paged-16", "split"])
def test_gpu_auto_backend_choice(change, gluon, monkeypatch):
    from attention_kernels.mla import gluon_decode
    calls, launch = [], gluon_decode.launch_gluon
    monkeypatch.setattr(gluon_decode, "launch_gluon", lambda *a: calls.append(1) or launch(*a))
    q, kv, lens, table = make_case(8, change.get("s_q", 1), 128, 576, 256, dtype=change.get("dtype", torch.bfloat16),
                                   page=change.get("page"))
    check_decode(q, kv, lens, table, 512, False, change.get("num_splits"), BF16_TOL, scale=yarn_softmax_scale())
    assert bool(calls) == gluon


def test_gluon_kernel_compiles_for_hopper_without_spills():
    """No GPU needed: compile the Gluon kernel for sm_90a, for a dense and for a paged cache, and let ptxas
    judge both (no spills, no serialized wgmma, shared memory within 227 KB, the same wgmma work in both).
    Catches a broken Gluon change on any machine."""
    import subprocess
    import sys
    from pathlib import Path

    from attention_kernels.launch import TESTED_TRITON, triton_tested
    if not triton_tested():
        pytest.skip(f"the Gluon kernel runs on Triton {', '.join(TESTED_TRITON)} only (attention_kernels.launch.TESTED_TRITON)")

    script = Path(__file__).resolve().parent.parent / "scripts" / "mla_gluon_compile.py"  # dense and paged
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "registers" in done.stdout and "OK" in done.stdout


# ---------------------------------------------------------------------------------- the Gluon kernel's Tritons
@pytest.mark.parametrize("found, misfit", [("3.6.0", None),
                                           ("3.9.0", "it was measured on Triton 3.6 only, and this is Triton 3.9.0")])
def test_gluon_kernel_takes_the_serving_case_on_a_tested_triton_only(found, misfit, monkeypatch):
    """The Gluon kernel's judge (`gluon_misfit`) on the serving case, as on a Hopper GPU (played on the CPU): a
    Triton the kernel was not measured on is a reason not to take the call, so that backend='auto' takes the Triton
    kernel (warning once per process: `attention_kernels.launch.fast_paths_on`)."""
    import triton

    from attention_kernels import launch
    from attention_kernels.mla import planning

    monkeypatch.setattr(planning, "is_hopper", lambda device: True)
    monkeypatch.setattr(triton, "__version__", found)
    monkeypatch.setattr(launch, "_untested_warned", True)
    q = torch.randn(2, 1, 64, 576, dtype=torch.bfloat16)
    kv = torch.randn(2, 128, 576, dtype=torch.bfloat16)
    assert planning.gluon_misfit(q, kv, None, 512) == misfit


def test_backend_gluon_on_an_untested_triton_is_refused_by_name(monkeypatch):
    """backend='gluon' where the Triton is not a tested one: ValueError naming the tested releases and the one found
    (the shapes and the GPU fit: the GPU played on the CPU)."""
    import triton

    from attention_kernels import launch
    from attention_kernels.mla import planning

    monkeypatch.setattr(planning, "is_hopper", lambda device: True)
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    monkeypatch.setattr(launch, "_untested_warned", False)
    q, kv, lens, _ = make_case(2, 1, 64, 576, 20)
    with pytest.warns(UserWarning, match="Triton 3.9.0"), pytest.raises(
            ValueError, match="backend='gluon' does not apply here: it was measured on Triton 3.6 only, and this is "
                              "Triton 3.9.0"):
        mla_decode(q, kv, None, lens, softmax_scale=0.1, backend="gluon")
