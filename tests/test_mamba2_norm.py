"""Mamba-2's gated RMSNorm (attention_kernels.mamba2.rmsnorm_fn, RMSNormGated, the PyTorch rmsnorm_ref): forward and
backward against a float64 norm written here from the formula, group by group, for both gate orders, with and
without z and bias, rows and widths that are no multiple of a tile (7 rows of 96 channels in groups of 48), the
whole row as one group, strided and empty inputs, the per-(row, group) rstd the forward keeps, the module as a
Mamba-2 block builds it, and every kind of bad input.

CPU (interpreter): fp32 and fp16. GPU: bf16 at Mamba-2 2.7B's width (5120 channels, one group and eight).
"""
import pytest
import torch

from input_cases import Case, bad_input_cases, case_id, expect_refusal
from attention_kernels.common import DEVICE, assert_close, tolerance
from attention_kernels.mamba2 import RMSNormGated, rmsnorm_fn, rmsnorm_ref
from attention_kernels.mamba2 import interface as interface_module
from attention_kernels.mamba2.norm import MAX_GROUP

FP32 = tolerance(torch.float32)


def formula(x, weight, bias, z, eps, group_size, norm_before_gate):
    """The norm in float64, one group at a time: silu(z) = z · sigmoid(z); v = x, or x · silu(z) when the gate
    comes first; out = v / sqrt(sum over the group of v² / size + eps) · weight (+ bias), times silu(z) when
    the gate comes last. Returns (out, rstd [rows, groups])."""
    d = lambda t: None if t is None else t.double()                      # noqa: E731
    x, weight, bias, z = map(d, (x, weight, bias, z))
    N = x.shape[-1]
    size = N if group_size is None else group_size
    gate = None if z is None else z * torch.sigmoid(z)
    v = x * gate if gate is not None and not norm_before_gate else x
    out = torch.empty_like(v)
    rstd = torch.empty(v.numel() // N, N // size, dtype=torch.float64)
    for k in range(N // size):
        part = v[..., k * size:(k + 1) * size]
        r = 1 / torch.sqrt((part * part).sum(-1, keepdim=True) / size + eps)
        out[..., k * size:(k + 1) * size] = part * r * weight[k * size:(k + 1) * size]
        rstd[:, k] = r.reshape(-1)
    if bias is not None:
        out = out + bias
    if gate is not None and norm_before_gate:
        out = out * gate
    return out, rstd


def _inputs(shape, dtype, with_z, with_bias, device=DEVICE, weight_dtype=None):
    """x, weight, bias, z with channel groups of different scales (each group needs its own rms)."""
    N = shape[-1]
    x = torch.randn(shape, device=device, dtype=torch.float32)
    x[..., : N // 2] *= 5
    z = torch.randn(shape, device=device, dtype=dtype) if with_z else None
    weight = (1 + 0.5 * torch.randn(N, device=device)).to(weight_dtype or dtype)
    bias = torch.randn(N, device=device, dtype=weight_dtype or dtype) if with_bias else None
    return x.to(dtype), weight, bias, z


def _check(shape, group_size, dtype, norm_before_gate, with_z, with_bias, tol, eps=1e-5, device=DEVICE):
    """rmsnorm_fn's output and its gradients to every given input against the formula's through autograd."""
    x, weight, bias, z = _inputs(shape, dtype, with_z, with_bias, device)
    given = {n: t for n, t in (("x", x), ("weight", weight), ("bias", bias), ("z", z)) if t is not None}
    for t in given.values():
        t.requires_grad_()
    out = rmsnorm_fn(x, weight, bias, z=z, eps=eps, group_size=group_size, norm_before_gate=norm_before_gate)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, list(given.values()), dout)

    exact = {n: t.detach().double().requires_grad_() for n, t in given.items()}
    want, _ = formula(exact["x"], exact["weight"], exact.get("bias"), exact.get("z"), eps, group_size,
                      norm_before_gate)
    want_grads = torch.autograd.grad(want, list(exact.values()), dout.double())

    assert out.dtype == x.dtype and out.shape == x.shape
    assert_close(out, want, tol, "out")
    for (name, t), g, w in zip(given.items(), grads, want_grads, strict=True):
        assert g.dtype == t.dtype and g.shape == t.shape, name
        assert_close(g, w, tol, f"d{name}")


# ---------------------------------------------------------------- forward and backward against the formula
SHAPES = [((7, 96), 48), ((2, 5, 40), None), ((3, 130), 10)]      # (x's shape, group_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("norm_before_gate", [False, True], ids=["gate-first", "norm-first"])
@pytest.mark.parametrize("with_z", [True, False], ids=["z", "no-z"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("shape, group_size", SHAPES, ids=[f"{'x'.join(map(str, s))}-G{g}" for s, g in SHAPES])
def test_forward_and_backward_match_the_formula(shape, group_size, with_bias, with_z, norm_before_gate, dtype):
    _check(shape, group_size, dtype, norm_before_gate, with_z, with_bias, tolerance(dtype))


def test_rstd_kept_per_row_and_group():
    """The forward keeps 1 / rms per (row, group), fp32, for the backward: the formula's."""
    x, weight, _, z = _inputs((2, 7, 96), torch.float32, True, False)
    out, rstd = interface_module._gated_rmsnorm_fwd(x, weight, None, z, 1e-5, 48, False)
    want_out, want_rstd = formula(x, weight, None, z, 1e-5, 48, False)
    assert rstd.dtype == torch.float32 and rstd.shape == (14, 2)
    assert_close(rstd, want_rstd, FP32, "rstd")
    assert_close(out, want_out, FP32, "out")


def test_strided_inputs():
    """x and z as views: rows of a wider tensor (a row stride, used as it is) and every other channel (copied)."""
    wide = torch.randn(7, 200)
    x, z = wide[:, 3:99], torch.randn(7, 192)[:, ::2]
    weight = torch.randn(96)
    out = rmsnorm_fn(x, weight, None, z=z, eps=1e-5, group_size=48, norm_before_gate=False)
    assert_close(out, formula(x, weight, None, z, 1e-5, 48, False)[0], FP32, "out")


def test_no_rows():
    """A tensor with no rows gives an empty output and empty gradients."""
    x = torch.randn(0, 3, 64, requires_grad=True)
    weight = torch.randn(64, requires_grad=True)
    out = rmsnorm_fn(x, weight, None, z=torch.randn(0, 3, 64))
    assert out.shape == x.shape
    dx, dw = torch.autograd.grad(out.sum(), (x, weight), allow_unused=True)
    assert dx.shape == x.shape and torch.equal(dw, torch.zeros(64))


def test_a_large_value_stays_finite():
    """Squares of large fp16 values sum in fp32: no overflow where fp16 would give inf."""
    x = torch.full((3, 64), 3000.0, dtype=torch.float16)
    out = rmsnorm_fn(x, torch.ones(64, dtype=torch.float16), None)
    assert torch.isfinite(out).all()
    assert_close(out, torch.ones(3, 64), FP32, "out")


@pytest.mark.parametrize("groups", [1, 3])
def test_reference_matches_the_formula(groups):
    """rmsnorm_ref, the PyTorch form, against the formula in float64 (both gate orders, with a bias)."""
    size = 5
    x, weight, bias, z = _inputs((2, 7, groups * size), torch.float32, True, True)
    for norm_before_gate in (False, True):
        out = rmsnorm_ref(x, weight, bias, z=z, eps=1e-5, group_size=size, norm_before_gate=norm_before_gate)
        want = formula(x, weight, bias, z, 1e-5, size, norm_before_gate)[0]
        assert out.dtype == x.dtype
        assert_close(out, want, FP32, f"rmsnorm_ref (norm_before_gate={norm_before_gate})")


def test_module_as_a_mamba2_block_builds_it():
    """RMSNormGated(hidden_size, eps, group_size, norm_before_gate, device, dtype): a weight of ones, no bias,
    rmsnorm_fn in forward, and the weight trains."""
    d_inner, ngroups = 96, 2
    norm = RMSNormGated(d_inner, eps=1e-5, norm_before_gate=False, group_size=d_inner // ngroups, device=DEVICE,
                        dtype=torch.float32)
    assert norm.bias is None and torch.equal(norm.weight.detach(), torch.ones(d_inner))
    assert [n for n, _ in norm.named_parameters()] == ["weight"]
    with torch.no_grad():
        norm.weight.normal_()
    y, z = torch.randn(2, 7, d_inner), torch.randn(2, 7, d_inner)
    out = norm(y, z)
    assert_close(out, formula(y, norm.weight, None, z, 1e-5, 48, False)[0], FP32, "out")
    out.square().sum().backward()
    assert norm.weight.grad is not None and torch.isfinite(norm.weight.grad).all()
    assert RMSNormGated(8).norm_before_gate is True and RMSNormGated(8).eps == 1e-5   # mamba_ssm's defaults


# ---------------------------------------------------------------- torch.compile: the launchers are ops
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_compiled_forward_and_backward_equal_eager(with_bias):
    """Under torch.compile(fullgraph=True) the forward and backward (the launchers are ops) give eager's numbers;
    opcheck checks the ops' schemas and fakes."""
    def run(fn):
        x, weight, bias, z = (None if t is None else t.clone().requires_grad_() for t in inputs)
        out = fn(x, weight, bias, z)
        grads = torch.autograd.grad(out, [t for t in (x, weight, bias, z) if t is not None], dout)
        return out.detach(), grads

    inputs = _inputs((2, 7, 96), torch.float32, True, with_bias)
    dout = torch.randn(2, 7, 96)
    norm = lambda x, w, b, z: rmsnorm_fn(x, w, b, z=z, eps=1e-5, group_size=48, norm_before_gate=False)  # noqa: E731
    eager_out, eager_grads = run(norm)
    compiled_out, compiled_grads = run(torch.compile(norm, fullgraph=True, backend="aot_eager"))
    assert torch.equal(compiled_out, eager_out)
    for c, e in zip(compiled_grads, eager_grads, strict=True):
        assert torch.equal(c, e)

    x, weight, bias, z = inputs
    torch.library.opcheck(interface_module._gated_rmsnorm_fwd.op, (x, weight, bias, z, 1e-5, 48, False))
    _, rstd = interface_module._gated_rmsnorm_fwd(x, weight, bias, z, 1e-5, 48, False)
    torch.library.opcheck(interface_module._gated_rmsnorm_bwd.op, (x, weight, bias, z, rstd, dout, 48, False))


# ---------------------------------------------------------------- bad input, refused by name before a launch
def _good():
    x, weight, bias, z = _inputs((7, 96), torch.float32, True, True)
    return dict(x=x, weight=weight, bias=bias, z=z, eps=1e-5, group_size=48, norm_before_gate=False)


def _set(**changes):
    return lambda args: args.update(changes)


# x's and z's rank cases drop a dim of one of them, which the shape check names as z's: covered below instead
BAD = [c for c in bad_input_cases(["x", "weight", "bias", "z"]) if c.id not in ("x-rank", "z-rank")] + [
    Case("z-shape", lambda a: a.update(z=a["z"][:, :48]), ValueError, "z must have x's shape"),
    Case("weight-length", lambda a: a.update(weight=a["weight"][:95]), ValueError, r"weight must be \[N\] = \[96\]"),
    Case("bias-length", lambda a: a.update(bias=torch.zeros(97)), ValueError, r"bias must be \[N\] = \[96\]"),
    Case("z-dtype", lambda a: a.update(z=a["z"].half()), TypeError, "x, z must share one dtype"),
    Case("group_size-not-dividing", _set(group_size=40), ValueError, "group_size = 40 must divide"),
    Case("group_size-zero", _set(group_size=0), ValueError, "group_size must be in"),
    Case("group_size-float", _set(group_size=48.0), TypeError, "group_size must be an int"),
    Case("group_size-too-large", lambda a: a.update(x=torch.randn(2, 2 * MAX_GROUP), z=None,
                                                     weight=torch.ones(2 * MAX_GROUP), bias=None, group_size=None),
         ValueError, f"group_size = {2 * MAX_GROUP}.*at most {MAX_GROUP}"),
    Case("eps-negative", _set(eps=-1e-5), ValueError, "eps must be a finite number >= 0"),
    Case("eps-string", _set(eps="1e-5"), TypeError, "eps must be a float"),
    Case("norm_before_gate-not-bool", _set(norm_before_gate=1), TypeError, "norm_before_gate must be a bool"),
    Case("x-no-channels", lambda a: a.update(x=torch.randn(7, 0), z=None, weight=torch.ones(0), bias=None,
                                              group_size=None), ValueError, "x must have at least one channel"),
]


@pytest.mark.parametrize("case", BAD, ids=case_id)
def test_refuses_bad_input(case):
    expect_refusal(rmsnorm_fn, _good, case)


def test_backward_op_refuses_a_wrong_gradient():
    """The backward launcher is an op of its own: a gradient of the wrong shape is named."""
    x, weight, _, z = _inputs((7, 96), torch.float32, True, False)
    _, rstd = interface_module._gated_rmsnorm_fwd(x, weight, None, z, 1e-5, 48, False)
    with pytest.raises(ValueError, match="dout must have shape"):
        interface_module._gated_rmsnorm_bwd(x, weight, None, z, rstd, torch.randn(7, 95), 48, False)


# ---------------------------------------------------------------- GPU: bf16 at a Mamba-2 layer's width
@pytest.mark.gpu
@pytest.mark.parametrize("group_size", [5120, 640], ids=["one-group", "eight-groups"])
@pytest.mark.parametrize("norm_before_gate", [False, True], ids=["gate-first", "norm-first"])
def test_gpu_bf16_layer_width(group_size, norm_before_gate):
    """Mamba-2 2.7B's d_inner (5120) at 2 × 1000 tokens, bf16, with a bias, against the formula."""
    _check((2, 1000, 5120), group_size, torch.bfloat16, norm_before_gate, True, True, tolerance(torch.bfloat16),
           device="cuda")
