"""Training chunk_kda (attention_kernels/kda/chunk_backward.py): its gradients to q, k, v, g, beta and the initial
state against autograd through the fp64 loop (naive_recurrent_kda), with a loss through o and through
the final state (random upstream gradients for both); lengths 1, 37 and 70 (not chunk multiples), K != V,
with and without an initial state, the L2 norm in the kernel on and off (off: the keys come normalised,
as the delta rule needs); gates near 0, the paper's, strong, and -inf (a reset, gradient 0); beta near 0,
uniform, near 1.
fused_recurrent_kda has no backward and refuses an input that requires grad.

CPU (interpreter): fp32, within 1e-5 of the fp64 loop (the kernels multiply fp32 in IEEE fp32); fp16 against the same function in fp32, within the fp16 tolerance
(the backward's chunk states and their gradients then in fp16). GPU: bf16 against the same function in
fp32, within 5e-3.
"""
import pytest
import torch
import torch.nn.functional as F

from attention_kernels.common import DEVICE, assert_close, tolerance
from attention_kernels.kda import chunk_kda, fused_recurrent_kda, naive_recurrent_kda
from linear_cases import RecordingKernel
from test_linear_backward import BF16_GRAD, FP32, assert_grads_close, fp64, gates, grads, shape_id

NAMES = ["dq", "dk", "dv", "dg", "dbeta"]


def betas(kind, shape, device=DEVICE):
    """'near0' (below 1e-3), 'uniform' ([0, 1)), 'near1' (above 1 - 1e-3)."""
    r = torch.rand(shape, device=device)
    return {"near0": 1e-3 * r, "uniform": r, "near1": 1 - 1e-3 * r}[kind]


def kda_inputs(B, T, H, K, V, gate, beta, with_h0, l2norm, device=DEVICE):
    """[q, k, v, g, beta], h0 or None, do, dht: fresh random fp32; without the in-kernel L2 norm the keys
    are given normalised."""
    q, k = (torch.randn(B, T, H, K, device=device) for _ in "qk")
    if not l2norm:
        k = F.normalize(k, dim=-1)
    v = torch.randn(B, T, H, V, device=device)
    h0 = torch.randn(B, H, K, V, device=device) if with_h0 else None
    do, dht = torch.randn(B, T, H, V, device=device), torch.randn(B, H, K, V, device=device)
    return [q, k, v, gates(gate, (B, T, H, K), device), betas(beta, (B, T, H), device)], h0, do, dht


KDA_CASES = [  # (B, T, H, K, V), gate, beta, initial state, L2 norm in the kernel
    ((1, 1, 2, 32, 16), "paper", "uniform", True, True),
    ((2, 37, 2, 16, 48), "paper", "uniform", False, False),
    ((1, 70, 2, 32, 16), "near0", "near1", True, True),
    ((1, 70, 2, 16, 48), "strong", "near0", True, False),
    ((1, 70, 2, 16, 32), "paper", "near1", False, False),
    ((2, 70, 2, 32, 16), "reset", "uniform", True, True),
]


@pytest.mark.parametrize("shape, gate, beta, with_h0, l2norm", KDA_CASES,
                         ids=[f"{shape_id(*s)}-{g}-beta_{b}-{'h0' if h else 'no-h0'}-{'l2' if n else 'no-l2'}"
                              for s, g, b, h, n in KDA_CASES])
def test_kda_gradients(shape, gate, beta, with_h0, l2norm):
    tensors, h0, do, dht = kda_inputs(*shape, gate, beta, with_h0, l2norm)
    out = grads(chunk_kda, tensors, h0, do, dht, use_qk_l2norm_in_kernel=l2norm)
    ref = grads(naive_recurrent_kda, fp64(tensors), *fp64([h0]), do, dht, use_qk_l2norm_in_kernel=l2norm)
    assert_grads_close(out, ref, NAMES + (["dh0"] if with_h0 else []))
    assert [g.dtype for g in out[2]] == [torch.float32] * len(out[2])
    if gate == "reset":                       # a gate of -inf: no gradient at all, as in the fp64 loop
        reset = tensors[3] == float("-inf")
        assert reset.any() and (out[2][3][reset] == 0).all()


