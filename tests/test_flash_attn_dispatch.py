"""flash_attn_func's choice of kernels (attention_kernels/flash_attn/interface.py): the Triton forward and backward,
or on an sm_90 GPU the Gluon forward (gluon_forward.py) and the Gluon dK/dV backward (gluon_backward.py, its dQ
from the Triton pass or the Gluon kernel) where they measured faster.

On any machine: the rules against their tables (`gluon_fwd_loop`, `GLUON_FWD_MEASURED`; `gluon_bwd_form`,
`GLUON_BWD_MEASURED`: three backward forms) at the measured points and between them; the dispatch on a GPU played as
an sm_90 one (the capability query, the interpreter flag and `Tensor.is_cuda` monkeypatched; no kernel runs), which
picks Gluon only where everything holds and Triton for any other capability, the interpreter, an untested Triton, a
Gluon that does not import, inputs the kernel cannot take and packed sequences; `backend=` forcing either, forward
and backward; and the whole autograd path with the Gluon launches standing in, so the saved (o, lse) the Gluon
forward allocates feed either backward. On an sm_90 GPU: flash_attn_func with the Gluon kernels chosen, output and
gradients against the fp64 formula.
"""
import pytest
import torch

from attention_kernels.common import DEVICE, INTERPRET, rel_err, tolerance
from attention_kernels.flash_attn import attention_ref, flash_attn_func, interface
from attention_kernels.flash_attn.forward import attention_fwd as triton_forward

D = 128   # the measured head dim


@pytest.mark.parametrize("T, causal, loop", [
    (2048, False, "ping-pong"), (4096, False, "ping-pong"), (8192, False, "ping-pong"), (16384, False, "ping-pong"),
    (2048, True, None), (4096, True, "ping-pong"), (8192, True, "ping-pong"), (16384, True, "ping-pong"),
])
def test_rule_gives_the_table_s_verdict_at_each_measured_point(T, causal, loop):
    """Gluon beat Triton everywhere but causal 2K (351 for the fastest loop, ping-pong, against 356 TFLOP/s on the
    H200); the ping-pong loop was the fastest of the three at every other point."""
    assert (T, causal) in interface.GLUON_FWD_MEASURED
    assert interface.gluon_fwd_loop(T, T, causal, D) == loop


@pytest.mark.parametrize("T, S, causal, loop", [
    (1, 1, False, "ping-pong"), (1, 1, True, None),               # below the shortest: the shortest's verdict
    (4095, 4095, True, None), (4096, 4096, True, "ping-pong"),    # between points: the point at or below
    (16383, 16383, True, "ping-pong"), (131072, 131072, True, "ping-pong"),   # past the longest: the longest's
    (300, 8192, True, None), (8192, 300, True, None), (5000, 9000, True, "ping-pong"),   # T != S: the shorter
])
def test_rule_between_and_beyond_the_measured_points(T, S, causal, loop):
    assert interface.gluon_fwd_loop(T, S, causal, D) == loop


@pytest.mark.parametrize("head_dim", [32, 64, 256])
def test_rule_keeps_unmeasured_head_dims_on_triton(head_dim):
    assert all(interface.gluon_fwd_loop(8192, 8192, causal, head_dim) is None for causal in (False, True))
    assert all(interface.gluon_bwd_form(8192, 8192, causal, head_dim) is None for causal in (False, True))


@pytest.fixture
def table(monkeypatch):
    """Replace the forward's and the backward's timings by `table.forward` / `table.backward` (dicts) for one
    test, the rules' cached verdicts cleared before and after."""
    def use(forward=None, backward=None):
        if forward is not None:
            monkeypatch.setattr(interface, "GLUON_FWD_MEASURED", forward)
        if backward is not None:
            monkeypatch.setattr(interface, "GLUON_BWD_MEASURED", backward)
        interface.gluon_fwd_loop.cache_clear(), interface.gluon_bwd_form.cache_clear()
    yield use
    interface.gluon_fwd_loop.cache_clear(), interface.gluon_bwd_form.cache_clear()


