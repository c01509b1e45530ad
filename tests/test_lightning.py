"""Lightning Attention (attention_kernels.lightning): the two Triton forms and the references against an fp64
loop written from the formula (MATH.md, Lightning Attention); decays from none (slope 0) to strong
(slope 8) and MiniMax's per-layer slopes; odd sizes, T = 1 and T not a multiple of the block; initial
and final state; NaN and inf where a row cannot see them; the ELU+1 variant against its own formula;
the MiniMax block; every kind of bad input.

Tolerances come from attention_kernels.common.tolerance: the chunk kernel multiplies fp32 inputs in IEEE fp32
and the recurrent kernel has no dot products, so fp32 is held to the fp32 tolerance on every machine,
except the GPU's long sequences, where a decay near 1 held in fp32 drifts by up to T·2^-24 (gpu_tolerance).
CPU (interpreter): fp32 and fp16 on small shapes. GPU: bf16 and fp32 on fla's test shapes. Forward only.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from input_cases import Case, bad_input_cases, case_id, expect_refusal
from linear_cases import (POISONS, assert_inf_in_v, assert_poison_pattern, linear_input_cases, linear_kernel_cases,
                          linear_step_cases, poison, replace)
from attention_kernels.common import DEVICE, assert_close, tolerance
from attention_kernels.lightning import (article_lightning_step, chunk_lightning, elu_feature_map, fused_recurrent_lightning,
                               lightning_slopes, minimax_lightning_block, naive_recurrent_elu_linear,
                               naive_recurrent_lightning, rms_norm, torch_lightning_step)
from attention_kernels.linear import CHUNK

KERNELS = {"fused_recurrent": fused_recurrent_lightning, "chunk": chunk_lightning}
FORMS = {"naive": naive_recurrent_lightning, **KERNELS}
FP32 = tolerance(torch.float32)


def ref_lightning(q, k, v, slopes, scale=1.0, h0=None):
    """kv_t = exp(-s_h) kv_{t-1} + k_t v_t^T ; o_t = kv_t^T (q_t · scale), in float64."""
    q, k, v, slopes = (x.double() for x in (q, k, v, slopes))
    B, T, H, K = q.shape
    S = torch.zeros(B, H, K, v.shape[-1], dtype=torch.float64, device=q.device)
    if h0 is not None:
        S = S + h0.double()
    lam = torch.exp(-slopes).view(1, H, 1, 1)
    o = torch.empty(B, T, H, v.shape[-1], dtype=torch.float64, device=q.device)
    for t in range(T):
        S = lam * S + k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
        o[:, t] = (q[:, t].unsqueeze(-1) * scale * S).sum(-2)
    return o, S


def decay_slopes(H, decay, device=DEVICE):
    """The per-head slopes for a named decay: MiniMax's first layer, none (0), strong (8, λ = 3e-4),
    or mixed (0 on one head, 8 on another, MiniMax's last layer on a third, …)."""
    if decay == "minimax":
        s = lightning_slopes(H, layer_idx=0, num_layers=4)
    elif decay == "none":
        s = torch.zeros(H)
    elif decay == "strong":
        s = torch.full((H,), 8.0)
    else:
        s = torch.tensor([0.0, 8.0, 1e-5, 0.5])[torch.arange(H) % 4]
    return s.to(device)


def make(B, T, H, K, V, decay, dtype, device=DEVICE):
    q, k = (torch.randn(B, T, H, K, device=device) for _ in range(2))
    v = torch.randn(B, T, H, V, device=device)
    h0 = torch.randn(B, H, K, V, device=device)
    return [x.to(dtype) for x in (q, k, v)] + [decay_slopes(H, decay, device), h0]


def sid(s):
    B, T, H, K, V = s
    return f"B{B}-T{T}-H{H}-K{K}-V{V}"


CPU_SHAPES = [(1, 63, 1, 64, 64), (2, 77, 4, 60, 60), (1, 130, 2, 32, 48), (1, 20, 1, 256, 200)]
DECAYS = ("minimax", "none", "strong", "mixed")
# every decay on every shape, except K = 256, which is slow under the interpreter: one decay there
CPU_CASES = [(shape, decay) for shape in CPU_SHAPES for decay in DECAYS if shape[3] < 256 or decay == "mixed"]


@pytest.mark.parametrize("shape, decay", CPU_CASES, ids=[f"{sid(s)}-{d}" for s, d in CPU_CASES])
@pytest.mark.parametrize("form", list(FORMS))
def test_forward_fp32(form, shape, decay):
    q, k, v, s, h0 = make(*shape, decay, torch.float32)
    o_ref, S_ref = ref_lightning(q, k, v, s, h0=h0)
    o, S = FORMS[form](q, k, v, s, initial_state=h0, output_final_state=True)
    assert not torch.isnan(o).any() and not torch.isnan(S).any()
    assert o.dtype == torch.float32 and S.dtype == torch.float32
    assert_close(o, o_ref, FP32, "o")
    assert_close(S, S_ref, FP32, "final state")


@pytest.mark.parametrize("form", list(FORMS))
def test_no_initial_state_custom_scale(form):
    q, k, v, s, _ = make(1, 70, 2, 32, 32, "minimax", torch.float32)
    o_ref, _ = ref_lightning(q, k, v, s, scale=0.3)
    o, S = FORMS[form](q, k, v, s, scale=0.3)
    assert S is None
    assert_close(o, o_ref, FP32, "o")


@pytest.mark.parametrize("form", list(FORMS))
def test_scale_defaults_to_one(form):
    """No 1/√d in Lightning: the default scale is 1, and None means the default."""
    q, k, v, s, _ = make(1, 9, 2, 16, 16, "minimax", torch.float32)
    o_ref, _ = ref_lightning(q, k, v, s, scale=1.0)
    assert_close(FORMS[form](q, k, v, s)[0], o_ref, FP32, "o (default)")
    assert_close(FORMS[form](q, k, v, s, scale=None)[0], o_ref, FP32, "o (scale=None)")


@pytest.mark.parametrize("T", [1, 2, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3])
def test_lengths_around_the_block(T):
    q, k, v, s, h0 = make(2, T, 4, 60, 40, "mixed", torch.float32)
    o_ref, S_ref = ref_lightning(q, k, v, s, h0=h0)
    for name, form in KERNELS.items():
        o, S = form(q, k, v, s, initial_state=h0, output_final_state=True)
        assert_close(o, o_ref, FP32, f"{name} o")
        assert_close(S, S_ref, FP32, f"{name} state")


@pytest.mark.parametrize("form", list(KERNELS))
def test_forward_fp16(form):
    q, k, v, s, h0 = make(1, 77, 2, 64, 64, "minimax", torch.float16)
    o_ref, S_ref = ref_lightning(q, k, v, s, h0=h0)
    o, S = FORMS[form](q, k, v, s, initial_state=h0, output_final_state=True)
    assert o.dtype == torch.float16 and not torch.isnan(o).any()
    assert_close(o, o_ref, tolerance(torch.float16), "o")
    assert_close(S, S_ref, tolerance(torch.float16), "final state")


def test_forms_agree():
    q, k, v, s, h0 = make(2, 100, 4, 48, 64, "mixed", torch.float32)
    outs = [f(q, k, v, s, initial_state=h0, output_final_state=True) for f in FORMS.values()]
    for o, S in outs[1:]:
        assert_close(o, outs[0][0], FP32, "o")
        assert_close(S, outs[0][1], FP32, "state")


def test_slopes_in_any_float_dtype():
    """slopes in fp16 are used as their fp32 values (the kernels read them in fp32)."""
    q, k, v, s, h0 = make(1, 40, 4, 16, 16, "minimax", torch.float32)
    s16 = s.half()
    o_ref, _ = ref_lightning(q, k, v, s16.float(), h0=h0)
    for name, form in KERNELS.items():
        assert_close(form(q, k, v, s16, initial_state=h0)[0], o_ref, FP32, name)


def test_decode_steps_continue_a_prefill():
    """chunk prefill then T=1 steps from its state (and the PyTorch step) = the whole sequence at once."""
    q, k, v, s, h0 = make(1, 72, 2, 32, 32, "minimax", torch.float32)
    o_all, S_all = ref_lightning(q, k, v, s, h0=h0)
    _, S = chunk_lightning(q[:, :64], k[:, :64], v[:, :64], s, initial_state=h0, output_final_state=True)
    S_torch = S.clone()
    for t in range(64, 72):
        o, S = fused_recurrent_lightning(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], s,
                                         initial_state=S, output_final_state=True)
        o_torch, S_torch = torch_lightning_step(q[:, t], k[:, t], v[:, t], s, S_torch)
        assert_close(o, o_all[:, t:t + 1], FP32, f"o at step {t}")
        assert_close(o_torch, o_all[:, t], FP32, f"PyTorch step o at step {t}")
    assert_close(S, S_all, FP32, "state")
    assert_close(S_torch, S_all, FP32, "PyTorch step state")


