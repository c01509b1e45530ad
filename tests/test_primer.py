"""The Triton primer (attention_kernels.primer): the vector add, the row softmax and the attention tile
against their PyTorch forms; sizes that are not block multiples; NaN, -inf and large scores;
every kind of bad input; bf16 and real sizes on the GPU.

CPU (interpreter): fp32 and fp16 on small shapes. GPU: bf16, fp16 and fp32 (fp32 dot products in
the attention tile run as TF32 there, so it is held to the TF32 tolerance).
"""
import math

import pytest
import torch

from input_cases import Case, bad_input_cases, case_id, expect_refusal
from attention_kernels.common import DEVICE, assert_close, tolerance
from attention_kernels.primer import (add_ref, attention_tile, attention_tile_ref, softmax_naive, softmax_ref, softmax_rows,
                            vector_add)
from attention_kernels.primer.interface import MAX_COLS, max_keys

CPU_DTYPES = [torch.float32, torch.float16]


def dt(dtype) -> str:
    return str(dtype).replace("torch.", "")


# ------------------------------------------------------------------ vector add
@pytest.mark.parametrize("n, block", [(1, 16), (1000, 128), (4096, 1024), (5000, 1024), (70_001, 4096)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dt)
def test_vector_add(n, block, dtype):
    x, y = (torch.randn(n, device=DEVICE, dtype=dtype) for _ in range(2))
    out = vector_add(x, y, block=block)
    assert out.dtype == dtype and out.shape == (n,)
    assert torch.equal(out, add_ref(x, y))  # one rounding of one addition: exactly torch's


def test_vector_add_non_contiguous_and_nan():
    x = torch.randn(2000, device=DEVICE)[::2]          # every other element: a strided view
    y = torch.randn(1000, device=DEVICE)
    y[17] = math.nan
    y[500] = math.inf
    out = vector_add(x, y)
    ref = x + y
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.nan_to_num(), ref.nan_to_num())


# ------------------------------------------------------------------ row softmax
@pytest.mark.parametrize("rows, cols", [(1, 1), (3, 17), (64, 100), (5, 1000), (2, 4097)], ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dt)
def test_softmax_rows(rows, cols, dtype):
    x = (torch.randn(rows, cols, device=DEVICE) * 4).to(dtype)
    p = softmax_rows(x)
    assert p.dtype == dtype and p.shape == x.shape and not p.isnan().any()
    assert_close(p, softmax_ref(x), tolerance(dtype), "softmax")


def test_softmax_large_scores_where_the_naive_form_overflows():
    x = torch.randn(8, 300, device=DEVICE) * 1000       # exp(1000) is inf in fp32
    assert softmax_naive(x).isnan().any()
    p = softmax_rows(x)
    assert_close(p, softmax_ref(x), tolerance(torch.float32), "softmax of large scores")


def test_softmax_nan_stays_in_its_row_and_masked_rows_match_torch():
    x = torch.randn(6, 50, device=DEVICE)
    x[1, 7] = math.nan
    x[3] = -math.inf                                    # a row that sees nothing: NaN, as torch gives
    x[4, :10] = -math.inf                               # partly masked: those entries are exactly 0
    p = softmax_rows(x)
    ref = torch.softmax(x, dim=-1)
    assert torch.equal(p.isnan(), ref.isnan())
    assert p[1].isnan().all() and p[3].isnan().all()
    assert torch.equal(p[4, :10], torch.zeros(10, device=DEVICE))
    keep = [0, 2, 4, 5]
    assert_close(p[keep], softmax_ref(x[keep]), tolerance(torch.float32), "the other rows")


def test_softmax_non_contiguous_input():
    x = torch.randn(100, 40, device=DEVICE).t()         # [40, 100], column-major
    assert_close(softmax_rows(x), softmax_ref(x), tolerance(torch.float32), "softmax of a transposed view")


# ------------------------------------------------------------------ attention tile
TILE_SHAPES = [(1, 1, 1, 1, 16), (1, 77, 50, 2, 40), (2, 33, 128, 3, 64), (1, 20, 256, 1, 128), (2, 100, 17, 2, 32)]


def fit(shape, dtype):
    """The shape with S cut to the most keys one tile holds in this dtype."""
    B, T, S, H, D = shape
    return B, T, min(S, max_keys(dtype)), H, D


def tid(s):
    B, T, S, H, D = s
    return f"B{B}-T{T}-S{S}-H{H}-D{D}"