@pytest.mark.parametrize("timings, loop", [
    ((300, 200, 100, 250), "in-order"), ((200, 300, 100, 250), "overlapped"), ((100, 200, 300, 250), "ping-pong"),
    ((100, 200, 250, 250), None), ((100, 200, 240, 250), None),   # a tie with Triton, or slower: Triton
])
def test_rule_reads_its_verdict_from_the_table(timings, loop, table):
    """A new measurement changes the table only: the rule picks whichever Gluon column is fastest, where it beats
    the Triton column."""
    table(forward={(2048, False): timings, (2048, True): (1, 1, 1, 2)})
    assert interface.gluon_fwd_loop(4096, 4096, False, D) == loop
    assert interface.gluon_fwd_loop(4096, 4096, True, D) is None


@pytest.mark.parametrize("T, causal, form", [
    (512, False, None), (1024, False, "gluon"), (2048, False, "gluon"), (4096, False, "gluon"),
    (8192, False, "gluon"), (16384, False, "gluon"),
    (512, True, None), (1024, True, "triton"), (2048, True, "triton"), (4096, True, "gluon"),
    (8192, True, "triton"), (16384, True, "gluon"),
])
def test_backward_rule_gives_the_table_s_verdict_at_each_measured_point(T, causal, form):
    """Of the three backward forms, Triton measured fastest at 512 (either mask); elsewhere a Gluon dK/dV form,
    its dQ from the Gluon kernel at every non-causal point and at causal 4K and 16K, from the Triton pass at causal
    1K, 2K and 8K. The verdict is the table's: the named column is the row's largest."""
    row = interface.GLUON_BWD_MEASURED[T, causal]
    column = len(row) - 1 if form is None else interface.GLUON_BWD_DQ.index(form)
    assert row[column] == max(row) and row.count(max(row)) == 1
    assert interface.gluon_bwd_form(T, T, causal, D) == form


@pytest.mark.parametrize("T, S, causal, form", [
    (1, 1, False, None), (1023, 1023, False, None), (1024, 1024, False, "gluon"), (3000, 3000, False, "gluon"),
    (131072, 131072, False, "gluon"),
    (1, 1, True, None), (4095, 4095, True, "triton"), (4096, 4096, True, "gluon"), (8191, 8191, True, "gluon"),
    (8192, 8192, True, "triton"), (131072, 131072, True, "gluon"),
    (300, 9000, True, None), (9000, 300, True, None), (5000, 9000, True, "gluon"), (16384, 9000, True, "triton"),
])
def test_backward_rule_between_and_beyond_the_measured_points(T, S, causal, form):
    """The point a shape takes: the longest measured length at or below the shorter of T and S, below the
    shortest the shortest's."""
    assert interface.gluon_bwd_form(T, S, causal, D) == form


@pytest.mark.parametrize("timings, form, forced", [
    ((300, 200, 250), "triton", "triton"), ((200, 300, 250), "gluon", "gluon"),   # a Gluon form fastest: it runs
    ((200, 240, 250), None, "gluon"), ((240, 200, 250), None, "triton"),          # Triton fastest: "auto" takes it
    ((250, 240, 250), None, "triton"),                                            # a tie with Triton: Triton
])
def test_backward_rule_reads_its_verdict_from_the_table(timings, form, forced, table, sm90):
    """A new measurement changes the table only: "auto" runs whichever of the three columns is fastest,
    backend="gluon" the faster Gluon column even where Triton's is faster still."""
    table(backward={(512, False): timings, (512, True): (1, 1, 2)})
    assert interface.gluon_bwd_form(1024, 1024, False, D) == form
    assert interface.gluon_bwd_form(1024, 1024, True, D) is None
    assert interface.backward_kernel(*_bwd_inputs(), False, "auto") == form
    assert interface.backward_kernel(*_bwd_inputs(), False, "gluon") == forced


def _inputs(T=300, S=300, dtype=torch.float16, head_dim=D, hq=4, hkv=2):
    return (torch.randn(1, T, hq, head_dim, dtype=dtype), *torch.randn(2, 1, S, hkv, head_dim, dtype=dtype))


