"""The Gluon FlashAttention backward for Hopper (attention_kernels/flash_attn/gluon_backward.py): its dK/dV kernel
and the Triton dQ pass, called directly (`flash_attn_func` dispatches its backward here only where measured faster,
`interface.gluon_bwd_faster`, so these tests do not go through it).

On any machine: the dK/dV kernel compiles for sm_90a with no spills and with wgmma and TMA copies (ptxas judges
it), and the call refuses what it cannot take before any launch. On a Hopper GPU: dq, dk, dv against the fp64
reference written from the formula (attention_ref and autograd) on lengths that are not tile multiples, T != S,
GQA 4:1, MQA and MHA (a group split into parts, and not), with the causal mask and without, at D = 64 (3 ring
slots) and 128 (2); and a NaN or inf that the causal mask hides from some rows or keys (tests/reference_cases.py's
cases, at D = 64) reaching exactly the gradients that see it.
"""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attention_kernels.common import rel_err, tolerance
from attention_kernels.flash_attn import attention_ref
from attention_kernels.launch import TESTED_TRITON, triton_tested
from reference_cases import (HIDDEN_KEY_CASES, HIDDEN_QUERY_CASES, KEY_POISONS, ROW_POISONS, assert_matches_reference,
                             compare_poisoned_row, compare_rows, keys_seen_by, on_heads, poison_key, poison_row,
                             rows_seeing_key)

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "flash_attn_gluon_bwd_compile.py"
PROBE = Path(__file__).resolve().parent.parent / "scripts" / "tune_probe.py"


def _gluon_backward():
    from attention_kernels.flash_attn import gluon_backward
    return gluon_backward


@pytest.mark.parametrize("D", [64, 128])
def test_gluon_backward_compiles_for_hopper_without_spills(D):
    """No GPU needed: the dK/dV kernel at D, causal, bf16 compiled for sm_90a; ptxas reports no spills, the wgmma
    pipeline is not serialized, shared memory fits, and the PTX holds wgmma and TMA copies (the script exits 1
    otherwise)."""
    if not triton_tested():
        pytest.skip(f"the Gluon kernels run on Triton {', '.join(TESTED_TRITON)} only "
                    "(attention_kernels.launch.TESTED_TRITON)")
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", str(D), "causal"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert f"=== fa_bwd_dkdv_ws_d{D}_causal" in out, out[-3000:]
    assert "spill stores 0 B, spill loads 0 B" in out and "OK" in out, out[-3000:]
    assert "'wgmma': 0" not in out and "'tma_load': 0" not in out, out[-3000:]


def test_compile_script_refuses_a_loop_it_does_not_have():
    """No GPU needed: `--only 128 causal overlapped` ends with a message naming the word, before compiling
    anything, instead of compiling the in-order loop in its place (the forward's script shares the parser; the
    backward has the in-order loop only)."""
    if not triton_tested():
        pytest.skip(f"the Gluon kernels run on Triton {', '.join(TESTED_TRITON)} only "
                    "(attention_kernels.launch.TESTED_TRITON)")
    done = subprocess.run([sys.executable, str(SCRIPT), "--only", "128", "causal", "overlapped"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0 and "got 'overlapped'" in done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    assert "===" not in done.stdout, done.stdout[-3000:]


def _inputs(dtype=torch.bfloat16, D=64, device="cpu"):
    """do, q, k, v, o, lse of a small GQA call (B 1, T = S = 8, 4 query heads, 2 KV heads)."""
    q, o, do = torch.randn(3, 1, 8, 4, D, dtype=dtype, device=device).unbind(0)
    k, v = torch.randn(2, 1, 8, 2, D, dtype=dtype, device=device).unbind(0)
    lse = torch.randn(1, 4, 8, device=device)
    return do, q, k, v, o, lse


def _no_launch(monkeypatch):
    """Play the GPU as a Hopper where there is none, and fail any launch: a refusal must come first."""
    gb = _gluon_backward()
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))

    def launched(*args, **kwargs):
        raise AssertionError("a kernel was launched before the inputs were refused")

    monkeypatch.setattr(gb, "dq_and_delta", launched)   # the Triton dQ pass
    monkeypatch.setattr(gb, "launch_direct", launched)
    return gb


