"""Training the chunk forms (attention_kernels/linear/chunk_backward.py): chunk_gla's and chunk_lightning's gradients
against autograd through the fp64 loops (naive_recurrent_gla, naive_recurrent_lightning), with a loss
through o and through the final state (random upstream gradients for both); lengths around the chunk
(1, 37, 64, 70), K != V, with and without an initial state; GLA gates near 0, strong, and -inf (a full
reset, whose gradient is exactly 0); Lightning slopes 0 (no decay) to 2. The forms without a backward
refuse an input that requires grad, by name.

CPU (interpreter): fp32, held to the fp32 tolerance (the kernels multiply fp32 in IEEE fp32); fp16 against
the same kernels in fp32, within the fp16 tolerance, with the backward's chunk states and their gradients
stored in fp16 (`chunk_state_dtype`). GPU: bf16 on B=2, T=1000, H=4, K=V=128 against the same kernels in fp32,
each gradient within 5e-3 (fla's ratio).
"""
import contextlib
import weakref

import pytest
import torch
import torch.nn.functional as F

from attention_kernels.common import DEVICE, assert_close, tolerance
from attention_kernels.gla import chunk_gla, fused_recurrent_gla, naive_recurrent_gla, sequential_chunk_gla
from attention_kernels.gla import interface as gla_interface
from attention_kernels.gla.chunk import chunk_gla_scores
from attention_kernels.lightning import chunk_lightning, fused_recurrent_lightning, lightning_slopes, naive_recurrent_lightning
from attention_kernels.linear import CHUNK, chunk_local_cumsum, chunk_state_dtype, chunk_state_pass
from attention_kernels.linear import chunk_backward
from attention_kernels.linear.chunk_backward import chunk_dqk, chunk_dv, chunk_state_grad_pass
from linear_cases import RecordingKernel

FP32 = tolerance(torch.float32)
BF16_GRAD = 5e-3