def _bwd_inputs(T=1100, S=1100, dtype=torch.float16, head_dim=D):
    """(do, q, k, v, o, lse) of a dense backward, as the forward leaves them; by default of a length where the
    table picks a Gluon form (non-causal 1K: the Gluon dQ kernel)."""
    q, k, v = _inputs(T, S, dtype, head_dim)
    return torch.randn_like(q), q, k, v, torch.randn_like(q), torch.randn(q.shape[0], q.shape[2], T)


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
        assert interface.forward_kernel(q, k, v, False, "auto") == "ping-pong"
        assert interface.gluon_bwd_misfit(*_bwd_inputs(dtype=dtype)) is None
        assert interface.backward_kernel(*_bwd_inputs(dtype=dtype), False, "auto") == "gluon"
    q, k, v = _inputs(T=5000, S=5000)
    assert interface.forward_kernel(q, k, v, True, "auto") == "ping-pong"
    assert interface.backward_kernel(*_bwd_inputs(T=5000, S=5000), True, "auto") == "gluon"
    assert interface.backward_kernel(*_bwd_inputs(), True, "auto") == "triton"   # causal 1K: the Triton dQ pass


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (9, 1), (10, 0), (12, 0)])
def test_dispatch_keeps_other_capabilities_on_triton(capability, sm90):
    sm90["capability"] = capability
    q, k, v = _inputs()
    assert "sm_90" in interface.gluon_misfit(q, k, v)
    assert interface.forward_kernel(q, k, v, False, "auto") is None
    assert "sm_90" in interface.gluon_bwd_misfit(*_bwd_inputs())
    assert interface.backward_kernel(*_bwd_inputs(), False, "auto") is None


def test_dispatch_keeps_the_cpu_and_the_interpreter_on_triton(sm90, monkeypatch):
    q, k, v = _inputs()
    monkeypatch.setattr(interface, "INTERPRET", True)
    assert interface.forward_kernel(q, k, v, False, "auto") is None
    assert interface.backward_kernel(*_bwd_inputs(), False, "auto") is None
    monkeypatch.setattr(interface, "INTERPRET", False)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: False))
    assert interface.forward_kernel(q, k, v, False, "auto") is None
    assert interface.backward_kernel(*_bwd_inputs(), False, "auto") is None


def test_dispatch_on_this_machine_is_triton():
    """No stand-ins: on the CPU (the interpreter) the rule's Gluon cases run the Triton forward."""
    if not INTERPRET:
        pytest.skip("a GPU machine: the stand-ins of the other tests play its cases")
    q, k, v = _inputs()
    assert interface.gluon_fwd_loop(300, 300, False, D) == "ping-pong"
    assert interface.forward_kernel(q, k, v, False, "auto") is None
    assert interface.gluon_bwd_form(1100, 1100, False, D) == "gluon"
    assert interface.backward_kernel(*_bwd_inputs(), False, "auto") is None


def test_dispatch_keeps_an_untested_or_gluon_less_triton_on_triton(sm90, monkeypatch):
    q, k, v = _inputs()
    monkeypatch.setattr(interface, "fast_paths_on", lambda: False)
    assert "measured on Triton" in interface.gluon_misfit(q, k, v)
    assert interface.forward_kernel(q, k, v, False, "auto") is None
    assert "measured on Triton" in interface.gluon_bwd_misfit(*_bwd_inputs())
    assert interface.backward_kernel(*_bwd_inputs(), False, "auto") is None
    monkeypatch.setattr(interface, "fast_paths_on", lambda: True)
    monkeypatch.setattr(interface, "_gluon_forward", lambda: None)
    monkeypatch.setattr(interface, "_gluon_backward", lambda: None)
    assert "does not import" in interface.gluon_misfit(q, k, v)
    assert interface.forward_kernel(q, k, v, False, "auto") is None
    assert "does not import" in interface.gluon_bwd_misfit(*_bwd_inputs())
    assert interface.backward_kernel(*_bwd_inputs(), False, "auto") is None


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