def _qkv(B, T, S, H, D, dtype, device=DEVICE, spread=1.0):
    q = (torch.randn(B, T, H, D, device=device) * spread).to(dtype)
    k, v = (torch.randn(B, S, H, D, device=device).to(dtype) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("shape", TILE_SHAPES, ids=tid)
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dt)
def test_attention_tile(shape, dtype):
    q, k, v = _qkv(*fit(shape, dtype), dtype)
    o = attention_tile(q, k, v)
    assert o.dtype == dtype and o.shape == q.shape and not o.isnan().any()
    assert_close(o, attention_tile_ref(q, k, v), tolerance(dtype, tf32_dots=True), "o")


def test_attention_tile_custom_scale_and_large_scores():
    q, k, v = _qkv(1, 40, 60, 2, 32, torch.float32, spread=30.0)  # scores in the hundreds: exp would overflow
    for scale in (1.0, 0.01):
        o = attention_tile(q, k, v, softmax_scale=scale)
        assert_close(o, attention_tile_ref(q, k, v, softmax_scale=scale), tolerance(torch.float32, tf32_dots=True),
                     f"o at scale {scale}")


def test_attention_tile_nan_in_one_value_row():
    """A NaN in the value of key 5 reaches every query (each one gives key 5 some weight), and only
    the column of the head dimension that holds it: the other columns stay exact."""
    q, k, v = _qkv(1, 30, 40, 2, 32, torch.float32)
    v[0, 5, 1, 3] = math.nan
    o = attention_tile(q, k, v)
    bad = torch.zeros_like(o, dtype=torch.bool)
    bad[0, :, 1, 3] = True
    assert torch.equal(o.isnan(), bad)
    clean = v.clone()
    clean[0, 5, 1, 3] = 0
    ref = attention_tile_ref(q, k, clean)
    assert_close(o[~bad], ref[~bad].to(o.dtype), tolerance(torch.float32, tf32_dots=True), "the other outputs")


# ------------------------------------------------------------------ bad inputs
def _set(**changes):
    """A mutation: each argument replaced by f(args)."""
    def mutate(args):
        args.update({k: f(args) for k, f in changes.items()})
    return mutate


def _add_good():
    return dict(x=torch.randn(100, device=DEVICE), y=torch.randn(100, device=DEVICE))


def _softmax_good():
    return dict(x=torch.randn(4, 30, device=DEVICE))


def _tile_good():
    q, k, v = _qkv(1, 8, 12, 2, 16, torch.float32)
    return dict(q=q, k=k, v=v)


ADD_CASES = [
    Case("mixed-dtypes", _set(y=lambda a: a["y"].half()), TypeError, "x, y must share one dtype"),
    Case("y-length", _set(y=lambda a: a["y"][:50]), ValueError, r"y must have shape \[100\]"),
    Case("empty", _set(x=lambda a: a["x"][:0], y=lambda a: a["y"][:0]), ValueError, "x must have every size >= 1"),
    Case("block-not-pow2", _set(block=lambda a: 1000), ValueError, "block must be a power of two"),
    Case("block-too-small", _set(block=lambda a: 8), ValueError, r"block must be in \[16, 65536\]"),
    Case("block-float", _set(block=lambda a: 1024.0), TypeError, "block must be an int"),
]
SOFTMAX_CASES = [
    Case("empty-rows", _set(x=lambda a: a["x"][:0]), ValueError, "x must have every size >= 1"),
    Case("empty-cols", _set(x=lambda a: a["x"][:, :0]), ValueError, "x must have every size >= 1"),
    Case("row-too-long", _set(x=lambda a: torch.zeros(1, MAX_COLS + 1, device=DEVICE)), ValueError,
         f"x must have at most {MAX_COLS} columns"),
]
TILE_CASES = [
    Case("mixed-dtypes", _set(k=lambda a: a["k"].half()), TypeError, "q, k, v must share one dtype"),
    Case("k-heads", _set(k=lambda a: a["k"][:, :, :1]), ValueError, r"k must have shape \[1, \*, 2, 16\]"),
    Case("k-head-dim", _set(k=lambda a: a["k"][..., :8]), ValueError, r"k must have shape \[1, \*, 2, 16\]"),
    Case("v-length", _set(v=lambda a: a["v"][:, :5]), ValueError, r"v must have shape \[1, 12, 2, 16\]"),
    Case("empty-T", _set(q=lambda a: a["q"][:, :0]), ValueError, "q must have every size >= 1"),
    Case("empty-S", _set(k=lambda a: a["k"][:, :0], v=lambda a: a["v"][:, :0]), ValueError,
         "k must have every size >= 1"),
    Case("too-many-keys", _set(k=lambda a: torch.zeros(1, 129, 2, 16, device=DEVICE),
                               v=lambda a: torch.zeros(1, 129, 2, 16, device=DEVICE)),
         ValueError, "k must have at most 128 keys"),
    Case("too-many-keys-fp16", _set(q=lambda a: a["q"].half(),
                                    k=lambda a: torch.zeros(1, 257, 2, 16, device=DEVICE).half(),
                                    v=lambda a: torch.zeros(1, 257, 2, 16, device=DEVICE).half()),
         ValueError, "k must have at most 256 keys"),
    Case("head-dim-too-big", _set(**{n: (lambda a, n=n: torch.zeros(1, 8, 2, 160, device=DEVICE)) for n in "qkv"}),
         ValueError, "head dim D of at most 128"),
    Case("scale-str", _set(softmax_scale=lambda a: "0.5"), TypeError, "softmax_scale must be a float"),
    Case("scale-zero", _set(softmax_scale=lambda a: 0.0), ValueError, "softmax_scale must be finite and > 0"),
    Case("scale-nan", _set(softmax_scale=lambda a: math.nan), ValueError, "softmax_scale must be finite and > 0"),
]


