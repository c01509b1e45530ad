"""The linear-attention machinery (attention_kernels.linear) on its own: the input check, the in-chunk
cumulative gates, the state pass and the output assembly, with a gate per key channel (GLA) and a
gate per head ([B, T, H, 1], the form Lightning and Mamba-2 will pass), against loops over time.

Tolerances come from attention_kernels.common.tolerance: fp32 inputs multiply in IEEE fp32 on every machine.
"""
import math

import pytest
import torch

from attention_kernels.common import DEVICE, assert_close, tolerance
from attention_kernels.linear import (CHUNK, GATE_FLOOR, check_linear_inputs, chunk_local_cumsum, chunk_output,
                            chunk_state_pass)

FP32 = tolerance(torch.float32)


def _inputs(B, T, H, K, V, G):
    q, k = (torch.randn(B, T, H, K, device=DEVICE) for _ in range(2))
    v = torch.randn(B, T, H, V, device=DEVICE)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, G, device=DEVICE)) / 8
    return q, k, v, g


def _cumsum_ref(g):
    """In-chunk cumulative sums of the gates raised to GATE_FLOOR, in float64."""
    T = g.shape[1]
    chunks = g.double().clamp(min=GATE_FLOOR).split(CHUNK, dim=1)
    return torch.cat([c.cumsum(1) for c in chunks], dim=1)[:, :T]


def _states_ref(k, v, g, h0):
    """The state before each chunk and after the last, by the recurrence one token at a time (fp64)."""
    B, T, H, K = k.shape
    S = h0.double().clone()
    starts = []
    for t in range(T):
        if t % CHUNK == 0:
            starts.append(S.clone())
        S = g[:, t].double().exp().unsqueeze(-1).expand(B, H, K, 1) * S + \
            k[:, t].double().unsqueeze(-1) * v[:, t].double().unsqueeze(-2)
    return torch.stack(starts, dim=1), S


@pytest.mark.parametrize("G", ["K", 1], ids=["per-channel", "per-head"])
def test_cumsum(G):
    B, T, H, K = 2, 150, 3, 40
    g = _inputs(B, T, H, K, 8, K if G == "K" else 1)[3]
    g[:, 70, 0] = -math.inf                   # a reset: raised to the floor, the sums stay finite
    g[:, 3, 2] = -1e30                        # a finite gate below the floor: the same
    b = torch.empty(g.shape, dtype=torch.float32, device=DEVICE)
    chunk_local_cumsum(g, b)
    assert torch.isfinite(b).all()
    assert_close(b, _cumsum_ref(g), FP32, "b")


def test_cumsum_keeps_nan():
    """A NaN gate is not a reset: it stays NaN (and so does the rest of its chunk's sum)."""
    g = _inputs(1, 80, 1, 16, 8, 16)[3]
    g[:, 10, 0, 3] = math.nan
    b = torch.empty(g.shape, dtype=torch.float32, device=DEVICE)
    chunk_local_cumsum(g, b)
    assert torch.isnan(b[:, 10:CHUNK, 0, 3]).all()
    assert torch.isfinite(b[:, :10]).all() and torch.isfinite(b[:, CHUNK:]).all()