def test_references_take_fp64():
    q, k, v, s, h0 = (x.double() for x in make(1, 9, 2, 8, 12, "mixed", torch.float32))
    o, S = naive_recurrent_lightning(q, k, v, s, initial_state=h0, output_final_state=True)
    o_ref, S_ref = ref_lightning(q, k, v, s, h0=h0)
    assert o.dtype == S.dtype == torch.float64
    assert_close(o, o_ref, 1e-12, "o")
    o1, S1 = torch_lightning_step(q[:, 0], k[:, 0], v[:, 0], s, h0)
    assert o1.dtype == S1.dtype == torch.float64
    assert_close(o1, ref_lightning(q[:, :1], k[:, :1], v[:, :1], s, h0=h0)[0][:, 0], 1e-12, "step o")


# ------------------------------------------------------------------ decay: none to strong, and the slopes
def test_strong_decay_forgets_the_past():
    """slope 8 (λ = e^-8 ≈ 3e-4): after 10 tokens the state's memory of the earlier ones is below
    e^-80, so changing them (and the initial state) changes nothing fp32 can see, in every form."""
    q, k, v, s, h0 = make(1, 90, 4, 32, 16, "strong", torch.float32)
    for name, form in FORMS.items():
        o, _ = form(q, k, v, s, initial_state=h0)
        k2, v2 = k.clone(), v.clone()
        k2[:, :40], v2[:, :40] = torch.randn_like(k2[:, :40]), torch.randn_like(v2[:, :40])
        o2, _ = form(q, k2, v2, s, initial_state=torch.randn_like(h0))
        assert_close(o2[:, 50:], o[:, 50:], FP32, f"{name}: o after the forgotten tokens")
        assert torch.isfinite(o).all()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("form", list(FORMS))
