"""Kimi Delta Attention (attention_kernels.kda): the two Triton forms and the references against an fp64 loop
written from the paper's equation (MATH.md, KDA), in its matrix form
S_t = (I - β_t k_t k_tᵀ) Diag(e^{g_t}) S_{t-1} + β_t k_t v_tᵀ, o_t = S_tᵀ (q_t · scale): no decay,
strong decay and mixed gates; β near 0 and near 1; T = 1 and T not a multiple of the chunk; initial
and final state; q and k normalised by the kernel or by the caller; NaN checks; every kind of bad input.

CPU (interpreter): fp32 and fp16 on small shapes (T <= 80, K <= 64). GPU: bf16 at fla's test shapes
(2, 512, 3, 60) and (2, 1024, 2, 128), and the decode step at B = 1, 8, 64. Forward only.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from input_cases import Case, bad_input_cases, case_id, expect_refusal
from linear_cases import (POISONS, assert_inf_in_v, assert_poison_pattern, linear_input_cases, linear_kernel_cases,
                          poison, replace)
from attention_kernels.common import DEVICE, assert_close, rel_err, tolerance
from attention_kernels.kda import chunk_kda, fused_recurrent_kda, l2_normalize, naive_recurrent_kda, torch_kda_step
from attention_kernels.linear import CHUNK, chunk_state_pass

KERNELS = {"fused_recurrent": fused_recurrent_kda, "chunk": chunk_kda}
FORMS = {"naive": naive_recurrent_kda, **KERNELS}
FP32 = tolerance(torch.float32)


def ref_kda(q, k, v, g, beta, scale=None, h0=None, l2norm=False):
    """The published matrix form, one token at a time, in float64 (with I - β k kᵀ built explicitly)."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    S = torch.zeros(B, H, K, v.shape[-1], dtype=torch.float64, device=q.device)
    if h0 is not None:
        S = S + h0.double()
    eye = torch.eye(K, dtype=torch.float64, device=q.device)
    o = torch.empty(B, T, H, v.shape[-1], dtype=torch.float64, device=q.device)
    for t in range(T):
        kt, bt = k[:, t], beta[:, t, :, None, None]
        erase = eye - bt * kt.unsqueeze(-1) * kt.unsqueeze(-2)                  # [B, H, K, K]
        S = erase @ (g[:, t].exp().unsqueeze(-1) * S) + bt * kt.unsqueeze(-1) * v[:, t].unsqueeze(-2)
        o[:, t] = (q[:, t].unsqueeze(-1) * scale * S).sum(-2)
    return o, S


