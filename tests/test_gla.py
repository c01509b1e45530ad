"""GLA (attention_kernels.gla): the three Triton forms and the references against an fp64 loop written from
the formula (MATH.md, GLA); gates from the paper's, strong and none to -inf (a full reset); odd
sizes; initial and final state; NaN and inf where a row cannot see them; every kind of bad input.

Tolerances come from attention_kernels.common.tolerance: the chunk kernel multiplies fp32 inputs in IEEE fp32
(input_precision="ieee") and the recurrent kernels have no dot products, so fp32 is held to the
fp32 tolerance on every machine. CPU (interpreter): fp32 and fp16 on small shapes. GPU: bf16 and
fp32 on fla's test shapes. Forward only.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from input_cases import Case, bad_input_cases, case_id, expect_refusal
from linear_cases import (POISONS, assert_inf_in_v, assert_poison_pattern, linear_input_cases, linear_kernel_cases,
                          linear_step_cases, poison, replace, shrink)
from attention_kernels.common import DEVICE, assert_close, tolerance
from attention_kernels.gla import chunk_gla, fused_recurrent_gla, naive_recurrent_gla, sequential_chunk_gla, torch_gla_step
from attention_kernels.gla.chunk import chunk_gla_scores
from attention_kernels.linear import CHUNK, chunk_local_cumsum

KERNELS = {"fused_recurrent": fused_recurrent_gla, "sequential_chunk": sequential_chunk_gla, "chunk": chunk_gla}
FORMS = {"naive": naive_recurrent_gla, **KERNELS}
FP32 = tolerance(torch.float32)


def ref_gla(q, k, v, gk, scale=None, h0=None):
    """S_t = Diag(exp gk_t) S_{t-1} + k_t v_t^T ; o_t = S_t^T (q_t * scale), in float64."""
    q, k, v, gk = (x.double() for x in (q, k, v, gk))
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = torch.zeros(B, H, K, v.shape[-1], dtype=torch.float64, device=q.device)
    if h0 is not None:
        S = S + h0.double()
    o = torch.empty(B, T, H, v.shape[-1], dtype=torch.float64, device=q.device)
    for t in range(T):
        S = gk[:, t].exp().unsqueeze(-1) * S + k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
        o[:, t] = (q[:, t].unsqueeze(-1) * scale * S).sum(-2)
    return o, S


def make(B, T, H, K, V, gate, dtype, device=DEVICE):
    q, k = (torch.randn(B, T, H, K, device=device) for _ in range(2))
    v = torch.randn(B, T, H, V, device=device)
    if gate == "paper":
        gk = F.logsigmoid(torch.randn(B, T, H, K, device=device)) / 16
    elif gate == "strong":          # decays down to e^-5 per step
        gk = -5 * torch.rand(B, T, H, K, device=device)
    else:                           # no decay at all
        gk = torch.zeros(B, T, H, K, device=device)
    h0 = torch.randn(B, H, K, V, device=device)
    return [x.to(dtype) for x in (q, k, v, gk)] + [h0]


def sid(s):
    B, T, H, K, V = s
    return f"B{B}-T{T}-H{H}-K{K}-V{V}"


CPU_SHAPES = [(1, 63, 1, 64, 64), (2, 77, 2, 60, 60), (1, 130, 2, 32, 48), (1, 20, 1, 256, 256)]

# every gate on every shape, except K = V = 256, which is slow under the interpreter: one gate there
CPU_CASES = [(shape, gate) for shape in CPU_SHAPES for gate in ("paper", "strong", "none")
             if shape[3] < 256 or gate == "paper"]


@pytest.mark.parametrize("shape, gate", CPU_CASES, ids=[f"{sid(s)}-{g}" for s, g in CPU_CASES])
@pytest.mark.parametrize("form", list(FORMS))
def test_forward_fp32(form, shape, gate):
    q, k, v, gk, h0 = make(*shape, gate, torch.float32)
    o_ref, S_ref = ref_gla(q, k, v, gk, h0=h0)
    o, S = FORMS[form](q, k, v, gk, initial_state=h0, output_final_state=True)
    assert not torch.isnan(o).any() and not torch.isnan(S).any()
    assert o.dtype == torch.float32 and S.dtype == torch.float32
    assert_close(o, o_ref, FP32, "o")
    assert_close(S, S_ref, FP32, "final state")


@pytest.mark.parametrize("form", ["fused_recurrent", "chunk"])
def test_no_initial_state_custom_scale(form):
    q, k, v, gk, _ = make(1, 70, 2, 32, 32, "paper", torch.float32)
    o_ref, _ = ref_gla(q, k, v, gk, scale=0.3)
    o, S = FORMS[form](q, k, v, gk, scale=0.3)
    assert S is None
    assert_close(o, o_ref, FP32, "o")


@pytest.mark.parametrize("T", [1, 2, 65])
def test_short_sequences(T):
    q, k, v, gk, h0 = make(2, T, 3, 60, 40, "strong", torch.float32)
    o_ref, S_ref = ref_gla(q, k, v, gk, h0=h0)
    for name, form in KERNELS.items():
        o, S = form(q, k, v, gk, initial_state=h0, output_final_state=True)
        assert_close(o, o_ref, FP32, f"{name} o")
        assert_close(S, S_ref, FP32, f"{name} state")


@pytest.mark.parametrize("form", ["fused_recurrent", "chunk"])
def test_forward_fp16(form):
    q, k, v, gk, h0 = make(1, 77, 2, 64, 64, "paper", torch.float16)
    o_ref, S_ref = ref_gla(q, k, v, gk, h0=h0)
    o, S = FORMS[form](q, k, v, gk, initial_state=h0, output_final_state=True)
    assert o.dtype == torch.float16 and not torch.isnan(o).any()
    assert_close(o, o_ref, tolerance(torch.float16), "o")
    assert_close(S, S_ref, tolerance(torch.float16), "final state")


def test_forms_agree():
    q, k, v, gk, h0 = make(2, 100, 2, 48, 64, "paper", torch.float32)
    outs = [f(q, k, v, gk, initial_state=h0, output_final_state=True) for f in FORMS.values()]
    for o, S in outs[1:]:
        assert_close(o, outs[0][0], FP32, "o")
        assert_close(S, outs[0][1], FP32, "state")


def test_decode_steps_continue_a_prefill():
    """chunk prefill then T=1 steps from its state (and the PyTorch step) = the whole sequence at once."""
    q, k, v, gk, h0 = make(1, 72, 2, 32, 32, "paper", torch.float32)
    o_all, S_all = ref_gla(q, k, v, gk, h0=h0)
    _, S = chunk_gla(q[:, :64], k[:, :64], v[:, :64], gk[:, :64], initial_state=h0, output_final_state=True)
    S_torch = S.clone()
    for t in range(64, 72):
        o, S = fused_recurrent_gla(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], gk[:, t:t + 1],
                                   initial_state=S, output_final_state=True)
        o_torch, S_torch = torch_gla_step(q[:, t], k[:, t], v[:, t], gk[:, t], S_torch)
        assert_close(o, o_all[:, t:t + 1], FP32, f"o at step {t}")
        assert_close(o_torch, o_all[:, t], FP32, f"PyTorch step o at step {t}")
    assert_close(S, S_all, FP32, "state")
    assert_close(S_torch, S_all, FP32, "PyTorch step state")


def test_references_take_fp64():
    q, k, v, gk, h0 = (x.double() for x in make(1, 9, 2, 8, 12, "paper", torch.float32))
    o, S = naive_recurrent_gla(q, k, v, gk, initial_state=h0, output_final_state=True)
    o_ref, S_ref = ref_gla(q, k, v, gk, h0=h0)
    assert o.dtype == S.dtype == torch.float64
    assert_close(o, o_ref, 1e-12, "o")
    o1, S1 = torch_gla_step(q[:, 0], k[:, 0], v[:, 0], gk[:, 0], h0)
    assert o1.dtype == S1.dtype == torch.float64
    assert_close(o1, ref_gla(q[:, :1], k[:, :1], v[:, :1], gk[:, :1], h0=h0)[0][:, 0], 1e-12, "step o")


# ------------------------------------------------------------------ gates of -inf: a full reset
# A log gate of -inf forgets the channel. The recurrent forms get e^-inf = 0; the chunk form takes
# differences of cumulative gates, where -inf - -inf would be NaN: its gates are raised to
# GATE_FLOOR first, which changes nothing above fp32's underflow.
@pytest.mark.parametrize("resets", [[40], [CHUNK], [CHUNK - 1], [0, 100]],
                         ids=["mid-chunk", "chunk-start", "chunk-end", "first-and-later"])
@pytest.mark.parametrize("form", list(FORMS))
def test_gate_minus_inf_resets(form, resets):
    q, k, v, gk, h0 = make(2, 130, 2, 40, 24, "paper", torch.float32)
    gk[:, resets, 1] = -math.inf                 # head 1 forgets every channel there; head 0 one channel
    gk[:, resets, 0, 5] = -math.inf
    o_ref, S_ref = ref_gla(q, k, v, gk, h0=h0)
    assert torch.isfinite(o_ref).all()
    o, S = FORMS[form](q, k, v, gk, initial_state=h0, output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    assert_close(o, o_ref, FP32, "o")
    assert_close(S, S_ref, FP32, "final state")
    # what came before a reset is gone: head 1's output after it does not depend on the earlier tokens
    last = resets[-1]
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    k2[:, :last], v2[:, :last] = torch.randn_like(k2[:, :last]), torch.randn_like(v2[:, :last])
    o2, _ = FORMS[form](q2, k2, v2, gk, initial_state=torch.randn_like(h0))
    assert_close(o2[:, last:, 1], o[:, last:, 1], FP32, "o after the reset")


def test_many_resets_fp16():
    """Resets at every third token: each adds GATE_FLOOR to the cumulative gate, so the chunk form's
    exponents lose more of their low bits the more resets a chunk holds; fp16 hides that."""
    q, k, v, gk, h0 = make(1, 100, 2, 32, 32, "paper", torch.float16)
    gk[:, ::3] = -math.inf
    o_ref, S_ref = ref_gla(q, k, v, gk, h0=h0)
    for name, form in KERNELS.items():
        o, S = form(q, k, v, gk, initial_state=h0, output_final_state=True)
        assert torch.isfinite(o).all(), name
        assert_close(o, o_ref, tolerance(torch.float16), f"{name} o")
        assert_close(S, S_ref, tolerance(torch.float16), f"{name} state")


# ------------------------------------------------------------------ NaN and inf a row cannot see
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("token", [35, CHUNK + 5], ids=["t35", "t69"])
@pytest.mark.parametrize("poison_case", list(POISONS))
@pytest.mark.parametrize("form", list(FORMS))
def test_poison_reaches_only_later_rows(form, poison_case, token):
    name, value = POISONS[poison_case]
    args = dict(zip(["q", "k", "v", "gk", "h0"], make(2, 77, 2, 40, 24, "paper", torch.float32)))
    h0 = args.pop("h0")
    clean = poison(args, name, value, token)
    o_ref, _ = ref_gla(*clean.values(), h0=h0)
    o, S = FORMS[form](*args.values(), initial_state=h0, output_final_state=True)
    assert_poison_pattern(o, S, o_ref, name, token)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("form", list(FORMS))
def test_inf_in_v_with_one_channel(form):
    """K = V = 1, +inf in v at token 4: the recurrent forms give the math's ±inf from there on, the
    chunk forms NaN, and no form anything non-finite before it."""
    q, k, v, gk, _ = make(1, 10, 1, 1, 1, "paper", torch.float32)
    v[:, 4] = math.inf
    o_exact, _ = ref_gla(q, k, v, gk)
    o, _ = FORMS[form](q, k, v, gk)
    assert_inf_in_v(o, o_exact, token=4, exact=form in ("naive", "fused_recurrent"))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_scores_hide_later_keys():
    """GLA's score kernel on its own: the diagonal 16 x 16 block is written whole, and its entries
    above the diagonal are exactly 0 even where the later key is NaN (a select, not a factor 0)."""
    B, T, H, K = 1, 77, 2, 40
    q, k, _, gk, _ = make(B, T, H, K, 8, "paper", torch.float32)
    k[:, 37, 0] = math.nan                             # sub-chunk rows 32..47 of chunk 0
    g = torch.empty(B, T, H, K, dtype=torch.float32, device=DEVICE)
    chunk_local_cumsum(gk, g)
    A = torch.full((B, T, H, CHUNK), 7.0, device=DEVICE)
    chunk_gla_scores(q, k, g, A, scale=0.25)
    assert torch.equal(A[:, 32:37, 0, 37], torch.zeros_like(A[:, 32:37, 0, 37])), "rows before t = 37"
    assert torch.isnan(A[:, 37:48, 0, 37]).all()
    assert torch.isfinite(A[:, :, 1]).all() and torch.isfinite(A[:, :37, 0, :37]).all()


@pytest.mark.parametrize("form", list(FORMS))
def test_nan_past_the_end_of_a_view(form):
    """Inputs that are views into longer buffers holding NaN past T: never read."""
    B, T, H, K, V = 1, 70, 2, 32, 16
    bufs = [torch.full((B, T + 30, H, d), math.nan, device=DEVICE) for d in (K, K, V, K)]
    q, k, v, gk = (b[:, :T] for b in bufs)
    for x, real in zip((q, k, v, gk), make(B, T, H, K, V, "paper", torch.float32)):
        x.copy_(real)
    o_ref, _ = ref_gla(q, k, v, gk)
    o, _ = FORMS[form](q, k, v, gk)
    assert_close(o, o_ref, FP32, "o")


# ------------------------------------------------------------------ layout and inputs left alone
@pytest.mark.parametrize("form", list(FORMS))
def test_non_contiguous_inputs(form):
    q, k, v, gk, h0 = make(2, 40, 2, 32, 24, "paper", torch.float32)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)            # same values, heads outermost
    vt = torch.cat([v, torch.randn_like(v)], dim=-1)[..., :24]     # a strided slice
    gt = gk[..., :1].expand_as(gk)                                 # a stride-0 gate (one per head)
    ht = h0.transpose(-1, -2).contiguous().transpose(-1, -2)
    o_ref, S_ref = ref_gla(q, k, v, gt, h0=h0)
    o, S = FORMS[form](qt, k, vt, gt, initial_state=ht, output_final_state=True)
    assert_close(o, o_ref, FP32, "o")
    assert_close(S, S_ref, FP32, "final state")


@pytest.mark.parametrize("form", list(FORMS))
def test_inputs_are_not_modified(form):
    q, k, v, gk, h0 = make(1, 70, 2, 16, 16, "strong", torch.float32)
    before = [x.clone() for x in (q, k, v, gk, h0)]
    FORMS[form](q, k, v, gk, initial_state=h0, output_final_state=True)
    for x, b in zip((q, k, v, gk, h0), before):
        assert torch.equal(x, b)


def test_step_does_not_modify_the_state():
    q, k, v, gk, h0 = make(2, 1, 2, 16, 16, "strong", torch.float32)
    before = h0.clone()
    torch_gla_step(q[:, 0], k[:, 0], v[:, 0], gk[:, 0], h0)
    assert torch.equal(h0, before)


# ------------------------------------------------------------------ bad input
# Every class of bad input raises before any launch, with the argument named (tests/input_cases.py for
# the classes every family shares, then GLA's own).
TENSORS = ["q", "k", "v", "gk", "initial_state"]
FLOAT_TENSORS = ["q", "k", "v", "gk"]    # initial_state must be fp32: its own cases below


def _good():
    q, k, v, gk, h0 = make(1, 8, 2, 16, 12, "paper", torch.float32)
    return dict(q=q, k=k, v=v, gk=gk, initial_state=h0, output_final_state=True)


def _step_good():
    args = _good()
    args = {n: args[n][:, 0] for n in ("q", "k", "v", "gk")} | {"state": args["initial_state"]}
    return args


SHARED_CASES = linear_input_cases(token_tensors=("q", "k", "v", "gk"), key_tensors=("q", "k", "gk")) + [
    Case("gk-channels", replace(gk=lambda a: a["gk"][..., :8]), ValueError, r"gk must be \[B, T, H, K\]"),
    Case("gk-per-head", replace(gk=lambda a: a["gk"][..., :1]), ValueError, r"gk must be \[B, T, H, K\]"),
]
KERNEL_CASES = linear_kernel_cases(key_tensors=("q", "k", "gk"))


@pytest.mark.parametrize("case", bad_input_cases(TENSORS, float_tensors=FLOAT_TENSORS) + SHARED_CASES
                         + KERNEL_CASES, ids=case_id)
@pytest.mark.parametrize("form", list(KERNELS))
def test_kernels_refuse(form, case):
    expect_refusal(KERNELS[form], _good, case)


@pytest.mark.parametrize("case", bad_input_cases(TENSORS, kernel=False, float_tensors=FLOAT_TENSORS)
                         + SHARED_CASES, ids=case_id)
def test_reference_refuses(case):
    expect_refusal(naive_recurrent_gla, _good, case)


STEP_CASES = linear_step_cases() + [
    Case("gk-channels", replace(gk=lambda a: a["gk"][..., :3]), ValueError, r"gk must be \[B, H, K\]"),
    Case("empty-batch", shrink(0, "q", "k", "v", "gk", "state"), ValueError, "q must have every size >= 1"),
]


@pytest.mark.parametrize("case", bad_input_cases(["q", "k", "v", "gk", "state"], kernel=False,
                                                 float_tensors=["q", "k", "v", "gk"]) + STEP_CASES, ids=case_id)
def test_step_refuses(case):
    expect_refusal(torch_gla_step, _step_good, case)


@pytest.mark.parametrize("fn, good", [(naive_recurrent_gla, _good), (torch_gla_step, _step_good)],
                         ids=["naive_recurrent_gla", "torch_gla_step"])
def test_references_refuse_meta_tensors(fn, good):
    args = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in good().items()}
    with pytest.raises(ValueError, match="q is a meta tensor"):
        fn(**args)


# ------------------------------------------------------------------ GPU (bf16, fla's shapes)
# fla's test shapes; every (dtype, K, V) pair costs one compile per autotune config, so fp32
# runs on the K = 64 shapes only (one specialization: T, H and the chunk count are not
# specialized) and each test checks all three Triton forms against one fp64 reference.
GPU_SHAPES = [(1, 63, 1, 64, 64), (2, 1024, 4, 60, 60), (2, 1024, 8, 128, 128), (4, 2048, 8, 64, 64)]
GPU_CASES = ([(torch.bfloat16, s, g) for s in GPU_SHAPES for g in ("strong", "none")]
             + [(torch.bfloat16, GPU_SHAPES[2], "paper")]
             + [(torch.float32, s, g) for s in (GPU_SHAPES[0], GPU_SHAPES[3]) for g in ("strong", "none")])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,shape,gate", GPU_CASES,
                         ids=[f"{str(d)[6:]}-{sid(s)}-{g}" for d, s, g in GPU_CASES])
def test_forward_gpu(dtype, shape, gate):
    q, k, v, gk, h0 = make(*shape, gate, dtype, device="cuda")
    o_ref, S_ref = ref_gla(q, k, v, gk, h0=h0)
    for name, form in KERNELS.items():
        o, S = form(q, k, v, gk, initial_state=h0, output_final_state=True)
        assert not torch.isnan(o).any() and not torch.isnan(S).any(), name
        assert_close(o, o_ref, tolerance(dtype), f"{name} o")
        assert_close(S, S_ref, tolerance(dtype), f"{name} final state")


@pytest.mark.gpu
def test_resets_and_poison_gpu():
    """bf16 at a real size: a reset at a chunk start and mid-chunk, a NaN in v at token 1000."""
    q, k, v, gk, h0 = make(2, 2048, 8, 128, 128, "paper", torch.bfloat16, device="cuda")
    gk[:, [CHUNK * 5, 1000]] = -math.inf
    v[:, 1500, 3] = math.nan
    clean = v.clone()
    clean[:, 1500, 3] = 0
    o_ref, _ = ref_gla(q, k, clean, gk, h0=h0)
    for name, form in KERNELS.items():
        o, _ = form(q, k, v, gk, initial_state=h0)
        poisoned = torch.zeros_like(o, dtype=torch.bool)
        poisoned[:, 1500:, 3] = True
        assert torch.equal(~torch.isfinite(o), poisoned), name
        assert_close(o[:, :1500], o_ref[:, :1500], tolerance(torch.bfloat16), f"{name} o before the NaN")


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 8, 64])
def test_decode_step_gpu(B):
    q, k, v, gk, h0 = make(B, 1, 32, 128, 128, "paper", torch.bfloat16, device="cuda")
    o_ref, S_ref = ref_gla(q, k, v, gk, h0=h0)
    o, S = fused_recurrent_gla(q, k, v, gk, initial_state=h0, output_final_state=True)
    assert_close(o, o_ref, tolerance(torch.bfloat16), "o")
    assert_close(S, S_ref, FP32, "state (fp32 math on the bf16 inputs)")
    o_t, S_t = torch_gla_step(q[:, 0], k[:, 0], v[:, 0], gk[:, 0], h0)
    assert_close(o_t, o_ref[:, 0], tolerance(torch.bfloat16), "PyTorch step o")
    assert_close(S_t, S_ref, FP32, "PyTorch step state")


@pytest.mark.gpu
def test_forward_past_32_bit_state_offsets_gpu():
    """B 9, T 64K, 16 heads, K = V = 128, bf16: the chunk-start states [9, 1024, 16, 128, 128] hold 2.4e9
    elements, so every state offset of the last batch row passes 2^31 (in the state pass that writes them and the
    output kernel that reads them; the per-token tensors stay under it, 1.2e9). A sequence's output and final
    state do not depend on the other rows: the last row's, from the batch of 9, match the same call on that row
    alone (~24 GB)."""
    B, T, H, D = 9, 65536, 16, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    rand = lambda: torch.randn(B, T, H, D, device="cuda", generator=gen, dtype=torch.bfloat16)   # noqa: E731
    q, k, v = rand(), rand(), rand()
    gk = F.logsigmoid(rand()) / 16
    h0 = torch.randn(B, H, D, D, device="cuda", generator=gen)
    o, ht = chunk_gla(q, k, v, gk, initial_state=h0, output_final_state=True)
    o_last, ht_last = o[-1:].clone(), ht[-1:].clone()
    del o, ht
    o_alone, ht_alone = chunk_gla(q[-1:], k[-1:], v[-1:], gk[-1:], initial_state=h0[-1:], output_final_state=True)
    assert torch.isfinite(o_last).all() and torch.isfinite(ht_last).all()
    # the autotuner may pick other state-pass tiles at 9 rows than at 1: close, not equal
    assert_close(o_last, o_alone, tolerance(torch.bfloat16), "o of the last batch row")
    assert_close(ht_last, ht_alone, tolerance(torch.bfloat16), "final state of the last batch row")


# ------------------------------------------------------------------ fla's call, as its model code makes it
def test_chunk_gla_takes_fla_gate_name_and_positions():
    """fla's chunk_gla(q, k, v, g, scale, initial_state, output_final_state): the same tensors as the gk
    spelling, gradients included."""
    q, k, v, gk, h0 = make(1, 70, 2, 16, 8, "paper", torch.float32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, gk, h0)]
    o, ht = chunk_gla(*leaves[:4], 0.3, leaves[4], True)
    o2, ht2 = chunk_gla(q, k, v, gk=gk, scale=0.3, initial_state=h0, output_final_state=True)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    (o.sum() + ht.sum()).backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)


@pytest.mark.parametrize("form", ["chunk", "fused_recurrent"])
def test_state_v_first_is_the_transposed_state(form):
    """state_v_first=True: initial_state [B, H, V, K] in, final state [B, H, V, K] out, the default layout's
    tensors transposed; V != K, so a layout mix-up cannot pass."""
    fn = KERNELS[form]
    q, k, v, gk, h0 = make(2, 37, 2, 16, 8, "paper", torch.float32)
    o, ht = fn(q, k, v, gk, scale=0.4, initial_state=h0, output_final_state=True)
    o_vk, ht_vk = fn(q, k, v, gk, scale=0.4, initial_state=h0.transpose(-1, -2).contiguous(),
                     output_final_state=True, state_v_first=True)
    assert ht_vk.shape == (2, 2, 8, 16) and torch.equal(o_vk, o) and torch.equal(ht_vk, ht.transpose(-1, -2))
    with pytest.raises(ValueError, match=r"initial_state \(state_v_first=True\) must be \[B, H, V, K\]"):
        fn(q, k, v, gk, initial_state=h0, state_v_first=True)


def test_chunk_gla_state_v_first_gradients():
    q, k, v, gk, h0 = make(1, 40, 2, 16, 8, "paper", torch.float32)
    grads = []
    for v_first in (False, True):
        h = (h0.transpose(-1, -2) if v_first else h0).detach().clone().requires_grad_()
        o, ht = chunk_gla(q, k, v, gk, initial_state=h, output_final_state=True, state_v_first=v_first)
        (o.square().sum() + (ht if not v_first else ht.transpose(-1, -2)).mul(torch.arange(8.)).sum()).backward()
        grads.append(h.grad if not v_first else h.grad.transpose(-1, -2))
    assert_close(grads[1], grads[0], FP32)
    assert grads[0].abs().max() > 0


def test_fused_recurrent_gla_without_gate_is_no_decay():
    q, k, v, _, h0 = make(1, 9, 2, 16, 8, "none", torch.float32)
    o, ht = fused_recurrent_gla(q, k, v, initial_state=h0, output_final_state=True)
    o_ref, ht_ref = ref_gla(q, k, v, torch.zeros_like(q), h0=h0)
    assert_close(o, o_ref, FP32)
    assert_close(ht, ht_ref, FP32)


FLA_REFUSED = [  # (form, keywords, exception, words)
    ("chunk", {"cu_seqlens_cpu": torch.tensor([0, 9])}, ValueError, "cu_seqlens_cpu must be None"),
    ("chunk", {"state_v_first": 1}, TypeError, "state_v_first must be a bool"),
    ("fused_recurrent", {"gv": torch.zeros(1, 9, 2, 8)}, ValueError, "gv must be None"),
    ("fused_recurrent", {"reverse": True}, ValueError, "reverse must be False"),
    ("fused_recurrent", {"reverse": None}, TypeError, "reverse must be a bool"),
]


@pytest.mark.parametrize("form, keywords, exc, words", FLA_REFUSED, ids=lambda x: x if isinstance(x, str) else None)
def test_refuses_fla_options_these_kernels_lack(form, keywords, exc, words):
    q, k, v, gk, _ = make(1, 9, 2, 16, 8, "paper", torch.float32)
    with pytest.raises(exc, match=words):
        KERNELS[form](q, k, v, gk, **keywords)


def test_chunk_gla_gate_by_one_name():
    q, k, v, gk, _ = make(1, 9, 2, 16, 8, "paper", torch.float32)
    with pytest.raises(ValueError, match="g and gk"):
        chunk_gla(q, k, v, gk, gk=gk)
    with pytest.raises(TypeError, match="needs its gate"):
        chunk_gla(q, k, v)
    with pytest.raises(ValueError, match=r"g must be \[B, T, H, K\]"):
        chunk_gla(q, k, v, g=gk[..., :4])
