"""DeepSeek MLA: absorbed == naive, and the Triton decode kernel against an fp32 reference.

CPU (Triton interpreter): small head counts, head dims that are not block multiples
(D_qk=72 / D_v=64, 76 / 60, 64 / 64), fp32 and fp16. GPU: DeepSeek-V3 dims in bf16.
"""
import math

import pytest
import torch

from kernels.common import DEVICE, rel_err
from kernels.mla import (absorb_query, latent_cache, mla_absorbed, mla_decode, mla_decode_gluon, mla_decode_ref,
                         mla_naive,
                         unabsorb_output, yarn_softmax_scale)




def make_case(B, s_q, H, D, T, *, dtype=torch.float32, page=None, causal=False, device=DEVICE, lens=None):
    """Random q and cache, varied lengths (one of them the minimum), NaN past every length.

    With `page`, the cache is cut into pages stored in shuffled order behind a block table."""
    q = torch.randn(B, s_q, H, D, device=device, dtype=dtype)
    lo = s_q if causal else 1
    if lens is None:
        lens = torch.randint(lo, T + 1, (B,), dtype=torch.int32)
        lens[0] = lo
        lens[-1] = T
    lens = lens.to(device=device, dtype=torch.int32)
    kv = torch.randn(B, T, D, device=device, dtype=dtype)
    for b in range(B):
        kv[b, int(lens[b]):] = float("nan")  # never to be read
    if page is None:
        return q, kv, lens, None
    n_pages = math.ceil(T / page)
    padded = torch.full((B, n_pages * page, D), float("nan"), device=device, dtype=dtype)
    padded[:, :T] = kv
    pages = padded.reshape(B * n_pages, page, D)
    perm = torch.randperm(B * n_pages, device=device)
    cache = torch.empty_like(pages)
    cache[perm] = pages                        # page j of the logical layout lives at perm[j]
    table = perm.reshape(B, n_pages).to(torch.int32).contiguous()
    return q, cache, lens, table


def check_decode(q, kv, lens, table, d_v, causal, num_splits, tol, scale=0.13):
    out, lse = mla_decode(q, kv, lens, scale, d_v, table, causal, num_splits=num_splits)
    ref, ref_lse = mla_decode_ref(q, kv, lens, scale, d_v, table, causal)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    err = rel_err(out, ref)
    assert err < tol, f"out: relative error {err:.2e}"
    lse_err = (lse.float() - ref_lse).abs().max().item()
    assert lse_err < tol * 10, f"lse: max abs error {lse_err:.2e}"


# (B, s_q, H, D_qk, D_v, T, causal, page, num_splits)
CPU_CASES = [
    (3, 1, 3, 72, 64, 70, False, None, 1),
    (3, 1, 5, 72, 64, 70, False, None, 3),
    (2, 1, 3, 72, 64, 33, False, None, 8),   # more splits than tiles: empty slices
    (2, 2, 5, 72, 64, 50, True, None, 1),
    (2, 2, 3, 72, 64, 50, True, None, 2),
    (3, 1, 5, 72, 64, 70, False, 16, 2),     # paged, shuffled pages
    (2, 2, 3, 76, 60, 45, True, 7, None),    # odd page size, D_v not a power of two, auto split
    (2, 1, 4, 64, 64, 40, False, None, 2),   # no RoPE part: D_qk == D_v
    (1, 3, 2, 72, 64, 19, True, None, None),
    (2, 1, 3, 76, 60, 45, False, None, 2),   # contiguous (TMA tiles wider than D_v), D_v not a power of two
]


def _id(c):
    B, s_q, H, D, V, T, causal, page, ns = c
    return f"B{B}-sq{s_q}-H{H}-D{D}-V{V}-T{T}" + ("-causal" if causal else "") + (f"-page{page}" if page else "") \
        + f"-split{ns or 'auto'}"