@pytest.mark.parametrize("case", bad_input_cases(["x", "y"]) + ADD_CASES, ids=case_id)
def test_vector_add_refuses(case):
    expect_refusal(vector_add, _add_good, case)


@pytest.mark.parametrize("case", bad_input_cases(["x"]) + SOFTMAX_CASES, ids=case_id)
def test_softmax_rows_refuses(case):
    expect_refusal(softmax_rows, _softmax_good, case)


@pytest.mark.parametrize("case", bad_input_cases(["q", "k", "v"]) + TILE_CASES, ids=case_id)
def test_attention_tile_refuses(case):
    expect_refusal(attention_tile, _tile_good, case)


REF_TILE_CASES = [c for c in TILE_CASES if c.id in ("k-heads", "k-head-dim", "v-length", "empty-T", "empty-S",
                                                    "scale-str", "scale-zero", "scale-nan")]


@pytest.mark.parametrize("case", bad_input_cases(["q", "k", "v"], kernel=False) + REF_TILE_CASES, ids=case_id)
def test_attention_tile_ref_refuses(case):
    expect_refusal(attention_tile_ref, _tile_good, case)


@pytest.mark.parametrize("case", bad_input_cases(["x"], kernel=False), ids=case_id)
def test_softmax_refs_refuse(case):
    expect_refusal(softmax_ref, _softmax_good, case)
    expect_refusal(softmax_naive, _softmax_good, case)


# ------------------------------------------------------------------ GPU: bf16, real sizes
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=dt)
def test_vector_add_gpu(dtype):
    for n in (1, 1000, 1 << 20, (1 << 24) + 3):
        x, y = (torch.randn(n, device="cuda", dtype=dtype) for _ in range(2))
        assert torch.equal(vector_add(x, y), x + y), n


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=dt)
@pytest.mark.parametrize("rows, cols", [(32768, 1024), (1000, 4097), (7, 32768), (4096, 1)], ids=lambda v: str(v))
def test_softmax_rows_gpu(dtype, rows, cols):
    x = (torch.randn(rows, cols, device="cuda") * 4).to(dtype)
    p = softmax_rows(x)
    assert not p.isnan().any()
    assert_close(p, softmax_ref(x), tolerance(dtype), "softmax")


@pytest.mark.gpu
def test_softmax_nan_and_masked_rows_gpu():
    x = torch.randn(1000, 3000, device="cuda", dtype=torch.bfloat16)
    x[10, 5] = math.nan
    x[20] = -math.inf
    p = softmax_rows(x)
    assert torch.equal(p.isnan(), torch.softmax(x, dim=-1).isnan())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=dt)
@pytest.mark.parametrize("shape", [(2, 1000, 256, 32, 128), (4, 4096, 200, 8, 64), (1, 77, 1, 4, 100),
                                   (3, 1, 129, 16, 128)], ids=tid)
def test_attention_tile_gpu(dtype, shape):
    q, k, v = _qkv(*fit(shape, dtype), dtype, device="cuda")
    o = attention_tile(q, k, v)
    assert not o.isnan().any()
    assert_close(o, attention_tile_ref(q, k, v), tolerance(dtype, tf32_dots=True), "o")