@pytest.mark.parametrize("G", ["K", 1], ids=["per-channel", "per-head"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_state_pass(G, dtype):
    B, T, H, K, V = 2, 140, 2, 40, 24
    q, k, v, g = _inputs(B, T, H, K, V, K if G == "K" else 1)
    k, v = k.to(dtype), v.to(dtype)
    h0 = torch.randn(B, H, K, V, device=DEVICE)
    b = torch.empty(g.shape, dtype=torch.float32, device=DEVICE)
    chunk_local_cumsum(g, b)
    states = torch.empty(B, math.ceil(T / CHUNK), H, K, V, dtype=dtype, device=DEVICE)
    final = torch.empty(B, H, K, V, device=DEVICE)
    chunk_state_pass(k, v, b, states, h0, final)
    starts, last = _states_ref(k, v, g, h0)
    assert_close(states, starts, tolerance(dtype), "states at the chunk starts")
    assert_close(final, last, tolerance(dtype), "final state")
    chunk_state_pass(k, v, b, states)          # no initial state: zeros
    assert torch.count_nonzero(states[:, 0]) == 0


def test_a_gate_per_head_through_the_shared_pieces():
    """A family with one gate per head (Lightning, Mamba-2) computes its own scores
    A_tj = scale · q_t·k_j · e^{b_t - b_j} and reuses the rest: equal to GLA's recurrence with that
    gate on every key channel."""
    B, T, H, K, V, scale = 1, 100, 2, 32, 16, 0.3
    q, k, v, g = _inputs(B, T, H, K, V, 1)
    b = torch.empty(g.shape, dtype=torch.float32, device=DEVICE)
    chunk_local_cumsum(g, b)
    NT = math.ceil(T / CHUNK)
    states = torch.empty(B, NT, H, K, V, device=DEVICE)
    chunk_state_pass(k, v, b, states)
    A = torch.zeros(B, T, H, CHUNK, device=DEVICE)
    for c in range(NT):
        rows = slice(c * CHUNK, min(T, (c + 1) * CHUNK))
        n = rows.stop - rows.start
        scores = torch.einsum("bthk,bshk->bhts", q[:, rows], k[:, rows]) * scale
        decay = (b[:, rows, :, 0].transpose(1, 2)[..., :, None] - b[:, rows, :, 0].transpose(1, 2)[..., None, :])
        causal = torch.ones(n, n, dtype=torch.bool, device=DEVICE).tril()
        A[:, rows, :, :n] = torch.where(causal, scores * decay.clamp(max=0).exp(), 0.0).transpose(1, 2)
    o = torch.empty_like(v)
    chunk_output(q, v, b, states, A, o, scale)

    S = torch.zeros(B, H, K, V, dtype=torch.float64, device=DEVICE)
    o_ref = torch.empty(B, T, H, V, dtype=torch.float64, device=DEVICE)
    for t in range(T):
        S = g[:, t].double().exp().unsqueeze(-1) * S + k[:, t].double().unsqueeze(-1) * v[:, t].double().unsqueeze(-2)
        o_ref[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t].double() * scale, S)
    assert_close(o, o_ref, FP32, "o")


# ------------------------------------------------------------------ the shared input check
def _args(B=2, T=5, H=3, K=8, V=4):
    return tuple(torch.randn(B, T, H, d, device=DEVICE) for d in (K, K, V))


def test_check_returns_the_sizes_and_the_scale():
    q, k, v = _args()
    dt = torch.rand(2, 5, 3, device=DEVICE)
    assert check_linear_inputs(q, k, v, {"dt": (dt, "B T H")}) == (2, 5, 3, 8, 4, 8 ** -0.5)
    assert check_linear_inputs(q, k, v, {}, scale=2)[-1] == 2.0


def test_check_names_a_gate_of_the_wrong_shape():
    q, k, v = _args()
    with pytest.raises(ValueError, match=r"dt must be \[B, T, H\] = \[2, 5, 3\], got \[2, 5, 4\]"):
        check_linear_inputs(q, k, v, {"dt": (torch.rand(2, 5, 4, device=DEVICE), "B T H")})
    with pytest.raises(ValueError, match="A must have 1 dims"):
        check_linear_inputs(q, k, v, {"A": (torch.rand(3, 1, device=DEVICE), "H")})


def test_check_step_and_reference_forms():
    q, k, v = (x[:, 0] for x in _args())
    state = torch.zeros(2, 3, 8, 4, dtype=torch.float64, device=DEVICE)
    assert check_linear_inputs(q, k, v, {}, None, state, kernel=False, step=True)[:5] == (2, 1, 3, 8, 4)
    with pytest.raises(TypeError, match="initial_state has dtype float64; supported: float32"):
        check_linear_inputs(*_args(), {}, None, state)


VALID_CALLS = {
    "kernel": lambda q, k, v: dict(gates={"gk": (torch.rand_like(k), "B T H K")}, initial_state=torch.zeros(
        q.shape[0], q.shape[2], q.shape[3], v.shape[3], device=DEVICE), output_final_state=True, kernel=True),
    "kernel-scale": lambda q, k, v: dict(gates={}, scale=0.7, kernel=True),
    "kernel-gate-per-head": lambda q, k, v: dict(gates={"dt": (torch.rand(q.shape[:3], device=DEVICE), "B T H")},
                                                 kernel=True),
    "reference-fp64": lambda q, k, v: dict(gates={}, initial_state=torch.zeros(
        q.shape[0], q.shape[2], q.shape[3], v.shape[3], dtype=torch.float64, device=DEVICE), kernel=False),
}


def _verdict(check, q, k, v, kw):
    """What `check` says of a call: its result, or the exception's type and message."""
    try:
        return check(q, k, v, **kw)
    except (TypeError, ValueError) as e:
        return type(e), str(e)


INVALID_CALLS = {  # a valid call's name, and how it is changed
    "gate-dtype": ("kernel", lambda kw: kw["gates"].update(gk=(kw["gates"]["gk"][0].int(), "B T H K"))),
    "gate-shape": ("kernel", lambda kw: kw["gates"].update(gk=(kw["gates"]["gk"][0][..., :4], "B T H K"))),
    "gate-letters": ("kernel", lambda kw: kw["gates"].update(gk=(kw["gates"]["gk"][0], "B T H V"))),
    "state-fp64": ("kernel", lambda kw: kw.update(initial_state=kw["initial_state"].double())),
    "state-shape": ("kernel", lambda kw: kw.update(initial_state=kw["initial_state"][:1])),
    "output_final_state-int": ("kernel", lambda kw: kw.update(output_final_state=1)),
    "scale-bool": ("kernel-scale", lambda kw: kw.update(scale=True)),
    "scale-zero": ("kernel-scale", lambda kw: kw.update(scale=0.0)),
    "scale-int": ("kernel-scale", lambda kw: kw.update(scale=2)),   # valid: 2.0
    "gate-meta": ("reference-fp64", lambda kw: kw["gates"].update(g=(torch.zeros(1, device="meta"), "H"))),
    "fp64-in-a-kernel": ("reference-fp64", lambda kw: kw.update(kernel=True)),
}


@pytest.mark.parametrize("call", list(VALID_CALLS) + list(INVALID_CALLS))
def test_the_kept_verdicts_are_the_checks(call):
    """check_linear_inputs keeps its verdict per call signature (a decode step asks the same question every step):
    for valid calls and invalid ones, the first time and again, it says what the checks say when they run in
    full."""
    valid, change = INVALID_CALLS.get(call, (call, None))
    for _ in range(2):
        q, k, v = _args()
        kw = VALID_CALLS[valid](q, k, v)
        if change is not None:
            change(kw)
        want = _verdict(check_linear_inputs.__wrapped__, q, k, v, kw)
        assert _verdict(check_linear_inputs, q, k, v, kw) == want
        assert isinstance(want, tuple) and (len(want) == 6) == (change is None or call == "scale-int")


def test_a_changed_signature_is_checked_again():
    """A call like a valid one but for a dtype, a shape or requires_grad is checked again (and refused where the
    checks refuse it)."""
    q, k, v = _args()
    check_linear_inputs(q, k, v, {}, kernel=False)
    with pytest.raises(TypeError, match="k has dtype int32"):
        check_linear_inputs(q, k.int(), v, {}, kernel=False)
    with pytest.raises(ValueError, match="v must be"):
        check_linear_inputs(q, k, v[:, :2], {}, kernel=False)
    assert check_linear_inputs(q.requires_grad_(), k, v, {}, kernel=False) == check_linear_inputs(q, k, v, {},
                                                                                                    kernel=False)