def make(B, T, H, K, V, decay="mixed", beta="uniform", dtype=torch.float32, device=DEVICE):
    """Inputs with the named decay (none: g = 0; strong: g = -4 per step; mixed: logsigmoid of a normal,
    with a few channels at 0 and at -inf) and β (uniform in [0, 1], near0: 1e-3, near1: 1 - 1e-3)."""
    q, k = (torch.randn(B, T, H, K, device=device) for _ in range(2))
    v = torch.randn(B, T, H, V, device=device)
    if decay == "none":
        g = torch.zeros(B, T, H, K, device=device)
    elif decay == "strong":
        g = torch.full((B, T, H, K), -4.0, device=device)
    else:
        g = F.logsigmoid(torch.randn(B, T, H, K, device=device))
        g[..., 0] = 0.0
        g[:, T // 2, :, 1 % K] = -math.inf
    b = {"uniform": torch.rand(B, T, H, device=device), "near0": torch.full((B, T, H), 1e-3, device=device),
         "near1": torch.full((B, T, H), 1 - 1e-3, device=device)}[beta]
    h0 = torch.randn(B, H, K, V, device=device)
    return [x.to(dtype) for x in (q, k, v)] + [g, b, h0]


def sid(s):
    return "B{}-T{}-H{}-K{}-V{}".format(*s)


CPU_SHAPES = [(1, 63, 1, 64, 64), (1, 77, 2, 60, 36), (2, 20, 3, 16, 24)]
DECAYS = ("mixed", "none", "strong")
# every decay on the two smaller shapes; K = 64 (the slowest under the interpreter) with mixed gates only
CPU_CASES = [(s, d) for s in CPU_SHAPES for d in DECAYS if s[3] < 64 or d == "mixed"]


@pytest.mark.parametrize("shape, decay", CPU_CASES, ids=[f"{sid(s)}-{d}" for s, d in CPU_CASES])
@pytest.mark.parametrize("form", list(FORMS))
def test_forward_fp32(form, shape, decay):
    q, k, v, g, beta, h0 = make(*shape, decay)
    o_ref, S_ref = ref_kda(q, k, v, g, beta, h0=h0, l2norm=True)
    o, S = FORMS[form](q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert not torch.isnan(o).any() and not torch.isnan(S).any()
    assert o.dtype == torch.float32 and S.dtype == torch.float32
    assert_close(o, o_ref, FP32, "o")
    assert_close(S, S_ref, FP32, "final state")


@pytest.mark.parametrize("beta", ["near0", "near1"])
@pytest.mark.parametrize("form", list(KERNELS))
def test_beta_near_the_ends(form, beta):
    """β -> 0: the state only decays; β -> 1: each key's old value is fully overwritten."""
    q, k, v, g, b, h0 = make(1, 70, 2, 32, 32, "mixed", beta)
    o_ref, S_ref = ref_kda(q, k, v, g, b, h0=h0, l2norm=True)
    o, S = KERNELS[form](q, k, v, g, b, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert_close(o, o_ref, FP32, "o")
    assert_close(S, S_ref, FP32, "final state")


def test_beta_one_overwrites_the_key():
    """With β = 1, no decay and a unit key, the state afterwards returns exactly v for that key."""
    q, k, v, g, _, h0 = make(1, 1, 1, 16, 8, "none")
    k = l2_normalize(k)
    beta = torch.ones(1, 1, 1, device=q.device)
    _, S = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    recalled = torch.einsum("k,kv->v", k[0, 0, 0], S[0, 0])
    assert torch.allclose(recalled, v[0, 0, 0], atol=1e-5)


@pytest.mark.parametrize("form", list(FORMS))
def test_normalised_by_the_caller(form):
    """use_qk_l2norm_in_kernel=False takes q and k as given: with normalised inputs, the same result."""
    q, k, v, g, beta, h0 = make(2, 40, 2, 32, 16)
    o_ref, S_ref = ref_kda(q, k, v, g, beta, h0=h0, l2norm=True)
    o, S = FORMS[form](l2_normalize(q), l2_normalize(k), v, g, beta, initial_state=h0, output_final_state=True)
    assert_close(o, o_ref, FP32, "o")
    assert_close(S, S_ref, FP32, "final state")


@pytest.mark.parametrize("form", list(KERNELS))
def test_l2norm_flag_matters(form):
    """The flag is not ignored: unnormalised keys give another answer than normalised ones."""
    q, k, v, g, beta, _ = make(1, 20, 1, 16, 16)
    k = k * 0.5
    o_ref, _ = ref_kda(q, k, v, g, beta, l2norm=False)
    o, _ = KERNELS[form](q, k, v, g, beta, use_qk_l2norm_in_kernel=False)
    assert_close(o, o_ref, FP32, "o (not normalised)")
    o_n, _ = KERNELS[form](q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    assert rel_err(o_n, o_ref) > 0.1


@pytest.mark.parametrize("T", [1, CHUNK + 1])   # (T = CHUNK - 1 is a shape of test_forward_fp32)
def test_lengths_around_the_chunk(T):
    q, k, v, g, beta, h0 = make(1, T, 2, 24, 40)
    o_ref, S_ref = ref_kda(q, k, v, g, beta, h0=h0, l2norm=True)
    for name, form in KERNELS.items():
        o, S = form(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert_close(o, o_ref, FP32, f"{name} o")
        assert_close(S, S_ref, FP32, f"{name} state")


@pytest.mark.parametrize("form", list(KERNELS))
def test_forward_fp16(form):
    q, k, v, g, beta, h0 = make(1, 77, 2, 64, 64, dtype=torch.float16)
    o_ref, S_ref = ref_kda(q, k, v, g, beta, h0=h0, l2norm=True)
    o, S = KERNELS[form](q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert o.dtype == torch.float16 and not torch.isnan(o).any()
    assert_close(o, o_ref, tolerance(torch.float16), "o")
    assert_close(S, S_ref, tolerance(torch.float16), "final state")


@pytest.mark.parametrize("beta", [0.5, 1.0])
def test_repeated_key_in_a_chunk(beta):
    """One key repeated over whole chunks, no decay: every A_ij below the diagonal is β, the case where
    powers of A grow combinatorially; the chunk form's solve must stay fp32-accurate."""
    q, k, v, g, _, h0 = make(1, 70, 1, 16, 16, "none")
    k = k[:, :1].expand_as(k).contiguous()
    b = torch.full((1, 70, 1), beta, device=DEVICE)
    o_ref, S_ref = ref_kda(q, k, v, g, b, h0=h0, l2norm=True)
    o, S = chunk_kda(q, k, v, g, b, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert_close(o, o_ref, FP32, "o")
    assert_close(S, S_ref, FP32, "final state")


def test_forms_agree_without_state():
    q, k, v, g, beta, _ = make(1, 80, 2, 48, 32)
    outs = [f(q, k, v, g, beta, scale=0.3, use_qk_l2norm_in_kernel=True) for f in FORMS.values()]
    for o, S in outs:
        assert S is None
    o_ref, _ = ref_kda(q, k, v, g, beta, scale=0.3, l2norm=True)
    for o, _ in outs:
        assert_close(o, o_ref, FP32, "o")


def test_decode_steps_continue_a_prefill():
    """chunk over a prompt, then the fused step and the PyTorch step one token at a time: the same as
    the reference over the whole sequence."""
    q, k, v, g, beta, h0 = make(1, 70, 2, 32, 32)
    o_ref, S_ref = ref_kda(q, k, v, g, beta, h0=h0, l2norm=True)
    _, S = chunk_kda(q[:, :66], k[:, :66], v[:, :66], g[:, :66], beta[:, :66], initial_state=h0,
                     output_final_state=True, use_qk_l2norm_in_kernel=True)
    S_t = S.clone()
    for t in range(66, 70):
        o, S = fused_recurrent_kda(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], beta[:, t:t + 1],
                                   initial_state=S, output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert_close(o[:, 0], o_ref[:, t], FP32, f"fused step o at {t}")
        o_t, S_t = torch_kda_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], S_t, use_qk_l2norm_in_kernel=True)
        assert_close(o_t, o_ref[:, t], FP32, f"PyTorch step o at {t}")
    assert_close(S, S_ref, FP32, "fused state")
    assert_close(S_t, S_ref, FP32, "PyTorch step state")


@pytest.mark.parametrize("T, K, V, flags", [(1, 32, 64, (True, True)), (1, 24, 40, (False, True)),
                                             (5, 32, 64, (True, False)), (5, 24, 40, (False, False))],
                         ids=["step-even", "step-uneven", "tokens-even", "tokens-uneven"])
def test_fused_kernel_variants(monkeypatch, T, K, V, flags):
    """The fused kernel compiles a decode step (T = 1: no token loop, STEP) and whole tiles (K a power
    of two, value tiles dividing V: no masks, EVEN) apart from the general case: each of the four agrees
    with the formula, and the launch took the variant named."""
    from attention_kernels.kda import fused_recurrent as module
    taken = {}
    launch_step = module.launch_step
    monkeypatch.setattr(module, "launch_step",
                        lambda *a, **kw: taken.update(kw) or launch_step(*a, **kw))
    q, k, v, g, beta, h0 = make(2, T, 3, K, V)
    o_ref, S_ref = ref_kda(q, k, v, g, beta, h0=h0, l2norm=True)
    o, S = fused_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                               use_qk_l2norm_in_kernel=True)
    assert (taken["EVEN"], taken["STEP"]) == flags
    assert_close(o, o_ref, FP32, "o")
    assert_close(S, S_ref, FP32, "final state")


def test_reference_takes_fp64_and_matches_the_matrix_form():
    q, k, v, g, beta, h0 = make(1, 30, 2, 16, 8)
    args = [x.double() for x in (q, k, v, g, beta)]
    o_ref, S_ref = ref_kda(*args, h0=h0, l2norm=True)
    o, S = naive_recurrent_kda(*args, initial_state=h0.double(), output_final_state=True,
                               use_qk_l2norm_in_kernel=True)
    assert o.dtype == torch.float64 and S.dtype == torch.float64
    assert_close(o, o_ref, 1e-12, "o")
    assert_close(S, S_ref, 1e-12, "state")


def test_contraction_keeps_the_state_bounded():
    """Normalised keys, β in [0, 1], no decay: the state's norm never exceeds its start plus what was
    written (each I - β k kᵀ has norm <= 1); unnormalised keys with β = 1 blow it up."""
    q, k, v, g, beta, h0 = make(1, 80, 1, 16, 16, "none")
    _, S = naive_recurrent_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                               use_qk_l2norm_in_kernel=True)
    bound = h0.norm() + (beta[..., None] * v).norm(dim=-1).sum()
    assert S.norm() <= bound
    _, S_bad = naive_recurrent_kda(q, 3 * k, v, g, torch.ones_like(beta), initial_state=h0, output_final_state=True)
    assert not torch.isfinite(S_bad).all() or S_bad.norm() > 1e6


# ------------------------------------------------------------------ NaN checks
# a NaN or inf in any input at one token, head 0: the later rows of head 0 only (u = v - Sᵀ k mixes key
# channels, not value columns, so a value's NaN stays in its column); the chunk form's triangular solve
# must not carry it to the earlier rows of its chunk
KDA_POISONS = {**POISONS, "nan-in-g": ("g", math.nan), "nan-in-beta": ("beta", math.nan)}


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("token", [35, CHUNK, CHUNK + 5], ids=["t35", "t64", "t69"])
@pytest.mark.parametrize("poison_case", list(KDA_POISONS))
@pytest.mark.parametrize("form", list(FORMS))
def test_poison_reaches_only_later_rows(form, poison_case, token):
    name, value = KDA_POISONS[poison_case]
    args = dict(zip(["q", "k", "v", "g", "beta", "h0"], make(1, 100, 2, 32, 16)))
    h0 = args.pop("h0")
    clean = poison(args, name, value, token)
    o_ref, _ = ref_kda(*clean.values(), h0=h0, l2norm=True)
    o, S = FORMS[form](*args.values(), initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert_poison_pattern(o, S, o_ref, name, token)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("form", list(KERNELS))
def test_inf_in_v_with_one_channel(form):
    """K = V = 1, +inf in v at token 4: the fused form gives the naive loop's -inf or +inf there and its
    NaN after (S + βk(v - kS) is inf - inf); the chunk form NaN from token 4 on, nothing before."""
    q, k, v, g, beta, _ = make(1, 10, 1, 1, 1)
    v[:, 4] = math.inf
    o_exact, _ = naive_recurrent_kda(*(x.double() for x in (q, k, v, g, beta)))
    o, _ = KERNELS[form](q, k, v, g, beta)
    assert_inf_in_v(o, o_exact, token=4, exact=form == "fused_recurrent")


@pytest.mark.parametrize("form", list(KERNELS))
def test_nan_past_the_end_of_a_view(form):
    """Only the T rows of a view are read: NaN in the tokens after it does not reach the output."""
    q, k, v, g, beta, h0 = make(1, 80, 1, 16, 16)
    for x in (q, k, v, g):
        x[:, 70:] = math.nan
    beta[:, 70:] = math.nan
    args = [x[:, :70] for x in (q, k, v, g, beta)]
    o_ref, S_ref = ref_kda(*args, h0=h0, l2norm=True)
    o, S = KERNELS[form](*args, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert_close(o, o_ref, FP32, "o")
    assert_close(S, S_ref, FP32, "state")


@pytest.mark.parametrize("form", list(FORMS))
def test_inputs_are_not_modified(form):
    args = make(1, 20, 2, 16, 16)
    before = [x.clone() for x in args]
    q, k, v, g, beta, h0 = args
    FORMS[form](q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    for x, y in zip(args, before):
        assert torch.equal(x.nan_to_num(), y.nan_to_num())


# ------------------------------------------------------------------ bad input
TENSORS = ["q", "k", "v", "g", "beta", "initial_state"]
FLOAT_TENSORS = ["q", "k", "v", "g", "beta"]    # initial_state must be fp32: its own cases below


def _good():
    q, k, v, g, beta, h0 = make(1, 8, 2, 16, 12)
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, output_final_state=True)


def _step_good():
    args = _good()
    return {n: args[n][:, 0] for n in ("q", "k", "v", "g", "beta")} | {"state": args["initial_state"]}


SHARED_CASES = linear_input_cases(token_tensors=("q", "k", "v", "g", "beta"),
                                  key_tensors=("q", "k", "g")) + [
    Case("g-per-head", replace(g=lambda a: a["g"][..., :1]), ValueError, r"g must be \[B, T, H, K\] = \[1, 8, 2, 16\]"),
    Case("g-length", replace(g=lambda a: a["g"][:, :4]), ValueError, r"g must be \[B, T, H, K\]"),
    Case("beta-per-channel", replace(beta=lambda a: a["g"]), ValueError, "beta must have 3 dims"),
    Case("beta-heads", replace(beta=lambda a: a["beta"][..., :1]), ValueError,
         r"beta must be \[B, T, H\] = \[1, 8, 2\]"),
    Case("l2norm-int", replace(use_qk_l2norm_in_kernel=lambda a: 1), TypeError,
         "use_qk_l2norm_in_kernel must be a bool"),
    Case("l2norm-None", replace(use_qk_l2norm_in_kernel=lambda a: None), TypeError,
         "use_qk_l2norm_in_kernel must be a bool"),
]
KERNEL_CASES = linear_kernel_cases(key_tensors=("q", "k", "g"))


@pytest.mark.parametrize("case", bad_input_cases(TENSORS, float_tensors=FLOAT_TENSORS) + SHARED_CASES
                         + KERNEL_CASES, ids=case_id)
@pytest.mark.parametrize("form", list(KERNELS))
def test_kernels_refuse(form, case):
    expect_refusal(KERNELS[form], _good, case)


@pytest.mark.parametrize("case", bad_input_cases(TENSORS, kernel=False, float_tensors=FLOAT_TENSORS)
                         + SHARED_CASES, ids=case_id)
def test_reference_refuses(case):
    expect_refusal(naive_recurrent_kda, _good, case)


STEP_CASES = [
    Case("state-missing", replace(state=lambda a: None), TypeError, "state must be a torch.Tensor"),
    Case("state-shape", replace(state=lambda a: a["state"][:, :1]), ValueError, r"state must be \[B, H, K, V\]"),
    Case("g-shape", replace(g=lambda a: a["g"][..., :1]), ValueError, r"g must be \[B, H, K\]"),
    Case("beta-shape", replace(beta=lambda a: a["beta"][:, :1]), ValueError, r"beta must be \[B, H\] = \[1, 2\]"),
    Case("l2norm-int", replace(use_qk_l2norm_in_kernel=lambda a: 0), TypeError,
         "use_qk_l2norm_in_kernel must be a bool"),
]


@pytest.mark.parametrize("case", bad_input_cases(["q", "k", "v", "g", "beta", "state"], kernel=False,
                                                 float_tensors=["q", "k", "v", "g", "beta"]) + STEP_CASES,
                         ids=case_id)
def test_step_refuses(case):
    expect_refusal(torch_kda_step, _step_good, case)


# ------------------------------------------------------------------ GPU (bf16, fla's shapes)
GPU_SHAPES = [(2, 512, 3, 60, 60), (2, 1024, 2, 128, 128)]
GPU_CASES = [(s, d, b) for s in GPU_SHAPES for d, b in (("mixed", "uniform"), ("strong", "near1"), ("none", "near0"))]


@pytest.mark.gpu
@pytest.mark.parametrize("shape,decay,beta", GPU_CASES, ids=[f"{sid(s)}-{d}-{b}" for s, d, b in GPU_CASES])
def test_forward_gpu_bf16(shape, decay, beta):
    q, k, v, g, b, h0 = make(*shape, decay, beta, dtype=torch.bfloat16, device="cuda")
    o_ref, S_ref = ref_kda(q, k, v, g, b, h0=h0, l2norm=True)
    for name, form in KERNELS.items():
        o, S = form(q, k, v, g, b, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert not torch.isnan(o).any() and not torch.isnan(S).any(), name
        assert_close(o, o_ref, tolerance(torch.bfloat16), f"{name} o")
        assert_close(S, S_ref, tolerance(torch.bfloat16), f"{name} final state")


@pytest.mark.gpu
@pytest.mark.parametrize("form", list(KERNELS))
def test_forward_gpu_fp32(form):
    q, k, v, g, b, h0 = make(2, 512, 3, 60, 60, device="cuda")
    o_ref, S_ref = ref_kda(q, k, v, g, b, h0=h0, l2norm=True)
    o, S = KERNELS[form](q, k, v, g, b, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert_close(o, o_ref, 1e-4, "o")
    assert_close(S, S_ref, 1e-4, "final state")


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 8, 64])
def test_decode_step_gpu(B):
    q, k, v, g, b, h0 = make(B, 1, 32, 128, 128, dtype=torch.bfloat16, device="cuda")
    o_ref, S_ref = ref_kda(q, k, v, g, b, h0=h0, l2norm=True)
    for _ in range(2):                      # the second call takes the direct launch path
        o, S = fused_recurrent_kda(q, k, v, g, b, initial_state=h0, output_final_state=True,
                                   use_qk_l2norm_in_kernel=True)
        assert_close(o, o_ref, tolerance(torch.bfloat16), "o")
        assert_close(S, S_ref, FP32, "state (fp32 math on the bf16 inputs)")
    o_t, S_t = torch_kda_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], b[:, 0], h0, use_qk_l2norm_in_kernel=True)
    assert_close(o_t, o_ref[:, 0], tolerance(torch.bfloat16), "PyTorch step o")
    assert_close(S_t, S_ref, FP32, "PyTorch step state")


@pytest.mark.gpu
def test_decode_step_replayed_from_a_cuda_graph():
    """The direct launch inside a graph capture: each replay reads the captured inputs as they are then,
    and writes where the captured outputs live."""
    q, k, v, g, b, h0 = make(2, 1, 4, 128, 128, dtype=torch.bfloat16, device="cuda")

    def step():
        return fused_recurrent_kda(q, k, v, g, b, initial_state=h0, output_final_state=True,
                                   use_qk_l2norm_in_kernel=True)

    step()                                  # compiled, and the direct launch remembered
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, S = step()
    for _ in range(2):                      # new inputs in place, then the replay
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        o_ref, S_ref = ref_kda(q, k, v, g, b, h0=h0, l2norm=True)
        assert_close(o, o_ref, tolerance(torch.bfloat16), "o")
        assert_close(S, S_ref, FP32, "state")


def test_shared_state_pass_refuses_half_the_delta_rule():
    """The shared state pass KDA runs takes w and v_new together, and decayed keys only with gates."""
    q, k, v, g, beta, h0 = make(1, 8, 1, 16, 16)
    b = torch.zeros_like(g)
    states = torch.empty(1, 1, 1, 16, 16, device=q.device)
    with pytest.raises(ValueError, match="takes w and v_new together"):
        chunk_state_pass(k, v, b, states, w=k)
    with pytest.raises(ValueError, match="decayed_keys needs the cumulative gates"):
        chunk_state_pass(k, v, None, states, gamma=torch.zeros(1, device=q.device), decayed_keys=True)
