"""GLA: the three forms against an fp64 loop written from the formula (MATH.md, GLA).

CPU (interpreter): fp32 (tol 1e-5) and fp16, shrunk shapes. GPU: bf16 (tol 5e-3, as fla's
tests) and fp32 on fla's shapes. Forward only.
"""
import pytest
import torch
import torch.nn.functional as F

from kernels.common import DEVICE, assert_close
from kernels.gla import chunk_gla, fused_recurrent_gla, naive_recurrent_gla, sequential_chunk_gla

FORMS = {"naive": naive_recurrent_gla, "fused_recurrent": fused_recurrent_gla,
         "sequential_chunk": sequential_chunk_gla, "chunk": chunk_gla}


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
    assert_close(o, o_ref, 1e-5, "o")
    assert_close(S, S_ref, 1e-5, "final state")


@pytest.mark.parametrize("form", ["fused_recurrent", "chunk"])
def test_no_initial_state_custom_scale(form):
    q, k, v, gk, _ = make(1, 70, 2, 32, 32, "paper", torch.float32)
    o_ref, _ = ref_gla(q, k, v, gk, scale=0.3)
    o, S = FORMS[form](q, k, v, gk, scale=0.3)
    assert S is None
    assert_close(o, o_ref, 1e-5, "o")


@pytest.mark.parametrize("T", [1, 2, 65])
def test_short_sequences(T):
    q, k, v, gk, h0 = make(2, T, 3, 60, 40, "strong", torch.float32)
    o_ref, S_ref = ref_gla(q, k, v, gk, h0=h0)
    for name in ("fused_recurrent", "chunk", "sequential_chunk"):
        o, S = FORMS[name](q, k, v, gk, initial_state=h0, output_final_state=True)
        assert_close(o, o_ref, 1e-5, f"{name} o")
        assert_close(S, S_ref, 1e-5, f"{name} state")


@pytest.mark.parametrize("form", ["fused_recurrent", "chunk"])
def test_forward_fp16(form):
    q, k, v, gk, h0 = make(1, 77, 2, 64, 64, "paper", torch.float16)
    o_ref, S_ref = ref_gla(q, k, v, gk, h0=h0)
    o, S = FORMS[form](q, k, v, gk, initial_state=h0, output_final_state=True)
    assert o.dtype == torch.float16
    assert_close(o, o_ref, 5e-3, "o")
    assert_close(S, S_ref, 5e-3, "final state")


def test_forms_agree():
    q, k, v, gk, h0 = make(2, 100, 2, 48, 64, "paper", torch.float32)
    outs = [f(q, k, v, gk, initial_state=h0, output_final_state=True) for f in FORMS.values()]
    for o, S in outs[1:]:
        assert_close(o, outs[0][0], 1e-5, "o")
        assert_close(S, outs[0][1], 1e-5, "state")


def test_decode_steps_continue_a_prefill():
    """chunk prefill then T=1 steps from its state = the whole sequence at once."""
    q, k, v, gk, h0 = make(1, 72, 2, 32, 32, "paper", torch.float32)
    o_all, S_all = ref_gla(q, k, v, gk, h0=h0)
    _, S = chunk_gla(q[:, :64], k[:, :64], v[:, :64], gk[:, :64], initial_state=h0, output_final_state=True)
    for t in range(64, 72):
        o, S = fused_recurrent_gla(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], gk[:, t:t + 1],
                                   initial_state=S, output_final_state=True)
        assert_close(o, o_all[:, t:t + 1], 1e-5, f"o at step {t}")
    assert_close(S, S_all, 1e-5, "state")


# ------------------------------------------------------------------ bad input
def _good():
    q, k, v, gk, h0 = make(1, 8, 2, 16, 16, "paper", torch.float32)
    return dict(q=q, k=k, v=v, gk=gk, initial_state=h0)