def test_kda_gradients_with_the_sub_chunk_kernel_on_key_tiles(monkeypatch):
    # KDA's sub-chunk launch (A_qk's pairs and A_kk's, k in both places) over key tiles of 16 of K = 48, T 70:
    # three whole tiles; the gradients against the fp64 loop
    from attention_kernels.linear import chunk_backward
    monkeypatch.setattr(chunk_backward, "_INTRA_BK", 16)
    tensors, h0, do, dht = kda_inputs(1, 70, 2, 48, 16, "paper", "uniform", True, True)
    out = grads(chunk_kda, tensors, h0, do, dht, use_qk_l2norm_in_kernel=True)
    ref = grads(naive_recurrent_kda, fp64(tensors), *fp64([h0]), do, dht, use_qk_l2norm_in_kernel=True)
    assert_grads_close(out, ref, NAMES + ["dh0"])


def test_kda_gradients_at_the_gpu_tiles_of_the_chunk_kernel(monkeypatch):
    # the per-chunk gradient kernel at the tiles it takes on a GPU (key tiles of 32, value tiles of 64; the
    # interpreter's default is 16): K = 48 and V = 80 leave a partial tile of each, T 70 a partial chunk
    from attention_kernels.kda import chunk_backward
    monkeypatch.setattr(chunk_backward, "on_machine", lambda gpu, interpreter: gpu)
    tensors, h0, do, dht = kda_inputs(1, 70, 2, 48, 80, "paper", "uniform", True, True)
    out = grads(chunk_kda, tensors, h0, do, dht, use_qk_l2norm_in_kernel=True)
    ref = grads(naive_recurrent_kda, fp64(tensors), *fp64([h0]), do, dht, use_qk_l2norm_in_kernel=True)
    assert_grads_close(out, ref, NAMES + ["dh0"])


@pytest.mark.parametrize("K", [80, 128], ids=["K80-part-of-the-second", "K128-both-full"])
def test_kda_gradients_with_the_state_gradient_in_key_halves(K, monkeypatch):
    # the delta rule's reverse state pass with its gradient as two halves of 64 key rows (`_DELTA_HALVES`, the
    # form launched at 64 < K <= 128): K 80 fills the first and part of the second, K 128 both; T 70 (a partial
    # chunk), an initial state and a loss through the final state
    from attention_kernels.linear import chunk_backward
    monkeypatch.setattr(chunk_backward, "_DELTA_HALVES", True)
    launched = []
    kernel = chunk_backward._delta_state_grad_halves_kernel
    monkeypatch.setattr(chunk_backward, "_delta_state_grad_halves_kernel", RecordingKernel(kernel, launched))
    tensors, h0, do, dht = kda_inputs(1, 70, 2, K, 24, "paper", "uniform", True, True)
    out = grads(chunk_kda, tensors, h0, do, dht, use_qk_l2norm_in_kernel=True)
    ref = grads(naive_recurrent_kda, fp64(tensors), *fp64([h0]), do, dht, use_qk_l2norm_in_kernel=True)
    assert_grads_close(out, ref, NAMES + ["dh0"])
    assert launched == [(2, 2)]                  # (value tiles of 16, B x H)