def gates(kind, shape, device=DEVICE):
    """Log gates: 'paper' (logsigmoid / 16), 'near0' (-1e-2 to 0), 'strong' (-5 to -35 per step, in
    multiples of 1/64 so that their in-chunk sums are exact in fp32: the kernels' exponents are differences
    of those sums, and an inexact sum near -2000 would move them by 2^-24 · 2000 ≈ 1e-4, the fp32 cumsum's
    error rather than the backward's), 'reset' (the paper's, with -inf at a few places)."""
    if kind == "paper":
        return F.logsigmoid(torch.randn(shape, device=device)) / 16
    if kind == "near0":
        return -1e-2 * torch.rand(shape, device=device)
    if kind == "strong":
        return -torch.round((5 + 30 * torch.rand(shape, device=device)) * 64) / 64
    g = F.logsigmoid(torch.randn(shape, device=device)) / 16
    T = shape[1]
    g[0, T // 2, 0, : shape[-1] // 2] = float("-inf")      # half the channels of one head forget
    g[-1, T - 1, -1, :] = float("-inf")                    # a whole head, on the last token
    g[0, 0, -1, 1] = float("-inf")                         # one channel, on the first token
    return g


def grads(fn, tensors, h0, do, dht, fixed=(), **kwargs):
    """(o, final state, the gradients of sum(o·do) + sum(final·dht) to every tensor and to h0 unless None),
    through fn(*tensors, *fixed, initial_state=h0, output_final_state=True, **kwargs)."""
    leaves = [t.detach().clone().requires_grad_() for t in (*tensors, *([] if h0 is None else [h0]))]
    o, ht = fn(*leaves[:len(tensors)], *fixed, initial_state=None if h0 is None else leaves[-1],
               output_final_state=True, **kwargs)
    loss = (o.double() * do.double()).sum() + (ht.double() * dht.double()).sum()
    return o, ht, torch.autograd.grad(loss, leaves)


def assert_grads_close(out, ref, names, tol=FP32):
    """out, ref: what `grads` returns; names: the gradients'."""
    assert_close(out[0], ref[0], tol, "o")
    assert_close(out[1], ref[1], tol, "final_state")
    for name, a, b in zip(names, out[2], ref[2], strict=True):
        assert_close(a, b, tol, name)


def gla_inputs(B, T, H, K, V, gate, with_h0, device=DEVICE):
    """[q, k, v, gk], h0 or None, do, dht: fresh random fp32."""
    q, k = (torch.randn(B, T, H, K, device=device) for _ in "qk")
    v = torch.randn(B, T, H, V, device=device)
    h0 = torch.randn(B, H, K, V, device=device) if with_h0 else None
    do, dht = torch.randn(B, T, H, V, device=device), torch.randn(B, H, K, V, device=device)
    return [q, k, v, gates(gate, (B, T, H, K), device)], h0, do, dht


def fp64(tensors):
    return [None if t is None else t.double() for t in tensors]


def shape_id(B, T, H, K, V):
    return f"B{B}-T{T}-H{H}-K{K}-V{V}"


GLA_CASES = [  # (B, T, H, K, V), gate, initial state
    ((1, 1, 2, 32, 16), "paper", True),
    ((2, 37, 2, 16, 48), "paper", False),
    ((1, 64, 2, 32, 16), "near0", True),
    ((1, 70, 2, 16, 48), "strong", True),
    ((2, 70, 2, 32, 16), "reset", True),
]


@pytest.mark.parametrize("shape, gate, with_h0", GLA_CASES,
                         ids=[f"{shape_id(*s)}-{g}-{'h0' if h else 'no-h0'}" for s, g, h in GLA_CASES])
def test_gla_gradients(shape, gate, with_h0):
    tensors, h0, do, dht = gla_inputs(*shape, gate, with_h0)
    out = grads(chunk_gla, tensors, h0, do, dht)
    ref = grads(naive_recurrent_gla, fp64(tensors), *fp64([h0]), do, dht)
    assert_grads_close(out, ref, ["dq", "dk", "dv", "dgk"] + (["dh0"] if with_h0 else []))
    assert [g.dtype for g in out[2]] == [torch.float32] * len(out[2])
    if gate == "reset":                       # a gate of -inf: no gradient at all, as in the fp64 loop
        reset = tensors[3] == float("-inf")
        assert reset.any() and (out[2][3][reset] == 0).all()


@pytest.mark.parametrize("K, key_tile", [(48, 16), (40, 16), (32, 32)], ids=["K48-tiles16", "K40-tiles16", "K32-one-tile"])
def test_gla_gradients_with_the_sub_chunk_kernel_on_key_tiles(K, key_tile, monkeypatch):
    # the sub-chunk dq/dk kernel over key tiles (`_INTRA_BK`): three whole tiles, two and a partial one, one
    # tile of all of K; T 70 (a partial chunk, sub-chunks past T), strong gates (exponents far below 0)
    monkeypatch.setattr(chunk_backward, "_INTRA_BK", key_tile)
    launched = []
    kernel = chunk_backward._chunk_dqk_intra_kernel
    monkeypatch.setattr(chunk_backward, "_chunk_dqk_intra_kernel", RecordingKernel(kernel, launched))
    tensors, h0, do, dht = gla_inputs(2, 70, 2, K, 24, "strong", True)
    out = grads(chunk_gla, tensors, h0, do, dht)
    ref = grads(naive_recurrent_gla, fp64(tensors), *fp64([h0]), do, dht)
    assert_grads_close(out, ref, ["dq", "dk", "dv", "dgk", "dh0"])
    assert launched == [(-(-K // key_tile) * CHUNK // 16, 2, 2 * 2)]     # (key tiles x sub-chunks, chunks, B x H)


def test_gla_loss_through_the_final_state_only():
    # o takes no gradient: autograd hands the backward None for it
    (q, k, v, gk), h0, _, dht = gla_inputs(1, 70, 2, 16, 32, "paper", True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, gk, h0)]
    _, ht = chunk_gla(*leaves[:4], initial_state=leaves[4], output_final_state=True)
    got = torch.autograd.grad((ht * dht).sum(), leaves)
    refs = [t.double().requires_grad_() for t in (q, k, v, gk, h0)]
    _, ht_ref = naive_recurrent_gla(*refs[:4], initial_state=refs[4], output_final_state=True)
    want = torch.autograd.grad((ht_ref * dht.double()).sum(), refs, allow_unused=True)
    assert want[0] is None and (got[0] == 0).all()      # q reaches only o
    for name, a, b in zip(["dk", "dv", "dgk", "dh0"], got[1:], want[1:]):
        assert_close(a, b, FP32, name)


def test_gate_per_head():
    # the shared kernels with a gate per head (G = 1, as Mamba-2's): the gate's gradient is the per-channel
    # one summed over the key channels, and dq, dk, dv are those of the gate broadcast over them
    B, T, H, K, V = 1, 70, 2, 32, 16
    (q, k, v, _), h0, do, dht = gla_inputs(B, T, H, K, V, "paper", True)
    g_head = F.logsigmoid(torch.randn(B, T, H, 1, device=DEVICE)) / 4
    refs = [t.double().requires_grad_() for t in (q, k, v, g_head, h0)]
    o_ref, ht_ref = naive_recurrent_gla(*refs[:3], refs[3].expand(B, T, H, K), initial_state=refs[4],
                                        output_final_state=True)
    want = torch.autograd.grad((o_ref * do.double()).sum() + (ht_ref * dht.double()).sum(), refs)

    scale, NT = K ** -0.5, -(-T // CHUNK)
    b = torch.empty(B, T, H, 1, device=DEVICE)
    chunk_local_cumsum(g_head, b)
    states = torch.empty(B, NT, H, K, V, device=DEVICE)
    chunk_state_pass(k, v, b, states, h0)
    A = torch.empty(B, T, H, CHUNK, device=DEVICE)
    chunk_gla_scores(q, k, b.expand(B, T, H, K).contiguous(), A, scale)
    dstates, dh0 = torch.empty(B, NT, H, K, V, device=DEVICE), torch.empty_like(h0)
    chunk_state_grad_pass(q, do, b, dstates, scale, dht, dh0)
    dv, dA = torch.empty_like(v), torch.empty(B, T, H, CHUNK, device=DEVICE)
    chunk_dv(q, k, v, b, A, dstates, do, dv, dA, scale)
    dq, dk, dg = torch.empty_like(q), torch.empty_like(k), torch.empty_like(g_head)
    chunk_dqk(q, k, v, g_head, b, states, dstates, do, dA, dq, dk, dg, scale)
    for name, a, w in zip(["dq", "dk", "dv", "dg", "dh0"], (dq, dk, dv, dg, dh0), want):
        assert_close(a, w, FP32, name)


LIGHTNING_CASES = [  # (B, T, H, K, V), initial state, scale
    ((1, 1, 3, 32, 16), True, 1.0),
    ((2, 37, 3, 16, 48), False, 0.25),
    ((1, 70, 3, 32, 16), True, 1.0),
    ((1, 70, 3, 16, 80), True, 0.5),      # two value tiles, the last partial: K dS' apart from the scores
]


@pytest.mark.parametrize("shape, with_h0, scale", LIGHTNING_CASES,
                         ids=[f"{shape_id(*s)}-{'h0' if h else 'no-h0'}-scale{c}" for s, h, c in LIGHTNING_CASES])
def test_lightning_gradients(shape, with_h0, scale):
    B, T, H, K, V = shape
    slopes = torch.tensor([0.0, 0.05, 2.0], device=DEVICE)      # no decay, a slow one, e^-2 per step
    tensors = [torch.randn(B, T, H, d, device=DEVICE) for d in (K, K, V)]
    h0 = torch.randn(B, H, K, V, device=DEVICE) if with_h0 else None
    do, dht = torch.randn(B, T, H, V, device=DEVICE), torch.randn(B, H, K, V, device=DEVICE)
    out = grads(chunk_lightning, tensors, h0, do, dht, fixed=(slopes,), scale=scale)
    ref = grads(naive_recurrent_lightning, fp64(tensors), *fp64([h0]), do, dht, fixed=(slopes.double(),),
                scale=scale)
    assert_grads_close(out, ref, ["dq", "dk", "dv"] + (["dh0"] if with_h0 else []))


@pytest.mark.parametrize("given", ["dA_kk", "dk_rows", "beta", "dA_kk dk_rows"])
def test_sub_chunk_key_pairs_take_their_three_tensors_together(given):
    # KDA's second score matrix needs its gradient, the rows' buffer and the row weights β: any of them alone
    # is refused before a launch
    x = torch.zeros(1, 70, 2, 16, device=DEVICE)
    dA = torch.zeros(1, 70, 2, CHUNK, device=DEVICE)
    extra = {"dA_kk": dA, "dk_rows": x, "beta": torch.zeros(1, 70, 2, device=DEVICE)}
    with pytest.raises(ValueError, match="dA_kk, dk_rows and beta together"):
        chunk_backward.chunk_dqk_intra(x, x, x, dA, x, x, **{n: extra[n] for n in given.split()})


def test_lightning_refuses_slopes_that_require_grad():
    q, k, v = (torch.randn(1, 8, 2, 16, device=DEVICE) for _ in "qkv")
    slopes = lightning_slopes(2).to(DEVICE).requires_grad_()
    with pytest.raises(ValueError, match="slopes requires grad"):
        chunk_lightning(q.requires_grad_(), k, v, slopes)
    with torch.no_grad():                     # no graph is recorded: nothing to refuse
        chunk_lightning(q, k, v, slopes)


FORMS_WITHOUT_BACKWARD = {
    "fused_recurrent_gla": (fused_recurrent_gla, "gk"),
    "sequential_chunk_gla": (sequential_chunk_gla, "initial_state"),
    "fused_recurrent_lightning": (fused_recurrent_lightning, "q"),
}


@pytest.mark.parametrize("form", FORMS_WITHOUT_BACKWARD)
def test_forms_without_backward_refuse_grad(form):
    fn, name = FORMS_WITHOUT_BACKWARD[form]
    args = {x: torch.randn(1, 8, 2, 16, device=DEVICE) for x in "qkv"}
    args["initial_state"] = torch.randn(1, 2, 16, 16, device=DEVICE)
    if "gla" in form:
        args["gk"] = -torch.rand(1, 8, 2, 16, device=DEVICE)
    else:
        args["slopes"] = lightning_slopes(2).to(DEVICE)
    args[name] = args[name].requires_grad_()
    with pytest.raises(ValueError, match=f"{name} requires grad.*{form}.*no backward"):
        fn(**args)
    with torch.no_grad():
        fn(**args)


# ------------------------------------------------------------------ 16-bit against the kernels in fp32
def low_against_fp32(fn, tensors, h0, names, dtype, grad_tol, fixed=()):
    """fn's gradients on 16-bit q, k, v (and dO) against fn's own in fp32 on the same values: the inputs are
    rounded to dtype first, so the comparison measures the kernels' 16-bit arithmetic, not the rounding."""
    low = [t.to(dtype) for t in tensors[:3]] + tensors[3:]          # GLA's gates stay fp32
    do, dht = torch.randn_like(low[2]), torch.randn_like(h0)
    ref = grads(fn, [t.float() for t in low], h0, do.float(), dht, fixed=fixed)
    out = grads(fn, low, h0, do, dht, fixed=fixed)
    assert_close(out[0], ref[0], tolerance(dtype), "o")
    assert_close(out[1], ref[1], tolerance(dtype), "final_state")
    for name, a, b in zip(names, out[2], ref[2], strict=True):
        assert_close(a, b, grad_tol, name)


def test_chunk_state_dtype():
    # the backward's per-chunk states and their gradients: 16-bit for 16-bit inputs (every product rounds
    # them to the input dtype anyway), fp32 for fp32 inputs
    assert [chunk_state_dtype(d) for d in (torch.float16, torch.bfloat16, torch.float32)] == \
        [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_gla_backward_keeps_chunk_states_in_the_input_dtype(dtype, monkeypatch):
    # the states and state gradients GLA's backward hands its last launch
    seen = []

    def recording(q, k, v, gk, b, states, dstates, *args, **kwargs):
        seen.append((states.dtype, dstates.dtype))
        return chunk_dqk(q, k, v, gk, b, states, dstates, *args, **kwargs)

    monkeypatch.setattr(gla_interface, "chunk_dqk", recording)
    tensors, h0, do, dht = gla_inputs(1, 70, 2, 16, 16, "paper", True)
    grads(chunk_gla, [t.to(dtype) for t in tensors[:3]] + tensors[3:], h0, do, dht)
    assert seen == [(dtype, dtype)]


def _recording_scores(monkeypatch):
    """Count GLA's scores launches and hold a weak reference to each scores buffer they write (the packed
    row's buffer, where a launch writes one sequence's rows of it)."""
    launched = []

    def recording(q, k, g, A, scale, packed=None):
        launched.append(weakref.ref(A if A._base is None else A._base))
        return chunk_gla_scores(q, k, g, A, scale, packed=packed)

    monkeypatch.setattr(gla_interface, "chunk_gla_scores", recording)
    return launched


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_gla_training_step_launches_the_scores_once(packed, monkeypatch):
    # the backward takes the forward's scores: one scores launch a step (over every packed sequence's chunks
    # at once), the scores kept from the forward to the backward and freed with the graph, the gradients still
    # the fp64 loop's
    launched = _recording_scores(monkeypatch)
    tensors, h0, do, dht = gla_inputs(1, 70, 2, 16, 32, "paper", True)
    lengths = [33, 37] if packed else [70]
    cu = torch.tensor([0, 33, 70], dtype=torch.int32, device=DEVICE) if packed else None
    if packed:
        h0, dht = torch.cat([h0, torch.randn_like(h0)]), torch.cat([dht, torch.randn_like(dht)])
    leaves = [t.clone().requires_grad_() for t in (*tensors, h0)]
    o, ht = chunk_gla(*leaves[:4], initial_state=leaves[4], output_final_state=True, cu_seqlens=cu)
    assert len(launched) == 1 and launched[0]() is not None       # kept for the backward
    got = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), leaves)
    assert len(launched) == 1 and launched[0]() is None           # freed with the graph
    starts = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    for n, (s, e) in enumerate(zip(starts[:-1], starts[1:])):
        refs = [t[:, s:e].double().requires_grad_() for t in tensors] + [h0[n:n + 1].double().requires_grad_()]
        o_ref, ht_ref = naive_recurrent_gla(*refs[:4], initial_state=refs[4], output_final_state=True)
        loss = (o_ref * do[:, s:e].double()).sum() + (ht_ref * dht[n:n + 1].double()).sum()
        want = torch.autograd.grad(loss, refs)
        for name, a, b in zip(["dq", "dk", "dv", "dgk"], got[:4], want[:4]):
            assert_close(a[:, s:e], b, FP32, name)
        assert_close(got[4][n:n + 1], want[4], FP32, "dh0")


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "no_input_requires_grad"])
def test_gla_forward_without_gradient_keeps_nothing(mode, monkeypatch):
    # a prefill keeps nothing for a backward: its scores are freed when the call returns, o in hand
    launched = _recording_scores(monkeypatch)
    tensors, h0, _, _ = gla_inputs(1, 70, 2, 16, 32, "paper", True)
    inputs = [t.clone().requires_grad_(mode != "no_input_requires_grad") for t in (*tensors, h0)]
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
               "no_input_requires_grad": contextlib.nullcontext}[mode]
    with context():
        o, ht = chunk_gla(*inputs[:4], initial_state=inputs[4], output_final_state=True)
    assert o.grad_fn is None and ht.grad_fn is None
    assert len(launched) == 1 and launched[0]() is None