def test_infinite_slope_resets_every_step(form):
    """s = +inf: λ = 0, the state is k_t v_tᵀ after every step (λ^0 = 1 on the diagonal of the chunk
    form's decay mask, not e^{-inf · 0} = NaN); one head with s = +inf beside finite ones."""
    q, k, v, s, h0 = make(1, 77, 3, 16, 8, "minimax", torch.float32)
    s[1] = math.inf
    o_ref, S_ref = ref_lightning(q, k, v, s, h0=h0)
    o, S = FORMS[form](q, k, v, s, initial_state=h0, output_final_state=True)
    assert_close(o, o_ref, FP32, "o")
    assert_close(S, S_ref, FP32, "final state")
    assert_close(o[:, :, 1], (q[:, :, 1] * k[:, :, 1]).sum(-1, keepdim=True) * v[:, :, 1], FP32, "o of the reset head")


def test_no_decay_grows_without_bound():
    """slope 0: the state is the plain sum of k v^T, and its norm grows with T (the chapter's figure)."""
    q, k, v, s, _ = make(1, 256, 1, 16, 16, "none", torch.float32)
    norms = []
    for T in (16, 64, 256):
        _, S = chunk_lightning(q[:, :T], k[:, :T], v[:, :T], s, output_final_state=True)
        assert_close(S, torch.einsum("btk,btv->kv", k[0, :T], v[0, :T]).view_as(S), FP32, f"state at T={T}")
        norms.append(S.norm().item())
    assert norms[0] < norms[1] < norms[2] and norms[2] > 2.5 * norms[0]