def _with(args, **changes):
    names = ("do", "q", "k", "v", "o", "lse")
    return [changes.get(name, a) for name, a in zip(names, args)]


@pytest.mark.parametrize("change, error, message", [
    (lambda a: _with(a, **{n: t.float() for n, t in zip(("do", "q", "k", "v", "o"), a)}), TypeError, "^q has dtype"),
    (lambda a: _with(a, k=a[2].half(), v=a[3].half()), TypeError, "^k has dtype"),
    (lambda a: _with(a, lse=a[5].half()), TypeError, "^lse has dtype"),
    (lambda a: [t[..., :32].contiguous() if t.dim() == 4 else t for t in a], ValueError, "^q: head dim"),
    (lambda a: _with(a, q=a[1][..., :3, :].contiguous(), o=a[4][..., :3, :].contiguous(),
                     do=a[0][..., :3, :].contiguous(), lse=a[5][:, :3]), ValueError, "multiple of KV heads"),
    (lambda a: _with(a, o=a[4][:, :4]), ValueError, "^o must have shape"),
    (lambda a: _with(a, q=a[1].transpose(1, 2).contiguous().transpose(1, 2)), ValueError, "^q must be contiguous"),
], ids=["fp32", "k-fp16", "lse-fp16", "D32", "heads", "o-shape", "q-strided"])
def test_gluon_backward_refuses_what_it_cannot_take(change, error, message, monkeypatch):
    """TypeError or ValueError naming the argument, before any launch (the GPU played as a Hopper)."""
    gb = _no_launch(monkeypatch)
    with pytest.raises(error, match=message):
        gb.gluon_attention_bwd(*change(_inputs()), causal=True, softmax_scale=0.125)


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
def test_gluon_backward_refuses_packed_sequences(name, monkeypatch):
    gb = _no_launch(monkeypatch)
    with pytest.raises(ValueError, match=f"^{name}: the Gluon backward takes dense inputs only"):
        gb.gluon_attention_bwd(*_inputs(), causal=False, softmax_scale=0.125,
                               **{name: torch.tensor([0, 8], dtype=torch.int32)})


