"""flash_attn_func's choice of forward kernel (attention_kernels/flash_attn/interface.py): the Triton forward, or on
an sm_90 GPU the Gluon one (gluon_forward.py) where it measured faster.

On any machine: the rule against its table (`gluon_fwd_loop`, `GLUON_FWD_MEASURED`) at the measured points and
between them; the dispatch on a GPU played as an sm_90 one (the capability query, the interpreter flag and
`Tensor.is_cuda` monkeypatched; no kernel runs), which picks Gluon only where everything holds and the Triton
forward for any other capability, the interpreter, an untested Triton, a Gluon that does not import, inputs the
kernel cannot take and packed sequences; `backend=` forcing either; and the whole autograd path with the Gluon
launch standing in, so the saved (o, lse) it allocates feed the Triton backward. On an sm_90 GPU: flash_attn_func
with the Gluon forward chosen, output and gradients against the fp64 formula.
"""
import pytest
import torch

from attention_kernels.common import DEVICE, INTERPRET, rel_err, tolerance
from attention_kernels.flash_attn import attention_ref, flash_attn_func, interface
from attention_kernels.flash_attn.forward import attention_fwd as triton_forward

D = 128   # the measured head dim


@pytest.mark.parametrize("T, causal, loop", [
    (2048, False, "overlapped"), (4096, False, "overlapped"), (8192, False, "overlapped"), (16384, False, "overlapped"),
    (2048, True, None), (4096, True, "in-order"), (8192, True, "in-order"), (16384, True, "overlapped"),
])
def test_rule_gives_the_table_s_verdict_at_each_measured_point(T, causal, loop):
    """Gluon beat Triton everywhere but causal 2K (341 / 339 against 353 TFLOP/s on the H100); the overlapped loop
    was the faster non-causal at every length and causal at 16K."""
    assert (T, causal) in interface.GLUON_FWD_MEASURED
    assert interface.gluon_fwd_loop(T, T, causal, D) == loop


@pytest.mark.parametrize("T, S, causal, loop", [
    (1, 1, False, "overlapped"), (1, 1, True, None),              # below the shortest: the shortest's verdict
    (4095, 4095, True, None), (4096, 4096, True, "in-order"),     # between points: the point at or below
    (16383, 16383, True, "in-order"), (16384, 16384, True, "overlapped"),
    (131072, 131072, True, "overlapped"),                         # past the longest: the longest's verdict
    (300, 8192, True, None), (8192, 300, True, None), (5000, 9000, True, "in-order"),   # T != S: the shorter
])
def test_rule_between_and_beyond_the_measured_points(T, S, causal, loop):
    assert interface.gluon_fwd_loop(T, S, causal, D) == loop


@pytest.mark.parametrize("head_dim", [32, 64, 256])
def test_rule_keeps_unmeasured_head_dims_on_triton(head_dim):
    assert all(interface.gluon_fwd_loop(8192, 8192, causal, head_dim) is None for causal in (False, True))


def _inputs(T=300, S=300, dtype=torch.float16, head_dim=D, hq=4, hkv=2):
    return (torch.randn(1, T, hq, head_dim, dtype=dtype), *torch.randn(2, 1, S, hkv, head_dim, dtype=dtype))


@pytest.fixture
def sm90(monkeypatch):
    """A CUDA GPU of capability (9, 0) on a Triton the fast paths were measured on, played on the CPU: the
    tensors say they are CUDA tensors and the capability queries (the interface's and the Gluon module's) answer
    `sm90.capability`; no kernel may run."""
    played = {"capability": (9, 0)}
    monkeypatch.setattr(interface, "INTERPRET", False)
    monkeypatch.setattr(interface, "fast_paths_on", lambda: True)   # the suite also runs under the newest Triton
    monkeypatch.setattr(interface, "capability", lambda device: played["capability"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: played["capability"])
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    return played


def test_dispatch_picks_gluon_where_everything_holds(sm90):
    """The positive case the refusals below are measured against: an sm_90 GPU, fp16/bf16, D = 128, a length
    where the table says Gluon."""
    for dtype in (torch.float16, torch.bfloat16):
        q, k, v = _inputs(dtype=dtype)
        assert interface.gluon_misfit(q, k, v) is None
        assert interface.forward_kernel(q, k, v, False, "auto") == "overlapped"
    q, k, v = _inputs(T=5000, S=5000)
    assert interface.forward_kernel(q, k, v, True, "auto") == "in-order"


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (9, 1), (10, 0), (12, 0)])
def test_dispatch_keeps_other_capabilities_on_triton(capability, sm90):
    sm90["capability"] = capability
    q, k, v = _inputs()
    assert "sm_90" in interface.gluon_misfit(q, k, v)
    assert interface.forward_kernel(q, k, v, False, "auto") is None