@pytest.mark.parametrize("change, why", [
    (lambda b: [t.float() for t in b[:5]] + [b[5]], "dtype"),
    (lambda b: [t.repeat(1, 1, 1, 2) for t in b[:5]] + [b[5]], "head dim"),
    (lambda b: [b[0], b[1].transpose(1, 2).contiguous().transpose(1, 2), *b[2:]], "contiguous"),
    (lambda b: [b[0], torch.empty(b[1].numel() + 1, dtype=b[1].dtype)[1:].view(b[1].shape), *b[2:]], "aligned"),
    (lambda b: [torch.empty(b[0].numel() + 1, dtype=b[0].dtype)[1:].view(b[0].shape), *b[1:]], "do must start"),
], ids=["fp32", "D256", "strided", "unaligned", "unaligned-do"])
def test_backward_dispatch_keeps_misfits_on_triton(change, why, sm90):
    """The Gluon backward's own refusals (`gluon_backward._check_inputs`) as the phrase the dispatch reads; D = 256
    is also off the measured table, so the misfit check is asked directly."""
    inputs = change(list(_bwd_inputs()))
    assert why in interface.gluon_bwd_misfit(*inputs)
    assert interface.backward_kernel(*inputs, False, "auto") is None
    with pytest.raises(ValueError, match=f"backend='gluon' does not apply here: .*{why}"):
        interface.backward_kernel(*inputs, False, "gluon")


@pytest.fixture
def launches(monkeypatch):
    """Stand-ins for the two forward launchers, recording which ran (and the Gluon loop); no kernel runs."""
    ran = []

    def triton(q, k, v, causal, scale, cu_seqlens_q=None, cu_seqlens_k=None):
        ran.append("triton")
        *batch, T, HQ, _ = q.shape
        return torch.zeros_like(q), torch.zeros(*batch, HQ, T)

    gluon_forward = interface._gluon_forward()
    loops = {gluon_forward.IN_ORDER.value: "gluon in-order", gluon_forward.OVERLAPPED.value: "gluon overlapped",
             gluon_forward.PINGPONG.value: "gluon ping-pong"}

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
    assert launches == ["triton", "gluon ping-pong"]


@pytest.mark.parametrize("backend, causal, T, head_dim, ran", [
    ("auto", False, 300, D, "gluon ping-pong"), ("auto", True, 300, D, "triton"),
    ("auto", True, 5000, D, "gluon ping-pong"), ("triton", False, 300, D, "triton"),
    ("gluon", True, 300, D, "gluon ping-pong"), ("gluon", False, 300, D, "gluon ping-pong"),
    ("auto", False, 300, 64, "triton"), ("gluon", False, 300, 64, "gluon in-order"),
])
def test_backend_forces_either_forward(backend, causal, T, head_dim, ran, sm90, launches):
    """backend="triton" runs Triton where the rule says Gluon; backend="gluon" runs Gluon where it says Triton
    (with the fastest Gluon loop there, ping-pong; in-order at a head dim not measured), the rule's loop
    elsewhere."""
    q, k, v = _inputs(T=T, S=T, head_dim=head_dim)
    interface.attention_fwd(q, k, v, causal, D ** -0.5, backend=backend)
    assert launches == [ran]


@pytest.fixture
def bwd_launches(monkeypatch):
    """Stand-ins for the two backward launchers, recording which ran (and the Gluon form's dQ kernel); no kernel
    runs."""
    ran = []

    def triton(do, q, k, v, o, lse, causal, scale, one_launch, cu_seqlens_q=None, cu_seqlens_k=None):
        ran.append("triton")
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    def gluon(do, q, k, v, o, lse, causal, scale, cu_seqlens_q=None, cu_seqlens_k=None, dq_kernel="triton"):
        ran.append(f"gluon, {dq_kernel} dQ")
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    monkeypatch.setattr(interface.backward, "attention_bwd", triton)
    monkeypatch.setattr(interface._gluon_backward(), "gluon_attention_bwd", gluon)
    return ran