def test_lightning_slopes_formula():
    """MATH.md: base = 2^(-8/H), s_h = base^(h+1), scaled per layer by 1 - l/(L-1) + 1e-5 (MiniMax's
    code puts another 1e-5 into the denominator, which keeps L = 1 defined)."""
    for H, layer, L in [(32, 0, 80), (64, 10, 80), (8, 79, 80), (12, 3, 7), (1, 0, 1)]:
        s = lightning_slopes(H, layer, L)
        assert s.shape == (H,) and s.dtype == torch.float32
        base = 2.0 ** (-8.0 / H)
        factor = 1 - layer / (L - 1) + 1e-5 if L > 1 else 1 + 1e-5
        want = torch.tensor([base ** (h + 1) * factor for h in range(H)], dtype=torch.float64)
        # MiniMax's extra 1e-5 moves the factor by l·1e-5/(L-1)² at most: far inside these bounds
        assert torch.allclose(s.double(), want, rtol=1e-4, atol=1e-6), (H, layer, L)
    s = lightning_slopes(8)
    assert abs(s[0].item() - 2 ** -1 * (1 + 1e-5)) < 1e-6 and abs(s[-1].item() - 2 ** -8 * (1 + 1e-5)) < 1e-8
    assert (lightning_slopes(32, 0, 80) > lightning_slopes(32, 40, 80)).all(), "later layers decay less"
    assert lightning_slopes(32, 79, 80).max() < 1e-4, "the last layer barely decays"


@pytest.mark.parametrize("args, exc, match", [
    ((0,), ValueError, "num_heads"), ((4.0,), TypeError, "num_heads"), ((4, 2, 2), ValueError, "layer_idx"),
    ((4, -1, 2), ValueError, "layer_idx"), ((4, 0, 0), ValueError, "num_layers"), ((True,), TypeError, "num_heads"),
])
def test_lightning_slopes_refuses(args, exc, match):
    with pytest.raises(exc, match=match):
        lightning_slopes(*args)


# ------------------------------------------------------------------ the article's variant, and the block
def ref_elu_linear(q, k, v, eps):
    """o_t = Σ_{j<=t} (φ(q_t)·φ(k_j)) v_j / (Σ_{j<=t} φ(q_t)·φ(k_j) + eps), φ = ELU + 1: attention
    weights written out pair by pair (no state), in float64."""
    fq, fk, v = F.elu(q.double()) + 1, F.elu(k.double()) + 1, v.double()
    w = torch.einsum("bthk,bshk->bhts", fq, fk).tril()                 # [B, H, T, S], causal
    num = torch.einsum("bhts,bshv->bthv", w, v)
    den = w.sum(-1).transpose(1, 2).unsqueeze(-1) + eps                   # [B, T, H, 1]
    return num / den


