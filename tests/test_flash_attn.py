"""FlashAttention-2 (kernels.flash_attn): forward and all three gradients against an fp64/fp32
reference written from the formula, GQA/MQA/MHA, odd lengths, T != S, bottom-right causal
masks, empty rows, large scores, and every kind of bad input."""
import math

import pytest
import torch

from kernels.common import DEVICE, pick, rel_err
from kernels.flash_attn import attention_ref, backward, flash_attn_func

TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (3e-3, 1e-2), torch.bfloat16: (1e-2, 3e-2)}  # (fwd, grads)


def _inputs(B, T, S, HQ, HKV, D, dtype, scale=1.0, device=DEVICE):
    mk = lambda *shape: (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype).requires_grad_()
    return mk(B, T, HQ, D), mk(B, S, HKV, D), mk(B, S, HKV, D)


def _check(B, T, S, HQ, HKV, D, causal, dtype, scale=1.0, ref_dtype=torch.float64, softmax_scale=None, tol=None):
    q, k, v = _inputs(B, T, S, HQ, HKV, D, dtype, scale)
    o = flash_attn_func(q, k, v, causal=causal, softmax_scale=softmax_scale)
    g = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), g)
    qr, kr, vr = (t.detach().to(ref_dtype).requires_grad_() for t in (q, k, v))
    o_ref = attention_ref(qr, kr, vr, causal=causal, softmax_scale=softmax_scale, compute_dtype=ref_dtype)
    grads_ref = torch.autograd.grad(o_ref, (qr, kr, vr), g.to(ref_dtype))
    tol_f, tol_b = tol or TOL[dtype]
    assert o.shape == q.shape and o.dtype == dtype
    for name, out, ref, tol in [("o", o, o_ref, tol_f)] + [
            (n, a, b, tol_b) for n, a, b in zip(("dq", "dk", "dv"), grads, grads_ref)]:
        assert not torch.isnan(out).any(), f"{name} has NaN"
        if not ref.any():  # e.g. S = 1: a softmax over one key is constant, so dq is exactly 0
            assert out.abs().max().item() <= tol, f"{name}: should be 0, max |{name}| = {out.abs().max().item():.2e}"
            continue
        err = rel_err(out, ref)
        assert err <= tol, f"{name}: relative error {err:.2e} > {tol:.0e}"
    return o, grads


@pytest.fixture(params=[1, 2], ids=["1launch", "2launches"])
def launches(request, monkeypatch):
    """Run the backward as one launch (dK/dV programs compute delta from O) or as two (the dQ
    launch stores delta, the dK/dV launch reads it), whatever the size would pick."""
    monkeypatch.setattr(backward, "ONE_LAUNCH_MAX_FLOPS", math.inf if request.param == 1 else 0.0)
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
    assert rel_err(a, b) < 1e-6


def test_inference_path_matches_autograd_path():
    """Without inputs that need grad (or under no_grad) the wrapper skips autograd: same output."""
    q, k, v = _inputs(1, 50, 70, 4, 2, 32, torch.float32)
    o = flash_attn_func(q, k, v, causal=True)
    with torch.no_grad():
        o_ng = flash_attn_func(q, k, v, causal=True)
    o_plain = flash_attn_func(q.detach(), k.detach(), v.detach(), causal=True)
    assert o.requires_grad and not o_ng.requires_grad and not o_plain.requires_grad
    assert torch.equal(o.detach(), o_ng) and torch.equal(o_ng, o_plain)


def test_large_scores_do_not_overflow():
    """|scores| around 1e3: exp would overflow without the running max."""
    # fp32 rounds a score of 1e3 by ~1e-4 (absolute), so P and the gradients carry ~1e-4 relative error
    _check(1, 70, 70, 2, 1, 32, True, torch.float32, scale=math.sqrt(1000.0), tol=(1e-3, 1e-3))
    q, k, v = _inputs(1, 70, 70, 2, 1, 32, torch.float32, scale=math.sqrt(1000.0))
    o = flash_attn_func(q, k, v, causal=False)
    assert torch.isfinite(o).all()
    assert rel_err(o, attention_ref(q.double(), k.double(), v.double())) < 1e-3


def test_strided_inputs():
    """Views of one packed qkv tensor and transposed [B, H, T, D] views are copied to contiguous
    first (the kernels derive strides from shapes); out.sum() sends a stride-0 gradient."""
    tol = pick(cpu=1e-4, gpu=3e-3)  # fp32 runs its dots in TF32 on the GPU
    B, T, H, D = 1, 45, 2, 32
    qkv = torch.randn(B, T, 3, H, D, device=DEVICE)
    q, k, v = qkv.unbind(2)
    o = flash_attn_func(q, k, v, causal=True)
    assert rel_err(o, attention_ref(q, k, v, causal=True)) < tol

    q, k, v = (torch.randn(B, H, T, D, device=DEVICE).transpose(1, 2).requires_grad_() for _ in range(3))
    flash_attn_func(q, k, v, causal=True).sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    attention_ref(q64, k64, v64, causal=True).sum().backward()
    for name, got, ref in (("dq", q.grad, q64.grad), ("dk", k.grad, k64.grad), ("dv", v.grad, v64.grad)):
        assert rel_err(got, ref) < tol, name


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
    assert rel_err(o, attention_ref(*aligned, causal=True)) < 2e-3