@pytest.mark.parametrize("case", CPU_CASES, ids=_id)
def test_decode_fp32(case):
    B, s_q, H, D, V, T, causal, page, ns = case
    q, kv, lens, table = make_case(B, s_q, H, D, T, page=page, causal=causal)
    check_decode(q, kv, lens, table, V, causal, ns, tol=1e-5)


@pytest.mark.parametrize("ns", [1, 3])
def test_decode_fp16(ns):
    q, kv, lens, table = make_case(2, 1, 3, 72, 40, dtype=torch.float16)
    check_decode(q, kv, lens, table, 64, False, ns, tol=2e-3)


def test_decode_seqlen_one_everywhere():
    q, kv, lens, table = make_case(3, 1, 3, 72, 20, lens=torch.ones(3, dtype=torch.int32))
    out, lse = mla_decode(q, kv, lens, 0.1, 64, num_splits=4)
    # one visible position: the output is that position's value, the lse its score
    torch.testing.assert_close(out, kv[:, :1, None, :64].expand_as(out), rtol=1e-6, atol=1e-6)
    s = torch.einsum("bshd,bd->bhs", q, kv[:, 0]) * 0.1
    torch.testing.assert_close(lse, s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B,s_q,H,T", [(2, 1, 128, 17), (1, 2, 4, 37)], ids=lambda v: str(v))
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
    assert a.shape == (B, s_q, H, 128)
    assert rel_err(a, n) < (1e-5 if dtype == torch.float32 else 1e-12)


def test_kernel_path_equals_naive():
    """absorb_query -> mla_decode -> W_uv equals the naive MLA (small dims, fp32, interpreter)."""
    B, T, H, d_c, d_r, d_nope, d_v = 2, 29, 3, 64, 16, 32, 32
    c_kv, k_pe = torch.randn(B, T, d_c), torch.randn(B, T, d_r)
    q_nope, q_pe = torch.randn(B, 1, H, d_nope), torch.randn(B, 1, H, d_r)
    W_uk, W_uv = torch.randn(H, d_nope, d_c) / 8, torch.randn(H, d_v, d_c) / 8
    scale = (d_nope + d_r) ** -0.5
    lens = torch.full((B,), T, dtype=torch.int32)
    out_c, _ = mla_decode(absorb_query(q_nope, q_pe, W_uk), latent_cache(c_kv, k_pe), lens, scale, d_c,
                          num_splits=2)
    assert rel_err(unabsorb_output(out_c, W_uv), mla_naive(c_kv, k_pe, q_nope, q_pe, W_uk, W_uv, scale)) < 1e-5


def test_yarn_scale():
    assert abs(yarn_softmax_scale() - 0.1352) < 1e-4


# ---- bad inputs: each raises before any launch, naming the problem
def _good():
    q, kv, lens, _ = make_case(2, 1, 3, 72, 20)
    return q, kv, lens


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda q, kv, l: (q[0], kv, l, {}), ValueError, "q must have 4 dims"),
    (lambda q, kv, l: (q.to(torch.int32), kv, l, {}), TypeError, "q has dtype"),
    (lambda q, kv, l: (q, kv.half(), l, {}), TypeError, "kv_cache has dtype"),
    (lambda q, kv, l: (q, kv[..., :70], l, {}), ValueError, "head dim"),
    (lambda q, kv, l: (q, kv[:1], l, {}), ValueError, "kv_cache batch"),
    (lambda q, kv, l: (q, kv, l.long(), {}), TypeError, "cache_seqlens has dtype"),
    (lambda q, kv, l: (q, kv, l[:1], {}), ValueError, "cache_seqlens has 1 entries"),
    (lambda q, kv, l: (q, kv, torch.tensor([0, 5], dtype=torch.int32), {}), ValueError, ">= 1"),
    (lambda q, kv, l: (q, kv, torch.tensor([5, 21], dtype=torch.int32), {}), ValueError, "capacity"),
    (lambda q, kv, l: (q, kv, l, {"softmax_scale": None}), TypeError, "softmax_scale"),
    (lambda q, kv, l: (q, kv, l, {"softmax_scale": -1.0}), ValueError, "softmax_scale"),
    (lambda q, kv, l: (q, kv, l, {"head_dim_v": 80}), ValueError, "head_dim_v"),
    (lambda q, kv, l: (q, kv, l, {"head_dim_v": 64.0}), TypeError, "head_dim_v"),
    (lambda q, kv, l: (q, kv, l, {"causal": 1}), TypeError, "causal"),
    (lambda q, kv, l: (q, kv, l, {"num_splits": 0}), ValueError, "num_splits"),
    (lambda q, kv, l: (q.expand(2, 3, 3, 72).contiguous(), kv, torch.tensor([2, 9], dtype=torch.int32),
                       {"causal": True}), ValueError, "causal=True needs"),
    (lambda q, kv, l: (q, kv[..., ::2], l, {}), ValueError, "head dim"),
    (lambda q, kv, l: (q, kv, l, {"backend": "cuda"}), ValueError, "backend must be"),
    (lambda q, kv, l: (q, kv, l, {"backend": "gluon"}), ValueError, "backend='gluon' does not apply"),
], ids=["rank", "q-dtype", "kv-dtype", "kv-dim", "kv-batch", "seqlens-dtype", "seqlens-len", "seqlen-0",
        "seqlen-over-capacity", "scale-type", "scale-neg", "dv-too-big", "dv-type", "causal-type", "splits-0",
        "causal-short", "kv-strided", "backend-name", "gluon-misfit"])