def test_gluon_backward_refuses_a_tensor_off_hopper():
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
        pytest.skip("this GPU is a Hopper: the kernel runs (see the gpu tests)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with pytest.raises(ValueError, match="Hopper"):
        _gluon_backward().gluon_attention_bwd(*_inputs(device=device), causal=False, softmax_scale=0.125)


# the Triton backward's bf16 tolerance for the gradients (tests/test_flash_attn.py `_tols`)
BF16_TOL = 3 * tolerance(torch.bfloat16, tf32_dots=True)


def _check_against_reference(B, T, S, HQ, HKV, D, causal):
    """dq, dk, dv of the Gluon backward (bf16) for the Triton forward's o and lse, against autograd through the
    fp64 reference; relative error within the Triton backward's tolerance (tests/test_flash_attn.py `_tols`)."""
    from attention_kernels.flash_attn.forward import attention_fwd
    dtype = torch.bfloat16
    q = torch.randn(B, T, HQ, D, device="cuda", dtype=dtype)
    k, v = torch.randn(2, B, S, HKV, D, device="cuda", dtype=dtype)
    do = torch.randn_like(q)
    scale = D ** -0.5
    o, lse = attention_fwd(q, k, v, causal, scale)
    grads = _gluon_backward().gluon_attention_bwd(do, q, k, v, o, lse, causal, scale)
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    o_ref = attention_ref(qr, kr, vr, causal=causal, softmax_scale=scale, compute_dtype=torch.float64)
    refs = torch.autograd.grad(o_ref, (qr, kr, vr), do.double())
    for name, got, like in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        assert got.shape == like.shape and got.dtype == dtype, f"{name}: {tuple(got.shape)} {got.dtype}"
    assert_matches_reference(("dq", "dk", "dv"), grads, refs, (BF16_TOL,) * 3)


# (query heads, KV heads): GQA 4:1 and MQA split their groups into parts at these sizes, MHA has none to split
HEADS = pytest.mark.parametrize("HQ, HKV", [(8, 2), (4, 1), (4, 4)], ids=["gqa4", "mqa", "mha"])


def _skip_unless_hopper():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon backward runs on Hopper only")


@pytest.mark.gpu
@HEADS
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("T", [1, 77, 1000, 4100])
def test_gpu_gluon_backward_matches_reference(T, D, causal, HQ, HKV):
    """T = S, not multiples of the 64-row query tile or the 128-key block."""
    _skip_unless_hopper()
    _check_against_reference(1 if T > 1000 else 2, T, T, HQ, HKV, D, causal)


@pytest.mark.gpu
@HEADS
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("T, S", [(77, 1000), (1000, 77), (300, 5)], ids=["T<S", "T>S", "rows-see-nothing"])
def test_gpu_gluon_backward_unequal_lengths(T, S, D, causal, HQ, HKV):
    """T != S, under the bottom-right causal mask too: with T > S the first T - S rows see no key (lse = +inf,
    P = 0)."""
    _skip_unless_hopper()
    _check_against_reference(2, T, S, HQ, HKV, D, causal)


def _poisoned_backward(shape, poison):
    """The Gluon backward (bf16, causal) with the Triton forward's o and lse, on q, k, v, do after
    `poison(q, k, v, do)` wrote a NaN or inf into them; and autograd through the fp64 reference on the clean
    inputs. Returns ((dq, dk, dv), (dq_ref, dk_ref, dv_ref))."""
    from attention_kernels.flash_attn.forward import attention_fwd
    B, T, S, HQ, HKV, D = shape
    q, do = torch.randn(2, B, T, HQ, D, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn(2, B, S, HKV, D, device="cuda", dtype=torch.bfloat16)
    clean = [t.clone() for t in (q, k, v, do)]
    poison(q, k, v, do)
    scale = D ** -0.5
    o, lse = attention_fwd(q, k, v, True, scale)
    grads = _gluon_backward().gluon_attention_bwd(do, q, k, v, o, lse, True, scale)
    qr, kr, vr = (t.double().requires_grad_() for t in clean[:3])
    o_ref = attention_ref(qr, kr, vr, causal=True, softmax_scale=scale, compute_dtype=torch.float64)
    return grads, torch.autograd.grad(o_ref, (qr, kr, vr), clean[3].double())


def _at_gluon_head_dim(shape):
    """A shared NaN case's shape at D = 64, the Gluon backward's smallest head dim (the cases have 32 or 64)."""
    return (*shape[:5], 64)


def _case_ids(cases, what):
    return [f"T{s[1]}-S{s[2]}-Hq{s[3]}-Hkv{s[4]}-{what}{at}" for s, at in cases]


@pytest.mark.gpu
@pytest.mark.parametrize("poison", KEY_POISONS)
@pytest.mark.parametrize("shape, key", HIDDEN_KEY_CASES, ids=_case_ids(HIDDEN_KEY_CASES, "key"))
def test_gpu_gluon_backward_hidden_key_does_not_leak(shape, key, poison):
    """A NaN or inf in K or V at one key of KV head 0 reaches the dq of exactly the rows that see that key (of
    KV head 0's query heads); through those rows' lse (a NaN in K) or o and so delta (in V), the dk of exactly
    the keys those rows see in KV head 0, and with a NaN in K their dv. Everything else matches the reference
    computed with that value zeroed; with V poisoned dv (P^T dO) matches it everywhere."""
    _skip_unless_hopper()
    B, T, S, HQ, HKV, D = shape = _at_gluon_head_dim(shape)
    (dq, dk, dv), (dq_ref, dk_ref, dv_ref) = _poisoned_backward(
        shape, lambda q, k, v, do: poison_key(k, v, key, poison))
    dev = dq.device
    rows = rows_seeing_key(T, S, key, dev)
    compare_rows("dq", dq, dq_ref, on_heads(rows, torch.arange(HQ, device=dev) < HQ // HKV), BF16_TOL)
    # every such row sees the last key, so the keys they see are all of KV head 0: one KV head has no clean side
    keys = on_heads(keys_seen_by(T, S, rows, dev), torch.arange(HKV, device=dev) == 0)
    compare_rows("dk", dk, dk_ref, keys, BF16_TOL, both_sides=False)
    if poison == "nan-in-k":
        compare_rows("dv", dv, dv_ref, keys, BF16_TOL, both_sides=False)
    else:
        assert_matches_reference(("dv", ), (dv, ), (dv_ref, ), (BF16_TOL, ))


@pytest.mark.gpu
@pytest.mark.parametrize("poison", ROW_POISONS)
@pytest.mark.parametrize("shape, row", HIDDEN_QUERY_CASES, ids=_case_ids(HIDDEN_QUERY_CASES, "row"))
def test_gpu_gluon_backward_hidden_query_does_not_leak(shape, row, poison):
    """A NaN in Q or dO at one row of query head 0 reaches that row's dq only; a NaN in dO the dk of exactly the
    keys that row sees (KV head 0), a NaN in Q their dv: a pair the mask hides has dS = 0 and P = 0. The other
    pairing (dV with a NaN in dO, dK with one in Q) meets 0 * NaN and spreads over KV head 0, as in the Triton
    backward; the other KV heads' dk and dv match the reference computed with the value zeroed."""
    _skip_unless_hopper()
    B, T, S, HQ, HKV, D = shape = _at_gluon_head_dim(shape)
    (dq, dk, dv), (dq_ref, dk_ref, dv_ref) = _poisoned_backward(
        shape, lambda q, k, v, do: poison_row(q, do, row, poison))
    compare_poisoned_row((dq, dk, dv), (dq_ref, dk_ref, dv_ref), T, S, HQ, HKV, row, poison, BF16_TOL)
    assert HKV > 1, "the case needs a KV head the poisoned row does not use"
    assert_matches_reference(("dk", "dv"), (dk[:, :, 1:], dv[:, :, 1:]), (dk_ref[:, :, 1:], dv_ref[:, :, 1:]),
                             (BF16_TOL, BF16_TOL))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_dq_pass_beside_the_gluon_kernel(causal):
    """On any machine (the Triton dQ programs run under the interpreter): `backward.dq_and_delta`, the dQ half of
    the Gluon backward, gives dq against autograd through the fp64 formula and delta = rowsum(dO o O), on a GQA
    call whose lengths are no tile multiples, T != S."""
    from attention_kernels.common import DEVICE
    from attention_kernels.flash_attn.backward import dq_and_delta
    from attention_kernels.flash_attn.forward import attention_fwd
    B, T, S, HQ, HKV, D = 1, 37, 45, 4, 2, 32
    q = torch.randn(B, T, HQ, D, device=DEVICE)
    k, v = torch.randn(2, B, S, HKV, D, device=DEVICE)
    do = torch.randn_like(q)
    scale = D ** -0.5
    o, lse = attention_fwd(q, k, v, causal, scale)
    dq, delta = dq_and_delta(do, q, k, v, o, lse, causal, scale)
    qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
    o_ref = attention_ref(qr, kr, vr, causal=causal, softmax_scale=scale, compute_dtype=torch.float64)
    (dq_ref, ) = torch.autograd.grad(o_ref, (qr, ), do.double())
    tol = 3 * tolerance(torch.float32, tf32_dots=True)
    assert rel_err(dq, dq_ref) <= tol
    assert rel_err(delta, (do.double() * o.double()).sum(-1).transpose(1, 2)) <= tolerance(torch.float32)


def test_tune_probe_runs_the_backward_probe():
    """`tune_probe.py fa_gluon_bwd` imports and is registered: without a GPU it gets as far as its first CUDA tensor
    (inside fa_gluon_bwd), not a KeyError or an ImportError."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the probe would run in full (minutes)")
    done = subprocess.run([sys.executable, str(PROBE), "fa_gluon_bwd"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and 'in fa_gluon_bwd' in done.stderr, done.stderr[-3000:]
    assert "KeyError" not in done.stderr and "ImportError" not in done.stderr, done.stderr[-3000:]
    assert "q = torch.randn(B, T, HQ, D, device=\"cuda\"" in done.stderr, done.stderr[-3000:]