def test_elu_linear_against_its_formula():
    q, k, v, _, _ = make(2, 37, 3, 16, 8, "none", torch.float32)
    o, (S, z) = naive_recurrent_elu_linear(q, k, v, eps=1e-6, output_final_state=True)
    assert_close(o, ref_elu_linear(q, k, v, 1e-6), FP32, "o")
    assert (z > 0).all()
    # each o_t is a weighted mean of the values seen: inside their range, channel by channel
    vmax = v.cummax(dim=1).values
    vmin = v.cummin(dim=1).values
    assert (o <= vmax + 1e-5).all() and (o >= vmin - 1e-5).all()
    # continuing from the returned state gives the rest of the sequence
    o2, _ = naive_recurrent_elu_linear(q[:, 20:], k[:, 20:], v[:, 20:], eps=1e-6,
                                       initial_state=naive_recurrent_elu_linear(q[:, :20], k[:, :20], v[:, :20],
                                                                               output_final_state=True)[1])
    assert_close(o2, o[:, 20:], FP32, "o after a restart from the state")


def test_article_step_is_not_a_normalisation():
    """The article's step divides by ‖o + eps‖: its output always has norm ≈ 1 whatever the values'
    scale, so it discards the magnitude the correct normalisation keeps (scaling v by 10 scales the
    correct output by 10)."""
    q, k, v, _, _ = make(1, 5, 2, 16, 16, "none", torch.float32)
    S = torch.zeros(1, 2, 16, 16, device=DEVICE)
    o_art, _ = article_lightning_step(q[:, 0], k[:, 0], v[:, 0], S)
    o_art10, _ = article_lightning_step(q[:, 0], k[:, 0], 10 * v[:, 0], S)
    assert torch.allclose(o_art.norm(dim=-1), torch.ones(1, 2, device=DEVICE), atol=1e-4)
    assert torch.allclose(o_art, o_art10, atol=1e-4)
    o, _ = naive_recurrent_elu_linear(q, k, v)
    o10, _ = naive_recurrent_elu_linear(q, k, 10 * v)
    assert_close(o10, 10 * o, FP32, "the correct normalisation keeps the scale")
    assert torch.allclose(elu_feature_map(torch.tensor([-1e9, 0.0, 2.0], device=DEVICE)),
                          torch.tensor([0.0, 1.0, 3.0], device=DEVICE))


def test_rms_norm_over_all_heads():
    x = torch.randn(2, 5, 64, device=DEVICE)
    w = torch.rand(64, device=DEVICE)
    y = rms_norm(x, w, eps=1e-6)
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    assert_close(y, want, FP32, "rms_norm")
    # a per-head L2 norm (the article's) is √D larger in the denominator than RMSNorm over the head
    head = x[..., :16]
    assert torch.allclose(head.norm(dim=-1), head.pow(2).mean(-1).sqrt() * 4, rtol=1e-5)


@pytest.mark.parametrize("attention", [None, chunk_lightning], ids=["reference", "chunk"])
def test_minimax_block(attention):
    """The block against its formula written out: SiLU(x W_qkv), Lightning, RMSNorm over H·D, sigmoid gate."""
    B, T, C, H, D = 2, 19, 48, 4, 16
    # every input on DEVICE: the chunk kernel takes CUDA tensors on a GPU (CPU ones under the interpreter)
    x = torch.randn(B, T, C, device=DEVICE)
    w_qkv, w_gate, w_out = (torch.randn(C, 3 * H * D, device=DEVICE) / 7, torch.randn(C, H * D, device=DEVICE) / 7,
                            torch.randn(H * D, C, device=DEVICE) / 8)
    g, s = torch.rand(H * D, device=DEVICE) + 0.5, lightning_slopes(H, 1, 4).to(DEVICE)
    y = minimax_lightning_block(x, w_qkv, w_gate, w_out, g, s, attention=attention)
    qkv = F.silu(x.double() @ w_qkv.double())
    q, k, v = qkv.view(B, T, 3, H, D).unbind(2)
    o, _ = ref_lightning(q, k, v, s)
    o = o.reshape(B, T, H * D)
    o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * g.double()
    want = (o * torch.sigmoid(x.double() @ w_gate.double())) @ w_out.double()
    assert y.shape == (B, T, C)
    assert_close(y, want, FP32 * 10, "block output")