@pytest.mark.parametrize("backend, causal, T, head_dim, ran", [
    ("auto", False, 300, D, "triton"), ("auto", True, 300, D, "triton"), ("auto", False, 1100, D, "gluon, gluon dQ"),
    ("auto", True, 1100, D, "gluon, triton dQ"), ("auto", True, 5000, D, "gluon, gluon dQ"),
    ("auto", True, 9000, D, "gluon, triton dQ"),
    ("triton", False, 1100, D, "triton"), ("triton", True, 5000, D, "triton"),
    ("gluon", False, 300, D, "gluon, triton dQ"), ("gluon", True, 300, D, "gluon, triton dQ"),
    ("gluon", False, 1100, D, "gluon, gluon dQ"),
    ("auto", False, 1100, 64, "triton"), ("gluon", False, 1100, 64, "gluon, triton dQ"),
])
def test_backend_forces_either_backward(backend, causal, T, head_dim, ran, sm90, bwd_launches):
    """The backward op on a played sm_90: "auto" runs the form the table measured fastest (Triton at 512, the Gluon
    dK/dV kernel with the dQ kernel of its faster column elsewhere) and Triton at an unmeasured head dim;
    "triton" forces Triton, "gluon" the faster Gluon form (the Triton dQ pass at 512 and at a head dim not
    measured)."""
    do, q, k, v, o, lse = _bwd_inputs(T=T, S=T, head_dim=head_dim)
    interface.attention_bwd(do, q, k, v, o, lse, causal, head_dim ** -0.5, False, None, None, backend)
    assert bwd_launches == [ran]


def test_packed_backward_stays_on_triton(sm90, bwd_launches):
    """flash_attn_varlen_func's backward is the Triton one even where its dense shape would take Gluon."""
    do, q, k, v, o, _ = (t[0] for t in _bwd_inputs())
    cu = torch.tensor([0, 400, 1100], dtype=torch.int32)
    interface.attention_bwd(do, q, k, v, o, torch.randn(q.shape[1], q.shape[0]), False, D ** -0.5, False, cu, cu)
    interface.attention_bwd(*_bwd_inputs(), False, D ** -0.5, False)   # dense: Gluon
    assert bwd_launches == ["triton", "gluon, gluon dQ"]


@pytest.mark.parametrize("backend, T, ran", [
    ("auto", 1100, ["gluon ping-pong", "gluon, gluon dQ"]), ("auto", 300, ["gluon ping-pong", "triton"]),
    ("triton", 1100, ["triton", "triton"]), ("gluon", 300, ["gluon ping-pong", "gluon, triton dQ"]),
])
def test_backend_reaches_the_backward_through_autograd(backend, T, ran, sm90, launches, bwd_launches):
    """flash_attn_func's backend= is carried from the forward to the backward op: one choice for both passes,
    each pass's kernel by its own table (at 300 keys the Triton backward measured fastest)."""
    q, k, v = (t.requires_grad_() for t in _inputs(T=T, S=T))
    flash_attn_func(q, k, v, backend=backend).sum().backward()
    assert launches + bwd_launches == ran


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