BAD = {
    "q-not-tensor": (lambda a: a.update(q=a["q"].tolist()), TypeError, "q must be a torch.Tensor"),
    "q-rank3": (lambda a: a.update(q=a["q"][0]), ValueError, "q must be 4-D"),
    "k-shape": (lambda a: a.update(k=a["k"][:, :4]), ValueError, "k must have the shape"),
    "gk-shape": (lambda a: a.update(gk=a["gk"][..., :8]), ValueError, "gk must have the shape"),
    "v-shape": (lambda a: a.update(v=a["v"][:, :, :1]), ValueError, "v must be"),
    "int-dtype": (lambda a: a.update(q=a["q"].long()), TypeError, "q has dtype"),
    "mixed-dtype": (lambda a: a.update(k=a["k"].half()), TypeError, "share a dtype"),
    "state-dtype": (lambda a: a.update(initial_state=a["initial_state"].double()), TypeError, "initial_state must be float32"),
    "state-shape": (lambda a: a.update(initial_state=a["initial_state"][:, :1]), ValueError, "initial_state must be"),
    "head-dim": (lambda a: a.update(**{n: torch.zeros(1, 2, 1, 300) for n in ("q", "k", "gk")}), ValueError, "head dims"),
    "scale-type": (lambda a: a.update(scale="0.5"), TypeError, "scale must be"),
}


@pytest.mark.parametrize("form", ["naive", "fused_recurrent", "sequential_chunk", "chunk"])
@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(form, case):
    args = _good()
    mutate, exc, msg = BAD[case]
    mutate(args)
    if case == "head-dim":
        args["v"] = torch.zeros(1, 2, 1, 16)
        args["initial_state"] = None
    with pytest.raises(exc, match=msg):
        FORMS[form](**args)


def test_non_contiguous_input():
    q, k, v, gk, h0 = make(1, 40, 2, 32, 32, "paper", torch.float32)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)   # same values, non-contiguous
    o_ref, _ = ref_gla(q, k, v, gk, h0=h0)
    for name in ("fused_recurrent", "chunk"):
        o, _ = FORMS[name](qt, k, v, gk, initial_state=h0)
        assert_close(o, o_ref, 1e-5, name)


# ------------------------------------------------------------------ GPU (bf16, fla's shapes)
# fla's test shapes; every (dtype, K, V) pair costs one compile per autotune config, so fp32
# runs on the K = 64 shapes only (one specialization: T, H and the chunk count are not
# specialized) and each test checks all three Triton forms against one fp64 reference.
GPU_SHAPES = [(1, 63, 1, 64, 64), (2, 1024, 4, 60, 60), (2, 1024, 8, 128, 128), (4, 2048, 8, 64, 64)]
GPU_CASES = ([("bf16", s, g) for s in GPU_SHAPES for g in ("strong", "none")]
             + [("bf16", GPU_SHAPES[2], "paper")]
             + [("fp32", s, g) for s in (GPU_SHAPES[0], GPU_SHAPES[3]) for g in ("strong", "none")])
DTYPES = {"bf16": (torch.bfloat16, 5e-3), "fp32": (torch.float32, 1e-5)}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,shape,gate", GPU_CASES, ids=[f"{d}-{sid(s)}-{g}" for d, s, g in GPU_CASES])
def test_forward_gpu(dtype, shape, gate):
    dt, tol = DTYPES[dtype]
    q, k, v, gk, h0 = make(*shape, gate, dt, device="cuda")
    o_ref, S_ref = ref_gla(q, k, v, gk, h0=h0)
    for form in ("chunk", "fused_recurrent", "sequential_chunk"):
        o, S = FORMS[form](q, k, v, gk, initial_state=h0, output_final_state=True)
        assert not torch.isnan(o).any() and not torch.isnan(S).any(), form
        assert_close(o, o_ref, tol, f"{form} o")
        assert_close(S, S_ref, tol, f"{form} final state")


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 8, 64])
def test_decode_step_gpu(B):
    q, k, v, gk, h0 = make(B, 1, 32, 128, 128, "paper", torch.bfloat16, device="cuda")
    o_ref, S_ref = ref_gla(q, k, v, gk, h0=h0)
    o, S = fused_recurrent_gla(q, k, v, gk, initial_state=h0, output_final_state=True)
    assert_close(o, o_ref, 5e-3, "o")
    assert_close(S, S_ref, 1e-5, "state")
