"""The Gluon FlashAttention backward for Hopper (attention_kernels/flash_attn/gluon_backward.py): its dK/dV kernel
and the Triton dQ pass or the Gluon dQ kernel, called directly (`flash_attn_func` dispatches its backward here only
where measured faster, `interface.gluon_bwd_form`, so these tests do not go through it).

On any machine: the dK/dV kernel compiles for sm_90a with no spills and with wgmma and TMA copies (ptxas judges
it), and the call refuses what it cannot take before any launch. On a Hopper GPU: dq, dk, dv against the fp64
reference written from the formula (attention_ref and autograd) on lengths that are not tile multiples, T != S,
GQA 4:1, MQA and MHA (a group split into parts, and not), with the causal mask and without, at D = 64 (3 ring
slots) and 128 (2); and a NaN or inf that the causal mask hides from some rows or keys (tests/reference_cases.py's
cases, at D = 64) reaching exactly the gradients that see it. The Gluon dQ kernel (`gluon_dq.py`,
`gluon_attention_bwd(dq_kernel="gluon")`): compiled the same way on any machine, the keyword refused by name; on a
Hopper GPU, the same reference checks over fewer shapes (GQA, MQA, MHA, causal or not, T != S, T = 1), the NaN
and inf cases, its delta against the Triton pass's, and two calls giving the same bits.
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
DQ_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "flash_attn_gluon_dq_compile.py"
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


@pytest.mark.parametrize("D", [64, 128])
def test_gluon_dq_kernel_compiles_for_hopper_without_spills(D):
    """No GPU needed: the Gluon dQ kernel at D, causal, bf16 compiled for sm_90a: no spills, no serialized wgmma,
    shared memory fits, wgmma and TMA copies in the PTX, and S waited on with dP still running in each of the
    4 updates (2 warpgroups x masked or not: `wgmma.wait_group 1` at 4 of 12 waits; the script exits 1
    otherwise)."""
    if not triton_tested():
        pytest.skip(f"the Gluon kernels run on Triton {', '.join(TESTED_TRITON)} only "
                    "(attention_kernels.launch.TESTED_TRITON)")
    done = subprocess.run([sys.executable, str(DQ_SCRIPT), "--only", str(D), "causal"], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert f"=== fa_bwd_dq_ws_d{D}_causal" in out, out[-3000:]
    assert "spill stores 0 B, spill loads 0 B" in out and "OK" in out, out[-3000:]
    assert "'wgmma': 0" not in out and "'tma_load': 0" not in out, out[-3000:]
    assert "wgmma.wait_group 1 at 4 of 12 waits, 12 commit groups" in out, out[-3000:]


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
    from attention_kernels.flash_attn import gluon_dq
    monkeypatch.setattr(gluon_dq, "launch_direct", launched)   # the Gluon dQ kernel
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


@pytest.mark.parametrize("dq_kernel", ["cuda", "Gluon", None, True])
def test_gluon_backward_refuses_an_unknown_dq_kernel(dq_kernel, monkeypatch):
    """dq_kernel takes "triton" or "gluon" only: anything else is a ValueError naming the argument, before any
    launch (the GPU played as a Hopper)."""
    gb = _no_launch(monkeypatch)
    with pytest.raises(ValueError, match="^dq_kernel: must be 'triton' or 'gluon', got "):
        gb.gluon_attention_bwd(*_inputs(), causal=True, softmax_scale=0.125, dq_kernel=dq_kernel)


@pytest.mark.parametrize("change, error, message", [
    (lambda a: _with(a, lse=a[5].half()), TypeError, "^lse has dtype"),
    (lambda a: _with(a, o=a[4][:, :4]), ValueError, "^o must have shape"),
], ids=["lse-fp16", "o-shape"])
def test_gluon_backward_with_the_gluon_dq_kernel_refuses_before_any_launch(change, error, message, monkeypatch):
    """With dq_kernel="gluon" the same checks come first: neither kernel is launched for inputs it cannot take."""
    gb = _no_launch(monkeypatch)
    with pytest.raises(error, match=message):
        gb.gluon_attention_bwd(*change(_inputs()), causal=True, softmax_scale=0.125, dq_kernel="gluon")


def test_gluon_dq_kernel_tiles_fit():
    """The dQ kernel's tiles as its comment counts them, per consumer thread: S and dP (BN / 2 fp32 registers
    each), the dQ accumulator (D / 2) and dS as a 16-bit operand (BN / 4) within two thirds of its 240 registers,
    the rest left to P, the mask and addresses; Q and dO resident plus the ring within 227 KB of shared memory;
    the partitions' registers within what the launch reserves."""
    from attention_kernels.flash_attn import gluon_dq
    for D, (BN, STAGES) in gluon_dq.DQ_TILES.items():
        assert BN + D // 2 + BN // 4 <= 2 * gluon_dq.WS_CONSUMER_REGS // 3, (D, BN)
        resident = 2 * gluon_dq.BM * D * 2
        ring = STAGES * 2 * BN * D * 2
        assert resident + ring <= 227 * 1024, (D, BN, STAGES)
    assert 2 * 128 * gluon_dq.WS_CONSUMER_REGS + 32 * gluon_dq.WS_PRODUCER_REGS <= 384 * gluon_dq.WS_MAXNREG


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