# ------------------------------------------------------------------ NaN and inf a row cannot see
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("token", [35, CHUNK + 5], ids=["t35", "t69"])
@pytest.mark.parametrize("poison_case", list(POISONS))
@pytest.mark.parametrize("form", list(FORMS))
def test_poison_reaches_only_later_rows(form, poison_case, token):
    name, value = POISONS[poison_case]
    args = dict(zip(["q", "k", "v", "slopes", "h0"], make(2, 77, 2, 40, 24, "minimax", torch.float32)))
    h0 = args.pop("h0")
    clean = poison(args, name, value, token)
    o_ref, _ = ref_lightning(*clean.values(), h0=h0)
    o, S = FORMS[form](*args.values(), initial_state=h0, output_final_state=True)
    assert_poison_pattern(o, S, o_ref, name, token)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("form", list(FORMS))
def test_inf_in_v_with_one_channel(form):
    """K = V = 1, +inf in v at token 4: the math gives ±inf from there on (kv = λ kv + k v stays ±inf).
    The recurrent forms give exactly that; the chunk form NaN from token 4 on, nothing before."""
    q, k, v, s, _ = make(1, 10, 1, 1, 1, "minimax", torch.float32)
    v[:, 4] = math.inf
    o_exact, _ = ref_lightning(q, k, v, s)
    o, _ = FORMS[form](q, k, v, s)
    assert_inf_in_v(o, o_exact, token=4, exact=form != "chunk")


@pytest.mark.parametrize("form", list(FORMS))
def test_nan_past_the_end_of_a_view(form):
    """Inputs that are views into longer buffers holding NaN past T: never read."""
    B, T, H, K, V = 1, 70, 2, 32, 16
    bufs = [torch.full((B, T + 30, H, d), math.nan, device=DEVICE) for d in (K, K, V)]
    q, k, v = (b[:, :T] for b in bufs)
    real = make(B, T, H, K, V, "minimax", torch.float32)
    for x, r in zip((q, k, v), real):
        x.copy_(r)
    s = real[3]
    o_ref, _ = ref_lightning(q, k, v, s)
    o, _ = FORMS[form](q, k, v, s)
    assert_close(o, o_ref, FP32, "o")


# ------------------------------------------------------------------ layout and inputs left alone
@pytest.mark.parametrize("form", list(FORMS))
def test_non_contiguous_inputs(form):
    q, k, v, s, h0 = make(2, 40, 4, 32, 24, "mixed", torch.float32)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)            # same values, heads outermost
    vt = torch.cat([v, torch.randn_like(v)], dim=-1)[..., :24]     # a strided slice
    st = torch.stack([s, -s], dim=1)[:, 0]                         # strided slopes
    ht = h0.transpose(-1, -2).contiguous().transpose(-1, -2)
    o_ref, S_ref = ref_lightning(q, k, v, s, h0=h0)
    o, S = FORMS[form](qt, k, vt, st, initial_state=ht, output_final_state=True)
    assert_close(o, o_ref, FP32, "o")
    assert_close(S, S_ref, FP32, "final state")


@pytest.mark.parametrize("form", list(FORMS))
def test_inputs_are_not_modified(form):
    q, k, v, s, h0 = make(1, 70, 2, 16, 16, "strong", torch.float32)
    before = [x.clone() for x in (q, k, v, s, h0)]
    FORMS[form](q, k, v, s, initial_state=h0, output_final_state=True)
    for x, b in zip((q, k, v, s, h0), before):
        assert torch.equal(x, b)


def test_step_does_not_modify_the_state():
    q, k, v, s, h0 = make(2, 1, 2, 16, 16, "strong", torch.float32)
    before = h0.clone()
    torch_lightning_step(q[:, 0], k[:, 0], v[:, 0], s, h0)
    assert torch.equal(h0, before)