def test_dispatch_keeps_the_cpu_and_the_interpreter_on_triton(sm90, monkeypatch):
    q, k, v = _inputs()
    monkeypatch.setattr(interface, "INTERPRET", True)
    assert interface.forward_kernel(q, k, v, False, "auto") is None
    monkeypatch.setattr(interface, "INTERPRET", False)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: False))
    assert interface.forward_kernel(q, k, v, False, "auto") is None


def test_dispatch_on_this_machine_is_triton():
    """No stand-ins: on the CPU (the interpreter) the rule's Gluon cases run the Triton forward."""
    if not INTERPRET:
        pytest.skip("a GPU machine: the stand-ins of the other tests play its cases")
    q, k, v = _inputs()
    assert interface.gluon_fwd_loop(300, 300, False, D) == "overlapped"
    assert interface.forward_kernel(q, k, v, False, "auto") is None


def test_dispatch_keeps_an_untested_or_gluon_less_triton_on_triton(sm90, monkeypatch):
    q, k, v = _inputs()
    monkeypatch.setattr(interface, "fast_paths_on", lambda: False)
    assert "measured on Triton" in interface.gluon_misfit(q, k, v)
    assert interface.forward_kernel(q, k, v, False, "auto") is None
    monkeypatch.setattr(interface, "fast_paths_on", lambda: True)
    monkeypatch.setattr(interface, "_gluon_forward", lambda: None)
    assert "does not import" in interface.gluon_misfit(q, k, v)
    assert interface.forward_kernel(q, k, v, False, "auto") is None


@pytest.mark.parametrize("inputs, why", [
    (lambda: _inputs(dtype=torch.float32), "bf16 or fp16"),
    (lambda: _inputs(head_dim=256), "head dim"),
    (lambda: (torch.randn(1, 300, 4, 2 * D).half()[..., ::2], *_inputs()[1:]), "contiguous"),
    (lambda: (torch.empty(1 * 300 * 4 * D + 1, dtype=torch.float16)[1:].view(1, 300, 4, D), *_inputs()[1:]),
     "aligned"),
], ids=["fp32", "D256", "strided", "unaligned"])
def test_dispatch_keeps_misfits_on_triton(inputs, why, sm90):
    q, k, v = inputs()
    assert interface.gluon_misfit(q, k, v) is not None
    assert interface.forward_kernel(q, k, v, False, "auto") is None
    with pytest.raises(ValueError, match=f"backend='gluon' does not apply here: .*({why})"):
        interface.forward_kernel(q, k, v, False, "gluon")


@pytest.fixture
def launches(monkeypatch):
    """Stand-ins for the two forward launchers, recording which ran (and the Gluon loop); no kernel runs."""
    ran = []

    def triton(q, k, v, causal, scale, cu_seqlens_q=None, cu_seqlens_k=None):
        ran.append("triton")
        *batch, T, HQ, _ = q.shape
        return torch.zeros_like(q), torch.zeros(*batch, HQ, T)

    loops = {interface._gluon_forward().IN_ORDER.value: "gluon in-order",
             interface._gluon_forward().OVERLAPPED.value: "gluon overlapped"}

    def gluon(q, k, v, causal, scale, schedule):
        ran.append(loops[schedule])
        return torch.zeros_like(q), torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    monkeypatch.setattr(interface, "triton_attention_fwd", triton)
    monkeypatch.setattr(interface._gluon_forward(), "launch_gluon", gluon)
    return ran


def test_packed_sequences_stay_on_triton(sm90, launches):
    """flash_attn_varlen_func's forward is the Triton one even where its dense shape would take Gluon."""
    q, k, v = (t[0] for t in _inputs())
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    interface.attention_fwd(q, k, v, False, D ** -0.5, cu, cu)
    interface.attention_fwd(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), False, D ** -0.5)   # dense: Gluon
    assert launches == ["triton", "gluon overlapped"]


@pytest.mark.parametrize("backend, causal, T, ran", [
    ("auto", False, 300, "gluon overlapped"), ("auto", True, 300, "triton"), ("auto", True, 5000, "gluon in-order"),
    ("triton", False, 300, "triton"), ("gluon", True, 300, "gluon in-order"), ("gluon", False, 300, "gluon overlapped"),
])
def test_backend_forces_either_forward(backend, causal, T, ran, sm90, launches):
    """backend="triton" runs Triton where the rule says Gluon; backend="gluon" runs Gluon where it says Triton
    (with the in-order loop, the faster Gluon loop there), the rule's loop elsewhere."""
    q, k, v = _inputs(T=T, S=T)
    interface.attention_fwd(q, k, v, causal, D ** -0.5, backend=backend)
    assert launches == [ran]


def test_backend_is_checked_by_name():
    q, k, v = _inputs(dtype=torch.float32, head_dim=32)
    with pytest.raises(ValueError, match="^backend must be one of 'auto', 'triton', 'gluon', got 'cudnn'"):
        flash_attn_func(q, k, v, backend="cudnn")