def test_bad_inputs(mutate, exc, match):
    q, kv, lens = _good()
    q, kv, lens, kw = mutate(q, kv, lens)
    args = {"softmax_scale": 0.1, "head_dim_v": 64, **kw}
    with pytest.raises(exc, match=match):
        mla_decode(q, kv, lens, **args)


def test_gluon_kernel_rejects_what_it_cannot_run():
    q, kv, lens = _good()  # 3 heads of 72 dims: not DeepSeek's (and, on this machine's CPU, not CUDA)
    with pytest.raises(ValueError, match=r"must be on a CUDA device|q must be \[B, 1, H, 576\]"):
        mla_decode_gluon(q, kv, lens, 0.1)


def test_bad_block_table():
    q, cache, lens, table = make_case(2, 1, 3, 72, 40, page=16, lens=torch.tensor([40, 33]))
    with pytest.raises(ValueError, match="block_table too short"):
        mla_decode(q, cache, lens, 0.1, 64, table[:, :2])
    with pytest.raises(TypeError, match="block_table has dtype"):
        mla_decode(q, cache, lens, 0.1, 64, table.long())
    with pytest.raises(ValueError, match="block_table has 1 rows"):
        mla_decode(q, cache, lens, 0.1, 64, table[:1])
    bad = table.clone()
    bad[1, 0] = cache.shape[0]
    with pytest.raises(ValueError, match="page indices outside"):
        mla_decode(q, cache, lens, 0.1, 64, bad)


def test_decode_unaligned_rows_use_pointer_loads(monkeypatch):
    """A cache whose row stride is not a multiple of 16 bytes cannot be read by TMA: the kernel must
    take the pointer path (checked through the TMA flag it is launched with) and still be right."""
    from kernels.mla import decode

    B, s_q, H, D, V, T = 2, 1, 3, 72, 64, 40
    q, kv, lens, _ = make_case(B, s_q, H, D, T)
    padded = torch.full((B, T, D + 1), float("nan"), device=DEVICE)
    padded[..., :D] = kv
    unaligned = padded[..., :D]                  # row stride 73 floats = 292 bytes
    seen = []
    kernel = decode._mla_decode_kernel

    class Spy:
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                seen.append(kwargs["TMA"])
                return kernel[grid](*args, **kwargs)
            return run
    monkeypatch.setattr(decode, "_mla_decode_kernel", Spy())
    check_decode(q, unaligned, lens, None, V, False, 2, tol=1e-5)
    check_decode(q, kv, lens, None, V, False, 2, tol=1e-5)
    assert seen == [False, True]