def test_launch_falls_back_when_a_tile_does_not_fit():
    """`launch` tries the next tile when Triton reports OutOfResources, and remembers the choice."""
    from triton.runtime.errors import OutOfResources

    from kernels.flash_attn import forward

    tried = []

    class FakeKernel:
        def __getitem__(self, grid):
            def run(*args, BM, BN, num_warps, num_stages, **constexprs):
                tried.append((BM, BN, grid))
                if BM == 128:
                    raise OutOfResources(300_000, 232_448, "shared memory")
            return run

    tiles, key = [(128, 64, 8, 3), (64, 32, 4, 1)], ("test-fake-kernel",)
    try:
        for _ in range(2):
            forward.launch(FakeKernel(), lambda BM, BN: (1000 // BM,), tiles, key)
    finally:
        forward._VARIANTS.pop(key, None)
    assert tried == [(128, 64, (7,)), (64, 32, (15,)), (64, 32, (15,))]


# ------------------------------------------------------------------ bad input
def _good():
    return (torch.randn(1, 8, 4, 32, device=DEVICE), torch.randn(1, 8, 2, 32, device=DEVICE),
            torch.randn(1, 8, 2, 32, device=DEVICE))


@pytest.mark.parametrize("case, exc, words", [
    ("rank", ValueError, "q must have 4 dims"),
    ("batch", ValueError, "batch size mismatch"),
    ("head_dim", ValueError, "head dim mismatch"),
    ("unsupported_D", ValueError, "head dim D=48"),
    ("heads", ValueError, "multiple of KV heads"),
    ("kv_shape", ValueError, "k and v must have the same shape"),
    ("dtype", TypeError, "supported"),
    ("mixed_dtype", TypeError, "share one dtype"),
    ("not_tensor", TypeError, "must be a torch.Tensor"),
    ("device", ValueError, "device"),
    ("empty", ValueError, "empty input"),
    ("scale", ValueError, "softmax_scale"),
    ("causal", TypeError, "causal must be a bool"),
])
def test_bad_input(case, exc, words):
    q, k, v = _good()
    kw = {}
    if case == "rank":
        q = q[0]
    elif case == "batch":
        k, v = k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1)
    elif case == "head_dim":
        k, v = k[..., :16], v[..., :16]
    elif case == "unsupported_D":
        q, k, v = q[..., :16].repeat(1, 1, 1, 3), k[..., :16].repeat(1, 1, 1, 3), v[..., :16].repeat(1, 1, 1, 3)
    elif case == "heads":
        k, v = torch.randn(1, 8, 3, 32, device=DEVICE), torch.randn(1, 8, 3, 32, device=DEVICE)
    elif case == "kv_shape":
        v = v[:, :5]
    elif case == "dtype":
        q, k, v = q.double(), k.double(), v.double()
    elif case == "mixed_dtype":
        k = k.half()
    elif case == "not_tensor":
        q = q.tolist()
    elif case == "device":
        other = "meta"
        k = k.to(other)
    elif case == "empty":
        q = q[:, :0]
    elif case == "scale":
        kw["softmax_scale"] = -1.0
    elif case == "causal":
        kw["causal"] = "yes"
    with pytest.raises(exc, match=words):
        flash_attn_func(q, k, v, **kw)


# ------------------------------------------------------------------ GPU: bf16/fp16, real shapes
# Each new (dtype, causal, D, tile) compiles four kernels (forward, delta, dK/dV, dQ); lengths and
# head counts are not specialised, so the matrix below compiles about 25 kernels in all:
# bf16 D=128 causal and not (x2 dK/dV tiles), fp16 D=128 causal, and bf16 D=32, 64, 256 once each.
ARTICLE_SHAPES = [  # (B, Hq, Hkv, N, D), the source article's four
    (2, 32, 8, 1024, 128),   # GQA-4
    (1, 64, 8, 4096, 128),   # GQA-8
    (1, 32, 32, 512, 128),   # MHA
    (1, 16, 1, 512, 128),    # MQA
]
_article_id = lambda s: f"B{s[0]}-Hq{s[1]}-Hkv{s[2]}-N{s[3]}-D{s[4]}"  # noqa: E731


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", ARTICLE_SHAPES, ids=_article_id)
def test_gpu_article_shapes(shape, causal):
    B, HQ, HKV, N, D = shape
    _check(B, N, N, HQ, HKV, D, causal, torch.bfloat16, ref_dtype=torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [ARTICLE_SHAPES[0], ARTICLE_SHAPES[3]], ids=_article_id)
def test_gpu_article_shapes_fp16(shape):
    B, HQ, HKV, N, D = shape
    _check(B, N, N, HQ, HKV, D, True, torch.float16, ref_dtype=torch.float32)


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


@pytest.mark.gpu
def test_gpu_large_scores_bf16():
    q, k, v = _inputs(1, 1000, 1000, 8, 2, 128, torch.bfloat16, scale=math.sqrt(1000.0))
    o = flash_attn_func(q, k, v, causal=True)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
    for t in (o, dq, dk, dv):
        assert torch.isfinite(t).all()
    assert rel_err(o, attention_ref(q, k, v, causal=True, compute_dtype=torch.float32)) < 3e-2


@pytest.mark.gpu
def test_gpu_memory_linear_in_n():
    """Extra memory of the forward beyond its inputs and output: only the fp32 LSE (4 bytes a row)."""
    extra = []
    for N in (4096, 16384):
        q, k, v = (torch.randn(1, N, 32, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flash_attn_func(q, k, v)  # compile/tune outside the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        o = flash_attn_func(q, k, v)
        torch.cuda.synchronize()
        extra.append(torch.cuda.max_memory_allocated() - base - o.numel() * o.element_size())
        del q, k, v, o
    assert all(e < 64 * 2**20 for e in extra), extra  # eager would need 2 x 16 GiB at N = 16K