def test_forcing_gluon_off_sm90_says_why():
    if not INTERPRET and interface.capability(torch.device(DEVICE)) == (9, 0):
        pytest.skip("this GPU runs the Gluon forward")
    q, k, v = (t.to(DEVICE) for t in _inputs(dtype=torch.float16))
    with pytest.raises(ValueError, match="^backend='gluon' does not apply here: it runs on an sm_90 GPU"):
        flash_attn_func(q, k, v, backend="gluon")


@pytest.mark.skipif(not INTERPRET, reason="plays a Hopper on the CPU; on a GPU, test_gpu_* runs the kernel")
@pytest.mark.parametrize("causal, backend, overlap", [(False, "auto", True), (True, "gluon", False)],
                         ids=["full-auto", "causal-forced"])
def test_autograd_path_through_the_gluon_launch(causal, backend, overlap, monkeypatch):
    """flash_attn_func with inputs that require grad, the dispatch choosing Gluon (its misfit answered None) and
    the Gluon kernel's launch standing in (it fills the o and lse that `launch_gluon` allocated with the Triton
    forward's values): no refusal of inputs that require grad, the backward reads the saved o and lse, and
    output and gradients match the fp64 formula. Also asserts what `launch_gluon` allocates is what the Triton
    forward returns (shape, dtype, contiguity)."""
    from attention_kernels.flash_attn import gluon_forward

    launched = []

    def kernel(kernel, grid, key, args, constexprs, **options):
        q, k, v, o, lse, scale_log2, *_ = args
        o_t, lse_t = triton_forward(q, k, v, constexprs["CAUSAL"], scale, None, None)
        for mine, theirs in ((o, o_t), (lse, lse_t)):
            assert (mine.shape, mine.dtype, mine.stride()) == (theirs.shape, theirs.dtype, theirs.stride())
        o.copy_(o_t), lse.copy_(lse_t)
        launched.append(constexprs["SCHEDULE"] == gluon_forward.OVERLAPPED.value)

    monkeypatch.setattr(interface, "gluon_misfit", lambda q, k, v: None)
    monkeypatch.setattr(gluon_forward, "launch_direct", kernel)
    T, S, scale = 67, 90, 0.2
    mk = lambda *shape: torch.randn(*shape).half().requires_grad_()   # noqa: E731
    q, k, v = mk(2, T, 4, D), mk(2, S, 2, D), mk(2, S, 2, D)
    o = flash_attn_func(q, k, v, causal=causal, softmax_scale=scale, backend=backend)
    assert launched == [overlap] and o.grad_fn is not None   # the rule's loop; forced at a short causal T: in-order
    g = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), g)
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attention_ref(qr, kr, vr, causal=causal, softmax_scale=scale, compute_dtype=torch.float64)
    refs = (ref, *torch.autograd.grad(ref, (qr, kr, vr), g.double()))
    fwd_tol = tolerance(torch.float16, tf32_dots=True)
    for name, out, want, tol in zip(("o", "dq", "dk", "dv"), (o, *grads), refs, (fwd_tol, *[3 * fwd_tol] * 3)):
        assert not torch.isnan(out).any(), f"{name} has NaN"
        assert rel_err(out, want) <= tol, f"{name}: relative error {rel_err(out, want):.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("T, S, causal, loop", [(1000, 1000, False, "overlapped"), (4100, 4100, True, "in-order"),
                                                (300, 77, False, "overlapped")],
                         ids=["full-1000", "causal-4100", "full-T>S"])
def test_gpu_flash_attn_func_through_gluon_matches_reference(T, S, causal, loop):
    """On an sm_90 GPU the dispatch chooses the Gluon forward for these bf16 D = 128 shapes (GQA 8/2); output and
    the Triton backward's gradients from it against attention_ref in fp64."""
    if not torch.cuda.is_available() or interface.capability(torch.device("cuda")) != (9, 0):
        pytest.skip("the Gluon forward is dispatched on sm_90 GPUs only")
    mk = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)   # noqa: E731
    q, k, v = mk(1, T, 8, D), mk(1, S, 2, D), mk(1, S, 2, D)
    assert interface.forward_kernel(q.detach(), k.detach(), v.detach(), causal, "auto") == loop
    o = flash_attn_func(q, k, v, causal=causal)
    g = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), g)
    with torch.no_grad():
        assert torch.equal(flash_attn_func(q, k, v, causal=causal), o)   # the inference path takes the same kernel
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attention_ref(qr, kr, vr, causal=causal, compute_dtype=torch.float64)
    refs = (ref, *torch.autograd.grad(ref, (qr, kr, vr), g.double()))
    fwd_tol = tolerance(torch.bfloat16, tf32_dots=True)
    for name, out, want, tol in zip(("o", "dq", "dk", "dv"), (o, *grads), refs, (fwd_tol, *[3 * fwd_tol] * 3)):
        assert not torch.isnan(out).any(), f"{name} has NaN"
        assert rel_err(out, want) <= tol, f"{name}: relative error {rel_err(out, want):.2e}"