# ---- GPU: DeepSeek-V3 dims, bf16
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
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"B{c[0]}-sq{c[1]}-H{c[2]}-T{c[3]}"
                         + ("-causal" if c[4] else "") + (f"-page{c[5]}" if c[5] else "") + f"-split{c[6] or 'auto'}")
def test_decode_gpu_bf16(case):
    B, s_q, H, T, causal, page, ns = case
    q, kv, lens, table = make_case(B, s_q, H, 576, T, dtype=torch.bfloat16, page=page, causal=causal)
    check_decode(q, kv, lens, table, 512, causal, ns, tol=1e-2, scale=yarn_softmax_scale() / 4)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 3, 40], ids=["whole", "split3", "split40"])
def test_gluon_gpu_matches_reference_and_triton(num_splits):
    """The hand-scheduled Hopper kernel: lengths around its 64-position tiles, NaN past every length; whole
    sequences, and slices (40 slices leave the short sequences' last slices empty)."""
    lens = torch.tensor([1, 63, 64, 65, 129, 1000, 2047, 3000], dtype=torch.int32)
    q, kv, lens, _ = make_case(8, 1, 128, 576, 3000, dtype=torch.bfloat16, lens=lens)
    scale = yarn_softmax_scale()
    out, lse = mla_decode(q, kv, lens, scale, backend="gluon", num_splits=num_splits)
    ref, ref_lse = mla_decode_ref(q, kv, lens, scale, 512, None, False)
    tri, tri_lse = mla_decode(q, kv, lens, scale, backend="triton", num_splits=num_splits)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert rel_err(out, ref) < 1e-2, f"out vs reference: {rel_err(out, ref):.2e}"
    assert (lse - ref_lse).abs().max().item() < 1e-3
    assert rel_err(out, tri) < 1e-2 and (lse - tri_lse).abs().max().item() < 1e-3


@pytest.mark.gpu
def test_gluon_gpu_one_position_cache():
    """T_max = 1 and no split: integer arguments equal to 1 must not become constants (they cannot cross
    into the kernel's partitions)."""
    q, kv, lens, _ = make_case(2, 1, 128, 576, 1, dtype=torch.bfloat16, lens=torch.tensor([1, 1]))
    out, lse = mla_decode(q, kv, lens, 0.1, backend="gluon", num_splits=1)
    ref, ref_lse = mla_decode_ref(q, kv, lens, 0.1, 512, None, False)
    assert rel_err(out, ref) < 1e-2 and (lse - ref_lse).abs().max().item() < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("change, gluon", [
    ({}, True),                                  # B=8, H=128, bf16, s_q=1, contiguous: the serving case
    ({"s_q": 2}, False),
    ({"dtype": torch.float16}, False),
    ({"page": 64}, False),
    ({"num_splits": 2}, True),
], ids=["serving", "s_q-2", "fp16", "paged", "split"])
def test_gpu_auto_backend_choice(change, gluon, monkeypatch):
    from kernels.mla import gluon_decode
    calls, launch = [], gluon_decode.launch
    monkeypatch.setattr(gluon_decode, "launch", lambda *a: calls.append(1) or launch(*a))
    q, kv, lens, table = make_case(8, change.get("s_q", 1), 128, 576, 256, dtype=change.get("dtype", torch.bfloat16),
                                   page=change.get("page"))
    check_decode(q, kv, lens, table, 512, False, change.get("num_splits"), tol=1e-2, scale=yarn_softmax_scale())
    assert bool(calls) == gluon


def test_gluon_kernel_compiles_for_hopper_without_spills():
    """No GPU needed: compile the Gluon kernel for sm_90a and let ptxas judge it (no spills, no serialized
    wgmma, shared memory within 227 KB). Catches a broken Gluon change on any machine."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "mla_gluon_compile.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "registers" in done.stdout and "OK" in done.stdout