# ------------------------------------------------------------------ bad input
# Every class of bad input raises before any launch, with the argument named (tests/input_cases.py for
# the classes every family shares, then Lightning's own).
TENSORS = ["q", "k", "v", "slopes", "initial_state"]
FLOAT_TENSORS = ["q", "k", "v", "slopes"]    # initial_state must be fp32: its own cases below


def _good():
    q, k, v, s, h0 = make(1, 8, 2, 16, 12, "minimax", torch.float32)
    return dict(q=q, k=k, v=v, slopes=s, initial_state=h0, output_final_state=True)


def _step_good():
    args = _good()
    return {n: args[n][:, 0] for n in ("q", "k", "v")} | {"slopes": args["slopes"], "state": args["initial_state"]}


SHARED_CASES = linear_input_cases(token_tensors=("q", "k", "v"), key_tensors=("q", "k")) + [
    Case("slopes-heads", replace(slopes=lambda a: a["slopes"][:1]), ValueError, r"slopes must be \[H\] = \[2\]"),
    Case("slopes-per-token", replace(slopes=lambda a: a["slopes"].expand(1, 8, 2)), ValueError,
         "slopes must have 1 dims"),
]
KERNEL_CASES = linear_kernel_cases(key_tensors=("q", "k"))


@pytest.mark.parametrize("case", bad_input_cases(TENSORS, float_tensors=FLOAT_TENSORS) + SHARED_CASES
                         + KERNEL_CASES, ids=case_id)
@pytest.mark.parametrize("form", list(KERNELS))
def test_kernels_refuse(form, case):
    expect_refusal(KERNELS[form], _good, case)


@pytest.mark.parametrize("case", bad_input_cases(TENSORS, kernel=False, float_tensors=FLOAT_TENSORS)
                         + SHARED_CASES, ids=case_id)
def test_reference_refuses(case):
    expect_refusal(naive_recurrent_lightning, _good, case)


STEP_CASES = linear_step_cases() + [
    Case("slopes-heads", replace(slopes=lambda a: a["slopes"][:1]), ValueError, r"slopes must be \[H\]"),
]


@pytest.mark.parametrize("case", bad_input_cases(["q", "k", "v", "slopes", "state"], kernel=False,
                                                 float_tensors=["q", "k", "v", "slopes"]) + STEP_CASES, ids=case_id)
def test_step_refuses(case):
    expect_refusal(torch_lightning_step, _step_good, case)


@pytest.mark.parametrize("fn, good", [(naive_recurrent_lightning, _good), (torch_lightning_step, _step_good)],
                         ids=["naive_recurrent_lightning", "torch_lightning_step"])
def test_references_refuse_meta_tensors(fn, good):
    args = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in good().items()}
    with pytest.raises(ValueError, match="q is a meta tensor"):
        fn(**args)


def test_elu_linear_refuses():
    q, k, v, _, _ = make(1, 8, 2, 16, 12, "none", torch.float32)
    with pytest.raises(ValueError, match="eps"):
        naive_recurrent_elu_linear(q, k, v, eps=0.0)
    with pytest.raises(ValueError, match=r"k must be \[B, T, H, K\]"):
        naive_recurrent_elu_linear(q, k[:, :3], v)
    with pytest.raises(ValueError, match=r"initial_state\[1\] \(z\) must have shape"):
        naive_recurrent_elu_linear(q, k, v, initial_state=(torch.zeros(1, 2, 16, 12, device=DEVICE),
                                                           torch.zeros(1, 2, 12, device=DEVICE)))


# ------------------------------------------------------------------ GPU (bf16, fla's shapes)
# fla's test shapes; fp32 runs on the K = 64 shapes only, and each test checks both Triton forms
# against one fp64 reference.
GPU_SHAPES = [(1, 63, 1, 64, 64), (2, 1024, 4, 60, 60), (2, 1024, 8, 128, 128), (4, 2048, 8, 64, 64)]
GPU_CASES = ([(torch.bfloat16, s, d) for s in GPU_SHAPES for d in ("minimax", "strong", "none")]
             + [(torch.float32, s, d) for s in (GPU_SHAPES[0], GPU_SHAPES[3]) for d in ("mixed", "none")])


