"""chunk_kda and fused_recurrent_kda take fla's call (fla.ops.kda) as Kimi Linear's layer makes it.

fla's names, positions and defaults; each gate option (use_gate_in_kernel with A_log and dt_bias, its
lower_bound form, use_beta_sigmoid_in_kernel, allow_neg_eigval) against the same math written out here
in PyTorch and then the plain call; the gradients to A_log, dt_bias, the raw gate and the beta logits
against autograd through the fp64 loop; safe_gate (a promise that changes nothing here) and
state_v_first; every option these kernels do not have refused by name. CPU (interpreter): fp32, small
shapes.
"""
import inspect
import math

import pytest
import torch

from attention_kernels.common import DEVICE, assert_close
from attention_kernels.kda import chunk_kda, fused_recurrent_kda, naive_recurrent_kda
from test_linear_backward import FP32

# fla.ops.kda's signatures (fla/ops/kda/chunk.py, fla/ops/kda/fused_recurrent.py): the positional part,
# in order; chunk_kda reads A_log and dt_bias (and chunk_size) from its **kwargs, here keyword-only.
FLA_CHUNK = ["q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel",
             "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "safe_gate", "lower_bound",
             "disable_recompute", "return_intermediate_states", "state_v_first", "cu_seqlens", "cu_seqlens_cpu",
             "cp_context"]
FLA_RECURRENT = ["q", "k", "v", "g", "beta", "A_log", "dt_bias", "scale", "initial_state", "output_final_state",
                 "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval",
                 "lower_bound", "state_v_first", "cu_seqlens"]
FORMS = {"chunk": chunk_kda, "recurrent": fused_recurrent_kda}