def _dkdv_from_the_formula(kernel, grid, key, args, constexprs, **options):
    """Stands in for the Gluon dK/dV launch: dK and dV from what the kernel is handed (q, k, v, dO, the lse and
    delta rows as the copy engine would read them), in fp64, written where the kernel writes them (dk, dv, or part
    0 of the per-part workspace that the launcher sums)."""
    q, k, v, do, dk, dv, lse_rows, delta_rows, scale_log2, scale, T, S, HQ, HKV, parts, row_stride = args
    assert lse_rows.shape[-1] == row_stride and row_stride % 4 == 0
    q, do, delta = q.double(), do.double(), delta_rows[..., :T].double()
    k, v, p, ds = _p_and_ds(q, k, v, do, lse_rows[..., :T], delta, scale_log2, constexprs["CAUSAL"], HQ // HKV)
    B, D = q.shape[0], q.shape[3]
    dv_heads, dk_heads = torch.einsum("bhts,bthd->bshd", p, do), scale * torch.einsum("bhts,bthd->bshd", ds, q)
    for out, grad in ((dv, dv_heads), (dk, dk_heads)):
        summed = grad.reshape(B, S, HKV, HQ // HKV, D).sum(3)
        if parts > 1:
            out.zero_()
            out[..., 0, :] = summed
        else:
            out.copy_(summed)


def _dq_from_the_formula(kernel, grid, key, args, constexprs, **options):
    """Stands in for the Gluon dQ launch: delta = rowsum(dO o O) and dQ from what the kernel is handed, in fp64,
    written where the kernel writes them."""
    q, k, v, o, do, dq, lse, delta, scale_log2, scale, T, S, HQ, HKV = args
    q, do = q.double(), do.double()
    rows = (do * o.double()).sum(-1).transpose(1, 2)   # [B, HQ, T]
    k, _, _, ds = _p_and_ds(q, k, v, do, lse, rows, scale_log2, constexprs["CAUSAL"], HQ // HKV)
    dq.copy_(scale * torch.einsum("bhts,bshd->bthd", ds, k)), delta.copy_(rows)


def _p_and_ds(q, k, v, do, lse, delta, scale_log2, causal, group):
    """fp64 k and v repeated over each KV head's query heads, P and dS = P o (dP - delta) ([B, HQ, T, S]), from
    fp64 q and do ([B, T, HQ, D]), the base-2 lse and delta rows ([B, HQ, T])."""
    k, v = (t.double().repeat_interleave(group, dim=2) for t in (k, v))
    T, S = q.shape[1], k.shape[1]
    s = torch.einsum("bthd,bshd->bhts", q, k)
    if causal:   # bottom-right: query i sees key j iff j <= i + S - T
        hidden = torch.arange(S)[None, :] > torch.arange(T)[:, None] + S - T
        s = s.masked_fill(hidden, float("-inf"))
    p = torch.exp2(s * scale_log2 - lse.double()[..., None])
    return k, v, p, p * (torch.einsum("bthd,bshd->bhts", do, v) - delta[..., None])


@pytest.mark.skipif(not INTERPRET, reason="plays a Hopper on the CPU; on a GPU, test_gpu_* runs the kernel")
@pytest.mark.parametrize("T, causal, backend, measured, loop, dq_kernel", [
    (67, False, "auto", (1, 3, 2), "ping-pong", "gluon"), (66, True, "gluon", None, "ping-pong", "triton"),
    (67, True, "auto", (3, 1, 2), None, "triton")], ids=["full-auto", "causal-forced", "causal-fwd-triton"])
def test_autograd_path_through_the_gluon_launches(T, causal, backend, measured, loop, dq_kernel, table, monkeypatch):
    """flash_attn_func with inputs that require grad, the dispatch choosing Gluon for both passes (the misfits
    answered None; "auto" reading a table whose point at 512 is `measured`, where given) and the Gluon kernels'
    launches standing in: the forward's fills the o and lse that `launch_gluon` allocated with the Triton
    forward's values, the dK/dV launch computes from what it is handed (`_dkdv_from_the_formula`), and so does
    the Gluon dQ launch where the form has it (`_dq_from_the_formula`; else the dQ pass is the Triton one). No
    refusal of inputs that require grad, the backward reads the saved o and lse, and output and gradients match
    the fp64 formula. Also asserts what `launch_gluon` allocates is what the Triton forward returns (shape,
    dtype, contiguity). Causal at this short T, "auto" keeps the Triton forward (the table's causal 2K) and
    still runs the Gluon backward on its o and lse; backend="gluon" at causal 512 takes the Triton dQ pass, the
    faster Gluon form there."""
    from attention_kernels.flash_attn import gluon_backward, gluon_dq, gluon_forward

    if measured is not None:
        table(backward={**interface.GLUON_BWD_MEASURED, (512, causal): measured})

    launched = []
    names = {gluon_forward.IN_ORDER.value: "in-order", gluon_forward.OVERLAPPED.value: "overlapped",
             gluon_forward.PINGPONG.value: "ping-pong"}

    def forward_kernel(kernel, grid, key, args, constexprs, **options):
        q, k, v, o, lse, scale_log2, *_ = args
        o_t, lse_t = triton_forward(q, k, v, constexprs["CAUSAL"], scale, None, None)
        for mine, theirs in ((o, o_t), (lse, lse_t)):
            assert (mine.shape, mine.dtype, mine.stride()) == (theirs.shape, theirs.dtype, theirs.stride())
        o.copy_(o_t), lse.copy_(lse_t)
        launched.append(names[constexprs["SCHEDULE"]])

    def dkdv_kernel(*args, **options):
        _dkdv_from_the_formula(*args, **options)
        launched.append("gluon backward")

    def dq_launch(*args, **options):
        _dq_from_the_formula(*args, **options)
        launched.append("gluon dQ")

    monkeypatch.setattr(interface, "gluon_misfit", lambda q, k, v: None)
    monkeypatch.setattr(interface, "gluon_bwd_misfit", lambda *inputs: None)
    monkeypatch.setattr(gluon_backward, "_check_inputs", lambda *inputs: None)   # CPU tensors: no Hopper's
    monkeypatch.setattr(gluon_forward, "launch_direct", forward_kernel)
    monkeypatch.setattr(gluon_backward, "launch_direct", dkdv_kernel)
    monkeypatch.setattr(gluon_dq, "launch_direct", dq_launch)
    S, scale = 90, 0.2
    mk = lambda *shape: torch.randn(*shape).half().requires_grad_()   # noqa: E731
    q, k, v = mk(2, T, 4, D), mk(2, S, 2, D), mk(2, S, 2, D)
    o = flash_attn_func(q, k, v, causal=causal, softmax_scale=scale, backend=backend)
    g = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), g)
    gluon_dq_ran = ["gluon dQ"] * (dq_kernel == "gluon")
    assert launched == [loop] * (loop is not None) + gluon_dq_ran + ["gluon backward"] and o.grad_fn is not None
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attention_ref(qr, kr, vr, causal=causal, softmax_scale=scale, compute_dtype=torch.float64)
    refs = (ref, *torch.autograd.grad(ref, (qr, kr, vr), g.double()))
    fwd_tol = tolerance(torch.float16, tf32_dots=True)
    for name, out, want, tol in zip(("o", "dq", "dk", "dv"), (o, *grads), refs, (fwd_tol, *[3 * fwd_tol] * 3)):
        assert not torch.isnan(out).any(), f"{name} has NaN"
        assert rel_err(out, want) <= tol, f"{name}: relative error {rel_err(out, want):.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("T, S, causal, loop, dq_kernel", [
    (1100, 1100, False, "ping-pong", "gluon"), (4100, 4100, True, "ping-pong", "gluon"),
    (1300, 1100, False, "ping-pong", "gluon"), (1025, 1025, True, None, "triton"),
], ids=["full-1100", "causal-4100", "full-T>S", "causal-1025-fwd-triton"])
def test_gpu_flash_attn_func_through_gluon_matches_reference(T, S, causal, loop, dq_kernel):
    """On an sm_90 GPU the dispatch chooses the Gluon forward for these bf16 D = 128 shapes (GQA 8/2) but causal
    1025 (Triton's, as at causal 2K), and the Gluon dK/dV backward for all, its dQ from the Gluon kernel but at
    causal 1025 (the Triton pass, as at causal 1K); output and gradients against attention_ref in fp64.
    T = 1025 also takes the lse and delta rows the launcher pads for the copy engine."""
    if not torch.cuda.is_available() or interface.capability(torch.device("cuda")) != (9, 0):
        pytest.skip("the Gluon kernels are dispatched on sm_90 GPUs only")
    mk = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)   # noqa: E731
    q, k, v = mk(1, T, 8, D), mk(1, S, 2, D), mk(1, S, 2, D)
    assert interface.forward_kernel(q.detach(), k.detach(), v.detach(), causal, "auto") == loop
    o = flash_attn_func(q, k, v, causal=causal)
    g = torch.randn_like(o)
    lse = torch.empty(1, 8, T, device="cuda")   # the forward's saved lse: the dispatch reads its shape and address
    detached = (t.detach() for t in (g, q, k, v, o))
    assert interface.backward_kernel(*detached, lse, causal, "auto") == dq_kernel
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