def gpu_tolerance(dtype, T):
    """tolerance(dtype), except that fp32 may also drift by T·u, u = 2^-24 (fp32's spacing just below 1).
    The recurrent form holds λ = exp(-s) in fp32 and multiplies the state by it once per token; the
    GPU's fast exp is not correctly rounded, so λ may be one spacing off, and after T tokens a key's
    weight λ^(T-j) is off by up to (T-j)·u relative. That matters for λ near 1 (slope 1e-5 in "mixed";
    no decay has λ = 1 exactly): the H200 showed 4.3e-5 on o at T = 2048; an fp32 loop with λ one
    spacing off gives 6.7e-5 on o and 9.4e-5 on the state, under the bound 1.2e-4. At T = 63 the bound
    is fp32's 1e-5. Still a wrong decay fails: slopes 1% off err by 1.7e-4, a slope of 2e-5 for 1e-5
    by 6e-3, slopes on the wrong heads by 1.4."""
    if dtype == torch.float32:
        return max(tolerance(dtype), T * 2.0 ** -24)
    return tolerance(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,shape,decay", GPU_CASES,
                         ids=[f"{str(d)[6:]}-{sid(s)}-{g}" for d, s, g in GPU_CASES])
def test_forward_gpu(dtype, shape, decay):
    q, k, v, s, h0 = make(*shape, decay, dtype, device="cuda")
    o_ref, S_ref = ref_lightning(q, k, v, s, h0=h0)
    tol = gpu_tolerance(dtype, shape[1])
    for name, form in KERNELS.items():
        o, S = form(q, k, v, s, initial_state=h0, output_final_state=True)
        assert not torch.isnan(o).any() and not torch.isnan(S).any(), name
        assert_close(o, o_ref, tol, f"{name} o")
        assert_close(S, S_ref, tol, f"{name} final state")


@pytest.mark.gpu
def test_minimax_shape_and_poison_gpu():
    """bf16 at MiniMax's head count (H = 64, D = 128) with its first layer's slopes; a NaN in v at
    token 1000 reaches that value channel from there on and nothing before."""
    q, k, v, s, h0 = make(1, 2048, 64, 128, 128, "minimax", torch.bfloat16, device="cuda")
    v[:, 1000, 3] = math.nan
    clean = v.clone()
    clean[:, 1000, 3] = 0
    o_ref, _ = ref_lightning(q, k, clean, s, h0=h0)
    for name, form in KERNELS.items():
        o, _ = form(q, k, v, s, initial_state=h0)
        poisoned = torch.zeros_like(o, dtype=torch.bool)
        poisoned[:, 1000:, 3] = True
        assert torch.equal(~torch.isfinite(o), poisoned), name
        assert_close(o[:, :1000], o_ref[:, :1000], tolerance(torch.bfloat16), f"{name} o before the NaN")


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 8, 64])
def test_decode_step_gpu(B):
    q, k, v, s, h0 = make(B, 1, 32, 128, 128, "minimax", torch.bfloat16, device="cuda")
    o_ref, S_ref = ref_lightning(q, k, v, s, h0=h0)
    for _ in range(2):                      # the second call takes the direct launch path
        o, S = fused_recurrent_lightning(q, k, v, s, initial_state=h0, output_final_state=True)
        assert_close(o, o_ref, tolerance(torch.bfloat16), "o")
        assert_close(S, S_ref, FP32, "state (fp32 math on the bf16 inputs)")
    o_t, S_t = torch_lightning_step(q[:, 0], k[:, 0], v[:, 0], s, h0)
    assert_close(o_t, o_ref[:, 0], tolerance(torch.bfloat16), "PyTorch step o")
    assert_close(S_t, S_ref, FP32, "PyTorch step state")