def test_gla_fp16_gradients():
    tensors, h0, _, _ = gla_inputs(1, 150, 2, 32, 32, "paper", True)
    low_against_fp32(chunk_gla, tensors, h0, ["dq", "dk", "dv", "dgk", "dh0"], torch.float16,
                     tolerance(torch.float16))


def test_lightning_fp16_gradients():
    B, T, H, K, V = 1, 150, 2, 32, 32
    tensors = [torch.randn(B, T, H, d, device=DEVICE) for d in (K, K, V)]
    low_against_fp32(chunk_lightning, tensors, torch.randn(B, H, K, V, device=DEVICE), ["dq", "dk", "dv", "dh0"],
                     torch.float16, tolerance(torch.float16), fixed=(lightning_slopes(H).to(DEVICE),))


@pytest.mark.gpu
def test_gla_bf16_gradients_gpu():
    tensors, h0, _, _ = gla_inputs(2, 1000, 4, 128, 128, "paper", True, device="cuda")
    low_against_fp32(chunk_gla, tensors, h0, ["dq", "dk", "dv", "dgk", "dh0"], torch.bfloat16, BF16_GRAD)


@pytest.mark.gpu
def test_lightning_bf16_gradients_gpu():
    B, T, H, K, V = 2, 1000, 4, 128, 128
    tensors = [torch.randn(B, T, H, d, device="cuda") for d in (K, K, V)]
    low_against_fp32(chunk_lightning, tensors, torch.randn(B, H, K, V, device="cuda"), ["dq", "dk", "dv", "dh0"],
                     torch.bfloat16, BF16_GRAD, fixed=(lightning_slopes(H).cuda(),))