def test_fla_names_positions_and_defaults():
    for fn, names in ((chunk_kda, FLA_CHUNK), (fused_recurrent_kda, FLA_RECURRENT)):
        params = inspect.signature(fn).parameters
        positional = [n for n, p in params.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
        assert positional == names
        defaults = {n: p.default for n, p in params.items() if p.default is not p.empty}
        assert all(defaults[n] is False for n in names if n.startswith(("use_", "allow_", "safe_", "output_",
                                                                         "disable_", "return_", "state_")))
        assert all(defaults[n] is None for n in ("scale", "initial_state", "lower_bound", "cu_seqlens")
                   if n in names)
    keyword_only = {n: p.default for n, p in inspect.signature(chunk_kda).parameters.items()
                    if p.kind == p.KEYWORD_ONLY}
    assert keyword_only == {"A_log": None, "dt_bias": None, "chunk_size": 64}


def kimi_inputs(B=1, T=70, H=2, K=16, V=32, device=DEVICE):
    """q, k, v, the raw gate, the beta logits, A_log, dt_bias, h0 as Kimi Linear's layer makes them (A_log
    = log of U(1, 16), dt_bias the inverse softplus of U(1e-3, 0.1), fp32)."""
    q, k, g_raw = (torch.randn(B, T, H, K, device=device) for _ in range(3))
    v = torch.randn(B, T, H, V, device=device)
    beta_logits = torch.randn(B, T, H, device=device)
    A_log = torch.empty(H, device=device).uniform_(1, 16).log()
    dt = torch.empty(H * K, device=device).uniform_(1e-3, 0.1)
    dt_bias = dt + torch.log(-torch.expm1(-dt))
    h0 = torch.randn(B, H, K, V, device=device)
    return q, k, v, g_raw, beta_logits, A_log, dt_bias, h0


def gate_by_hand(g_raw, A_log, dt_bias, lower_bound=None):
    """fla's two gates, written out: -exp(A_log) softplus(g + dt_bias); lower_bound sigmoid(exp(A_log) (g +
    dt_bias)), A_log optional there."""
    H, K = g_raw.shape[-2:]
    x = g_raw + dt_bias.view(H, K)
    if lower_bound is None:
        return -torch.exp(A_log).view(H, 1) * torch.log1p(torch.exp(x))
    rate = 1 if A_log is None else torch.exp(A_log).view(H, 1)
    return lower_bound / (1 + torch.exp(-rate * x))


GATES = {"softplus": {}, "lower_bound": {"lower_bound": -5.0}, "lower_bound-no-A_log": {"lower_bound": -3.0}}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("gate", GATES)
def test_gate_in_kernel_is_the_plain_call_on_the_gate(form, gate):
    q, k, v, g_raw, beta_logits, A_log, dt_bias, h0 = kimi_inputs(T=37)
    A_log = None if gate.endswith("no-A_log") else A_log
    beta = torch.sigmoid(beta_logits)
    fn = FORMS[form]
    got = fn(q, k, v, g_raw, beta, A_log=A_log, dt_bias=dt_bias, initial_state=h0, output_final_state=True,
             use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, **GATES[gate])
    g = gate_by_hand(g_raw, A_log, dt_bias, GATES[gate].get("lower_bound"))
    want = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert_close(got[0], want[0], FP32, "o")
    assert_close(got[1], want[1], FP32, "final_state")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("allow_neg_eigval", [False, True], ids=["beta01", "beta02"])
def test_beta_sigmoid_in_kernel_is_the_plain_call_on_the_strength(form, allow_neg_eigval):
    q, k, v, g_raw, beta_logits, A_log, dt_bias, h0 = kimi_inputs(T=37)
    g = gate_by_hand(g_raw, A_log, dt_bias)
    fn = FORMS[form]
    got = fn(q, k, v, g, beta_logits, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
             use_beta_sigmoid_in_kernel=True, allow_neg_eigval=allow_neg_eigval)
    beta = (2 if allow_neg_eigval else 1) / (1 + torch.exp(-beta_logits))
    want = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert_close(got[0], want[0], FP32, "o")
    assert_close(got[1], want[1], FP32, "final_state")


@pytest.mark.parametrize("form", FORMS)
def test_kimi_call_state_v_first_and_safe_gate(form):
    # Kimi Linear's whole call: the state as [B, H, V, K]; safe_gate changes nothing here
    q, k, v, g_raw, beta_logits, A_log, dt_bias, h0 = kimi_inputs(T=37)
    fn = FORMS[form]
    extra = {"safe_gate": True} if form == "chunk" else {}
    o, ht = fn(q, k, v, g_raw, beta_logits, A_log=A_log, dt_bias=dt_bias, initial_state=h0.transpose(-1, -2),
               output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
               use_beta_sigmoid_in_kernel=True, lower_bound=-5.0, state_v_first=True, **extra)
    o_ref, ht_ref = fn(q, k, v, gate_by_hand(g_raw, A_log, dt_bias, -5.0), torch.sigmoid(beta_logits),
                       initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert ht.shape == h0.transpose(-1, -2).shape
    assert_close(o, o_ref, FP32, "o")
    assert_close(ht, ht_ref.transpose(-1, -2), FP32, "final_state")


def test_gate_options_on_packed_sequences():
    q, k, v, g_raw, beta_logits, A_log, dt_bias, _ = kimi_inputs(T=90)
    cu_seqlens = torch.tensor([0, 37, 90], dtype=torch.int32, device=DEVICE)
    options = dict(use_qk_l2norm_in_kernel=True, output_final_state=True, cu_seqlens=cu_seqlens)
    got = chunk_kda(q, k, v, g_raw, beta_logits, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                    use_beta_sigmoid_in_kernel=True, **options)
    want = chunk_kda(q, k, v, gate_by_hand(g_raw, A_log, dt_bias), torch.sigmoid(beta_logits), **options)
    assert_close(got[0], want[0], FP32, "o")
    assert_close(got[1], want[1], FP32, "final_state")


def _kimi_loss(fn, leaves, do, dht, lower_bound, fp64_gate):
    """sum(o·do) + sum(final·dht) through fn, the gate and beta from the raw leaves (q, k, v, raw gate,
    beta logits, A_log, dt_bias, h0); fp64_gate: compute them here by hand (the reference) rather than in
    chunk_kda."""
    q, k, v, g_raw, beta_logits, A_log, dt_bias, h0 = leaves
    common = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    if fp64_gate:
        o, ht = fn(q, k, v, gate_by_hand(g_raw, A_log, dt_bias, lower_bound), 2 * torch.sigmoid(beta_logits), **common)
    else:
        o, ht = fn(q, k, v, g_raw, beta_logits, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                   use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, lower_bound=lower_bound, **common)
    return (o.double() * do.double()).sum() + (ht.double() * dht.double()).sum()


@pytest.mark.parametrize("lower_bound", [None, -5.0], ids=["softplus", "lower_bound"])
def test_gradients_reach_A_log_dt_bias_raw_gate_and_beta_logits(lower_bound):
    inputs = kimi_inputs(B=1, T=70, H=2, K=16, V=32)
    do, dht = torch.randn_like(inputs[2]), torch.randn_like(inputs[7])
    leaves = [t.clone().requires_grad_() for t in inputs]
    got = torch.autograd.grad(_kimi_loss(chunk_kda, leaves, do, dht, lower_bound, False), leaves)
    refs = [t.double().requires_grad_() for t in inputs]
    want = torch.autograd.grad(_kimi_loss(naive_recurrent_kda, refs, do, dht, lower_bound, True), refs)
    names = ["dq", "dk", "dv", "dg_raw", "dbeta_logits", "dA_log", "ddt_bias", "dh0"]
    for name, a, b in zip(names, got, want, strict=True):
        assert a.shape == b.shape and a.abs().sum() > 0, name
        # A_log's and dt_bias's gradients sum fp32 terms of both signs over every token (and channel): their
        # rounding, relative to the sum, grows with the cancellation (2.5e-5 seen for A_log at T = 70)
        assert_close(a, b, 1e-4 if name in ("dA_log", "ddt_bias") else FP32, name)


REFUSED = [  # (form, keyword arguments, the message)
    ("chunk", {"use_gate_in_kernel": True, "safe_gate": True}, "safe_gate=True.*needs lower_bound"),
    ("chunk", {"use_gate_in_kernel": True, "safe_gate": True, "lower_bound": -6.0}, r"lower_bound.*\[-5, 0\)"),
    ("chunk", {"lower_bound": 0.5}, "lower_bound must be a finite log decay below 0"),
    ("chunk", {"allow_neg_eigval": True}, "allow_neg_eigval.*use_beta_sigmoid_in_kernel=True"),
    ("recurrent", {"allow_neg_eigval": True}, "allow_neg_eigval.*use_beta_sigmoid_in_kernel=True"),
    ("chunk", {"A_log": "A_log"}, "A_log is read only with use_gate_in_kernel=True"),
    ("recurrent", {"dt_bias": "dt_bias"}, "dt_bias is read only with use_gate_in_kernel=True"),
    ("chunk", {"use_gate_in_kernel": True}, "use_gate_in_kernel=True needs A_log"),
    ("chunk", {"use_gate_in_kernel": True, "A_log": "wrong A_log"}, r"A_log must hold H = 2 values"),
    ("chunk", {"use_gate_in_kernel": True, "A_log": "A_log", "dt_bias": "wrong dt_bias"},
     r"dt_bias must hold H \* K = 32 values"),
    ("chunk", {"disable_recompute": True}, "disable_recompute must be False"),
    ("chunk", {"return_intermediate_states": True}, "return_intermediate_states must be False"),
    ("chunk", {"cu_seqlens_cpu": "cu_seqlens"}, "cu_seqlens_cpu must be None"),
    ("chunk", {"cp_context": object()}, "cp_context must be None"),
    ("chunk", {"chunk_size": 32}, "chunk_size must be 64"),
]


@pytest.mark.parametrize("form, kwargs, message", REFUSED, ids=[f"{f}-{'-'.join(kw)}" for f, kw, _ in REFUSED])
def test_refused_by_name(form, kwargs, message):
    q, k, v, g_raw, beta_logits, A_log, dt_bias, _ = kimi_inputs(T=8)
    named = {"A_log": A_log, "dt_bias": dt_bias, "wrong A_log": A_log.repeat(2), "wrong dt_bias": dt_bias[:-1],
             "cu_seqlens": torch.tensor([0, 8], dtype=torch.int32)}
    kwargs = {n: named.get(x, x) if isinstance(x, str) else x for n, x in kwargs.items()}
    with pytest.raises(ValueError, match=message):
        FORMS[form](q, k, v, g_raw, beta_logits, **kwargs)


def test_lower_bound_type_refused():
    q, k, v, g_raw, beta_logits, A_log, dt_bias, _ = kimi_inputs(T=8)
    with pytest.raises(TypeError, match="lower_bound must be a float"):
        chunk_kda(q, k, v, g_raw, beta_logits, use_gate_in_kernel=True, A_log=A_log, lower_bound="-5")


@pytest.mark.parametrize("name", ["A_log", "dt_bias", "g"])
def test_fused_recurrent_refuses_a_gate_parameter_that_requires_grad(name):
    q, k, v, g_raw, beta_logits, A_log, dt_bias, _ = kimi_inputs(T=8)
    args = {"g": g_raw, "A_log": A_log, "dt_bias": dt_bias}
    args[name] = args[name].requires_grad_()
    with pytest.raises(ValueError, match=f"{name} requires grad.*fused_recurrent_kda.*no backward"):
        fused_recurrent_kda(q, k, v, args["g"], beta_logits, args["A_log"], args["dt_bias"], use_gate_in_kernel=True,
                            use_beta_sigmoid_in_kernel=True)
    with torch.no_grad():                     # the decode step in a model: nothing to refuse
        o, _ = fused_recurrent_kda(q, k, v, args["g"], beta_logits, args["A_log"], args["dt_bias"],
                                   use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    assert not o.isnan().any() and math.isfinite(o.abs().max().item())