def test_kda_walk_with_a_row_masked_score_tile_gives_the_same_gradients(monkeypatch):
    # the experiment `_DELTA_AQK_ROW_MASK`: A_qk's tile loaded under its rows' mask and its upper triangle
    # zeroed after the load gives the gradients of the triangle-masked load, bit for bit (the stored upper
    # triangle filled with NaN, which neither form may read into a product); K 80, T 70
    from attention_kernels.kda import chunk_backward as kda_backward
    from attention_kernels.linear import chunk_backward
    monkeypatch.setattr(chunk_backward, "_DELTA_HALVES", True)
    tensors, h0, do, dht = kda_inputs(1, 70, 2, 80, 24, "paper", "uniform", True, True)
    pass_ = kda_backward.chunk_state_grad_pass

    def poisoned(q, do_, b, dstates, scale, dht=None, dh0=None, *, Aqk=None, **kw):
        if Aqk is not None:      # NaN above the diagonal of every chunk's tile, as memory left unwritten may hold
            upper = torch.arange(Aqk.shape[-1])[None, :] > (torch.arange(Aqk.shape[1]) % Aqk.shape[-1])[:, None]
            Aqk = Aqk.masked_fill(upper[None, :, None, :].to(Aqk.device), float("nan"))
        return pass_(q, do_, b, dstates, scale, dht, dh0, Aqk=Aqk, **kw)
    monkeypatch.setattr(kda_backward, "chunk_state_grad_pass", poisoned)
    out = {}
    for row_mask in (False, True):
        monkeypatch.setattr(chunk_backward, "_DELTA_AQK_ROW_MASK", row_mask)
        out[row_mask] = grads(chunk_kda, tensors, h0, do, dht, use_qk_l2norm_in_kernel=True)
    for name, a, b in zip(NAMES + ["dh0"], out[False][2], out[True][2], strict=True):
        assert torch.equal(a, b), name
        assert not a.isnan().any(), name


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_kda_walk_with_the_queries_gated_by_the_wy_launch_gives_the_same_gradients(packed, monkeypatch):
    # the experiment `_DELTA_GATED_QUERIES`: `_kda_wy_kernel` writes scale · q ⊙ e^b and the halves' pass
    # reads it in place of q and the gates; in fp32 the product is the same one, so the gradients are the same
    # bit for bit; K 80, T 70 (a partial chunk) as one sequence or two packed, initial states and a loss
    # through the final states
    from attention_kernels.kda import chunk as kda_chunk
    from attention_kernels.linear import chunk_backward
    monkeypatch.setattr(chunk_backward, "_DELTA_HALVES", True)
    launched = []         # each launch's GATED_Q
    monkeypatch.setattr(kda_chunk, "_kda_wy_kernel", RecordingKernel(kda_chunk._kda_wy_kernel, launched, "GATED_Q"))
    (q, k, v, g, beta), h0, do, _ = kda_inputs(1, 70, 2, 80, 24, "paper", "uniform", True, True)
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device=DEVICE) if packed else None
    h0 = torch.cat([h0, h0.flip(0) + 1]) if packed else h0
    dht = torch.randn_like(h0)
    out = {}
    for gated in (False, True):
        monkeypatch.setattr(chunk_backward, "_DELTA_GATED_QUERIES", gated)
        launched.clear()
        leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
        o, ht = chunk_kda(*leaves[:5], initial_state=leaves[5], output_final_state=True,
                          use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
        torch.autograd.backward((o, ht), (do, dht))
        out[gated] = [t.grad for t in leaves]
        # the forward's launch, then the backward's, which writes the gated queries when the pass takes them
        assert launched == [False, gated]
    for name, a, b in zip(NAMES + ["dh0"], out[False], out[True], strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("case", ["switch off", "key dim 64", "no delta rule"])
def test_the_gated_queries_are_refused_where_the_pass_does_not_take_them(case, monkeypatch):
    # only the delta rule's pass in key halves (64 < K <= 128) with `_DELTA_GATED_QUERIES` on takes them
    from attention_kernels.linear import chunk_backward
    monkeypatch.setattr(chunk_backward, "_DELTA_HALVES", True)
    monkeypatch.setattr(chunk_backward, "_DELTA_GATED_QUERIES", case != "switch off")
    K = 64 if case == "key dim 64" else 80
    q, do = torch.zeros(1, 64, 1, K), torch.zeros(1, 64, 1, 16)
    delta = {} if case == "no delta rule" else dict(Aqk=torch.zeros(1, 64, 1, 64), kg=q, w=q, du=do.clone())
    with pytest.raises(ValueError, match="gated_queries"):
        chunk_backward.chunk_state_grad_pass(q, do, torch.zeros_like(q), torch.zeros(1, 1, 1, K, 16), 1.0,
                                             gated_queries=q, **delta)


def test_kda_walk_at_a_short_key_dim_is_the_one_tile_pass():
    # K <= 64: a second key half would be all padding, so the one-tile pass runs (and above 128)
    from attention_kernels.linear import chunk_backward
    assert not chunk_backward.delta_walk_in_halves(64, torch.device(DEVICE))
    assert chunk_backward.delta_walk_in_halves(65, torch.device(DEVICE))
    assert not chunk_backward.delta_walk_in_halves(192, torch.device(DEVICE))


def test_kda_gradients_with_the_state_gradient_as_one_tile(monkeypatch):
    # the one-tile reverse state pass, which K <= 64 and K > 128 take, at K 80 too (halves off): it runs, and
    # its gradients are the fp64 loop's
    from attention_kernels.linear import chunk_backward
    monkeypatch.setattr(chunk_backward, "_DELTA_HALVES", False)
    delta_launches = []
    launch = chunk_backward.launch_state_pass

    def recording(kernel, delta_kernel, args, flags, delta=None, packed=None):
        delta_launches.append(delta is not None)
        return launch(kernel, delta_kernel, args, flags, delta, packed)
    monkeypatch.setattr(chunk_backward, "launch_state_pass", recording)
    tensors, h0, do, dht = kda_inputs(1, 70, 2, 80, 24, "paper", "uniform", True, True)
    out = grads(chunk_kda, tensors, h0, do, dht, use_qk_l2norm_in_kernel=True)
    ref = grads(naive_recurrent_kda, fp64(tensors), *fp64([h0]), do, dht, use_qk_l2norm_in_kernel=True)
    assert_grads_close(out, ref, NAMES + ["dh0"])
    assert delta_launches == [True]


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_kda_backward_takes_the_forward_scores(packed, monkeypatch):
    # the training forward keeps its query-key scores and its solve's inverse, and the backward launches no
    # scores and no solve of its own; its gradients are those of the backward that computes both again, bit
    # for bit (one sequence, or two packed: each takes its own rows of the kept two)
    from attention_kernels.kda import chunk as kda_chunk
    from attention_kernels.kda import interface
    launches, solves = [], []
    scores, wy = kda_chunk.kda_scores, kda_chunk.kda_wy
    monkeypatch.setattr(kda_chunk, "kda_scores", lambda *a, **kw: launches.append(a[0].shape) or scores(*a, **kw))
    monkeypatch.setattr(kda_chunk, "kda_wy",
                        lambda *a, inverse_computed=False, **kw: solves.append(not inverse_computed) or
                        wy(*a, inverse_computed=inverse_computed, **kw))
    (q, k, v, g, beta), h0, do, dht = kda_inputs(1, 70, 2, 16, 32, "paper", "uniform", True, True)
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device=DEVICE) if packed else None
    h0 = torch.cat([h0, h0.flip(0) + 1]) if packed else h0
    dht = torch.randn_like(h0)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
    o, ht = chunk_kda(*leaves[:5], initial_state=leaves[5], output_final_state=True, use_qk_l2norm_in_kernel=True,
                      cu_seqlens=cu)
    torch.autograd.backward((o, ht), (do, dht))
    # one launch each over every sequence's chunks, packed or not
    assert len(launches) == 1                              # the forward's
    assert solves == [True, False]                         # the backward's W and Ũ from the kept inverse
    again = interface._chunk_kda_bwd(q, k, v, g, beta, 16 ** -0.5, h0, do, dht, True, cu)
    assert len(launches) == 2 and solves[2:] == [True]
    for name, kept, recomputed in zip(NAMES + ["dh0"], [t.grad for t in leaves], again, strict=True):
        assert torch.equal(kept, recomputed), name


def test_kda_backward_refuses_one_of_the_kept_two():
    from attention_kernels.kda import interface
    (q, k, v, g, beta), _, do, _ = kda_inputs(1, 70, 2, 16, 32, "paper", "uniform", False, True)
    Aqk = torch.zeros(1, 70, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="Aqk and inverse together"):
        interface._chunk_kda_bwd(q, k, v, g, beta, 0.25, None, do, None, True, None, Aqk, None)
    with pytest.raises(ValueError, match="inverse"):
        interface._chunk_kda_bwd(q, k, v, g, beta, 0.25, None, do, None, True, None, Aqk, Aqk[..., :32])
    with pytest.raises(TypeError, match="inverse"):
        interface._chunk_kda_bwd(q, k, v, g, beta, 0.25, None, do, None, True, None, Aqk, Aqk.double())


def test_kda_loss_through_the_final_state_only():
    # o takes no gradient: autograd hands the backward None for it
    (q, k, v, g, beta), h0, _, dht = kda_inputs(1, 70, 2, 16, 32, "paper", "uniform", True, True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
    _, ht = chunk_kda(*leaves[:5], initial_state=leaves[5], output_final_state=True, use_qk_l2norm_in_kernel=True)
    got = torch.autograd.grad((ht * dht).sum(), leaves)
    refs = [t.double().requires_grad_() for t in (q, k, v, g, beta, h0)]
    _, ht_ref = naive_recurrent_kda(*refs[:5], initial_state=refs[5], output_final_state=True,
                                    use_qk_l2norm_in_kernel=True)
    want = torch.autograd.grad((ht_ref * dht.double()).sum(), refs, allow_unused=True)
    assert want[0] is None and (got[0] == 0).all()      # q reaches only o
    for name, a, b in zip(NAMES[1:] + ["dh0"], got[1:], want[1:]):
        assert_close(a, b, FP32, name)


def test_kda_loss_through_o_only():
    # no final state asked for: the backward gets no dht
    tensors, _, do, _ = kda_inputs(1, 37, 2, 16, 16, "paper", "uniform", False, True)
    leaves = [t.clone().requires_grad_() for t in tensors]
    o, ht = chunk_kda(*leaves, use_qk_l2norm_in_kernel=True)
    assert ht is None
    got = torch.autograd.grad((o * do).sum(), leaves)
    refs = [t.double().requires_grad_() for t in tensors]
    want = torch.autograd.grad((naive_recurrent_kda(*refs, use_qk_l2norm_in_kernel=True)[0] * do.double()).sum(), refs)
    for name, a, b in zip(NAMES, got, want):
        assert_close(a, b, FP32, name)


@pytest.mark.parametrize("name", ["q", "g", "beta", "initial_state"])
def test_fused_recurrent_kda_refuses_grad(name):
    args = {x: torch.randn(1, 8, 2, 16, device=DEVICE) for x in "qkv"}
    args["g"] = -torch.rand(1, 8, 2, 16, device=DEVICE)
    args["beta"] = torch.rand(1, 8, 2, device=DEVICE)
    args["initial_state"] = torch.randn(1, 2, 16, 16, device=DEVICE)
    args[name] = args[name].requires_grad_()
    with pytest.raises(ValueError, match=f"{name} requires grad.*fused_recurrent_kda.*no backward"):
        fused_recurrent_kda(**args)
    with torch.no_grad():                     # no graph is recorded: nothing to refuse
        fused_recurrent_kda(**args)


# ------------------------------------------------------------------ 16-bit against the same function in fp32
def low_against_fp32(shape, dtype, grad_tol, device=DEVICE):
    # q, k, v rounded to dtype first (g and beta stay fp32), so the comparison measures 16-bit arithmetic
    tensors, h0, _, _ = kda_inputs(*shape, "paper", "uniform", True, True, device=device)
    low = [t.to(dtype) for t in tensors[:3]] + tensors[3:]
    do, dht = torch.randn_like(low[2]), torch.randn_like(h0)
    ref = grads(chunk_kda, [t.float() for t in low], h0, do.float(), dht, use_qk_l2norm_in_kernel=True)
    out = grads(chunk_kda, low, h0, do, dht, use_qk_l2norm_in_kernel=True)
    assert_close(out[0], ref[0], tolerance(dtype), "o")
    assert_close(out[1], ref[1], tolerance(dtype), "final_state")
    for name, a, b in zip(NAMES + ["dh0"], out[2], ref[2], strict=True):
        assert not a.isnan().any(), name
        assert_close(a, b, grad_tol, name)


def test_kda_fp16_gradients():
    low_against_fp32((1, 150, 2, 32, 32), torch.float16, tolerance(torch.float16))


@pytest.mark.gpu
def test_kda_bf16_gradients_gpu():
    low_against_fp32((2, 300, 4, 64, 64), torch.bfloat16, BF16_GRAD, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("V", [128, 96], ids=["V128", "V96-partial-tile"])
def test_kda_walk_in_halves_against_one_tile_gpu(V, monkeypatch):
    # the reverse state pass in key halves (launched at 64 < K <= 128) against the one-tile pass, on the GPU's
    # own config, bf16, K 128, with an initial state and a loss through the final state
    from attention_kernels.linear import chunk_backward
    tensors, h0, do, dht = kda_inputs(1, 300, 4, 128, V, "paper", "uniform", True, True, device="cuda")
    tensors = [t.bfloat16() for t in tensors]
    assert chunk_backward.delta_walk_in_halves(128, torch.device("cuda"))
    halves = grads(chunk_kda, tensors, h0, do.bfloat16(), dht, use_qk_l2norm_in_kernel=True)
    monkeypatch.setattr(chunk_backward, "_DELTA_HALVES", False)
    one_tile = grads(chunk_kda, tensors, h0, do.bfloat16(), dht, use_qk_l2norm_in_kernel=True)
    for name, a, b in zip(NAMES + ["dh0"], halves[2], one_tile[2], strict=True):
        assert_close(a, b, tolerance(torch.bfloat16), name)