def _check_against_reference(B, T, S, HQ, HKV, D, causal, dq_kernel="triton"):
    """dq, dk, dv of the Gluon backward (bf16; dQ from `dq_kernel`) for the Triton forward's o and lse, against
    autograd through the fp64 reference; relative error within the Triton backward's tolerance
    (tests/test_flash_attn.py `_tols`)."""
    from attention_kernels.flash_attn.forward import attention_fwd
    dtype = torch.bfloat16
    q = torch.randn(B, T, HQ, D, device="cuda", dtype=dtype)
    k, v = torch.randn(2, B, S, HKV, D, device="cuda", dtype=dtype)
    do = torch.randn_like(q)
    scale = D ** -0.5
    o, lse = attention_fwd(q, k, v, causal, scale)
    grads = _gluon_backward().gluon_attention_bwd(do, q, k, v, o, lse, causal, scale, dq_kernel=dq_kernel)
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


# the dQ pass beside the dK/dV kernel (the NaN and inf cases run both)
DQ_KERNELS = pytest.mark.parametrize("dq_kernel", ["triton", "gluon"], ids=["triton-dq", "gluon-dq"])


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


def _poisoned_backward(shape, poison, dq_kernel):
    """The Gluon backward (bf16, causal; dQ from `dq_kernel`) with the Triton forward's o and lse, on q, k, v, do after
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
    grads = _gluon_backward().gluon_attention_bwd(do, q, k, v, o, lse, True, scale, dq_kernel=dq_kernel)
    qr, kr, vr = (t.double().requires_grad_() for t in clean[:3])
    o_ref = attention_ref(qr, kr, vr, causal=True, softmax_scale=scale, compute_dtype=torch.float64)
    return grads, torch.autograd.grad(o_ref, (qr, kr, vr), clean[3].double())


def _at_gluon_head_dim(shape):
    """A shared NaN case's shape at D = 64, the Gluon backward's smallest head dim (the cases have 32 or 64)."""
    return (*shape[:5], 64)


def _case_ids(cases, what):
    return [f"T{s[1]}-S{s[2]}-Hq{s[3]}-Hkv{s[4]}-{what}{at}" for s, at in cases]


@pytest.mark.gpu
@DQ_KERNELS
@pytest.mark.parametrize("poison", KEY_POISONS)
@pytest.mark.parametrize("shape, key", HIDDEN_KEY_CASES, ids=_case_ids(HIDDEN_KEY_CASES, "key"))
def test_gpu_gluon_backward_hidden_key_does_not_leak(shape, key, poison, dq_kernel):
    """A NaN or inf in K or V at one key of KV head 0 reaches the dq of exactly the rows that see that key (of
    KV head 0's query heads); through those rows' lse (a NaN in K) or o and so delta (in V), the dk of exactly
    the keys those rows see in KV head 0, and with a NaN in K their dv. Everything else matches the reference
    computed with that value zeroed; with V poisoned dv (P^T dO) matches it everywhere. With either dQ pass (the
    Gluon dQ kernel's masked tiles take dS K on the CUDA cores when K holds a NaN or an inf)."""
    _skip_unless_hopper()
    B, T, S, HQ, HKV, D = shape = _at_gluon_head_dim(shape)
    (dq, dk, dv), (dq_ref, dk_ref, dv_ref) = _poisoned_backward(
        shape, lambda q, k, v, do: poison_key(k, v, key, poison), dq_kernel)
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
@DQ_KERNELS
@pytest.mark.parametrize("poison", ROW_POISONS)
@pytest.mark.parametrize("shape, row", HIDDEN_QUERY_CASES, ids=_case_ids(HIDDEN_QUERY_CASES, "row"))
def test_gpu_gluon_backward_hidden_query_does_not_leak(shape, row, poison, dq_kernel):
    """A NaN in Q or dO at one row of query head 0 reaches that row's dq only; a NaN in dO the dk of exactly the
    keys that row sees (KV head 0), a NaN in Q their dv: a pair the mask hides has dS = 0 and P = 0. The other
    pairing (dV with a NaN in dO, dK with one in Q) meets 0 * NaN and spreads over KV head 0, as in the Triton
    backward; the other KV heads' dk and dv match the reference computed with the value zeroed. With either dQ
    pass."""
    _skip_unless_hopper()
    B, T, S, HQ, HKV, D = shape = _at_gluon_head_dim(shape)
    (dq, dk, dv), (dq_ref, dk_ref, dv_ref) = _poisoned_backward(
        shape, lambda q, k, v, do: poison_row(q, do, row, poison), dq_kernel)
    compare_poisoned_row((dq, dk, dv), (dq_ref, dk_ref, dv_ref), T, S, HQ, HKV, row, poison, BF16_TOL)
    assert HKV > 1, "the case needs a KV head the poisoned row does not use"
    assert_matches_reference(("dk", "dv"), (dk[:, :, 1:], dv[:, :, 1:]), (dk_ref[:, :, 1:], dv_ref[:, :, 1:]),
                             (BF16_TOL, BF16_TOL))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("T", [1, 77, 4100])
def test_gpu_gluon_dq_kernel_matches_reference(T, D, causal):
    """The Gluon dQ kernel beside the dK/dV kernel, T = S, GQA 4:1: lengths that are no multiples of the 128-row
    query block or the 64-key tile, one row, many more key tiles than the ring's slots."""
    _skip_unless_hopper()
    _check_against_reference(1 if T > 1000 else 2, T, T, 8, 2, D, causal, "gluon")


@pytest.mark.gpu
@pytest.mark.parametrize("HQ, HKV", [(4, 1), (4, 4)], ids=["mqa", "mha"])
def test_gpu_gluon_dq_kernel_heads(HQ, HKV):
    """MQA (every query head reads KV head 0) and MHA, D = 64, T = 1000, causal."""
    _skip_unless_hopper()
    _check_against_reference(2, 1000, 1000, HQ, HKV, 64, True, "gluon")


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("T, S", [(77, 1000), (1000, 77), (300, 5)], ids=["T<S", "T>S", "rows-see-nothing"])
def test_gpu_gluon_dq_kernel_unequal_lengths(T, S, causal):
    """T != S at D = 128, GQA 4:1; causal with T > S the first T - S rows see no key: their dq is 0 (the
    reference's), whole query blocks of them take no key tile."""
    _skip_unless_hopper()
    _check_against_reference(2, T, S, 8, 2, 128, causal, "gluon")


@pytest.mark.gpu
@pytest.mark.parametrize("T, S, causal", [(1000, 1000, True), (77, 300, False), (300, 77, True)])
def test_gpu_gluon_dq_kernel_delta_and_determinism(T, S, causal):
    """delta = rowsum(dO o O) from the Gluon dQ kernel against the Triton dQ pass's (both fp32 sums of the same
    products), dq against the Triton pass's within bf16 rounding, and two calls giving the same bits (one CTA
    owns each dq row: no atomics)."""
    _skip_unless_hopper()
    from attention_kernels.flash_attn.backward import dq_and_delta
    from attention_kernels.flash_attn.forward import attention_fwd
    from attention_kernels.flash_attn.gluon_dq import gluon_dq_and_delta
    B, HQ, HKV, D = 2, 8, 2, 128
    q, do = torch.randn(2, B, T, HQ, D, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn(2, B, S, HKV, D, device="cuda", dtype=torch.bfloat16)
    scale = D ** -0.5
    o, lse = attention_fwd(q, k, v, causal, scale)
    dq, delta = gluon_dq_and_delta(do, q, k, v, o, lse, causal, scale)
    dq_triton, delta_triton = dq_and_delta(do, q, k, v, o, lse, causal, scale)
    assert delta.shape == (B, HQ, T) and delta.dtype == torch.float32
    assert rel_err(delta, delta_triton) <= tolerance(torch.float32)
    assert rel_err(dq, dq_triton) <= BF16_TOL
    again = gluon_dq_and_delta(do, q, k, v, o, lse, causal, scale)
    assert torch.equal(again[0], dq) and torch.equal(again[1], delta)


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
