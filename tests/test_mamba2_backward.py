"""Training the SSD chunk scan: ssd_chunk_scan's gradients (x, dt, A, B, C, D, z, dt_bias, initial_states)
against autograd through the fp64 loop (ssd_scan_ref, one Mamba-2 step per token), for a loss through y
and the final states (random upstream gradients for both), or through one of them alone.

Cases: lengths that are not chunk multiples (37, 70) and one token; forward chunks 16, 64 and 256 (the
backward recomputes in chunks of 64 whatever the forward took); with and without initial states, the
softplus, D (per head [H] and per channel [H, P]), z; G = 1 and G = 2 groups of H = 4 heads; decays of a
model (dt·A in [-2, 0]), none (A = 0), strong (dt·A down to -35 per token) and a full reset (dt·A far below
the floor at a few tokens: the decay is exactly 0 and its gate gets no gradient); the last two with gates
exact in fp32 (make_inputs says why).

Packed sequences (cu_seqlens): lengths 1, 64, 65, 129 and 300 in one call at every chunk size, against
each sequence alone through the same loop; an empty sequence; a NaN in one sequence reaching no other's
output or gradient; bad offsets refused by name.

dq and dk summed over each group's heads in runs (the last one short), over dstate tiles (the last one partial),
two groups, a reset, with the intra-chunk kernel launched once a backward.

CPU (interpreter): fp32, held to the fp32 tolerance; fp16 against the same kernels in fp32, within the fp16
tolerance, with the backward's chunk states and their gradients stored in fp16. GPU: bf16 at B=2, T=1000,
H=8, P=64, N=64, G=2 against the same kernels in fp32.
"""
import contextlib
import weakref
from dataclasses import dataclass

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from attention_kernels.common import DEVICE, assert_close, tolerance
from attention_kernels.linear.chunk import GATE_FLOOR
from attention_kernels.linear.chunk_backward import chunk_row
from attention_kernels.mamba2 import chunk as mamba2_chunk
from attention_kernels.mamba2 import ssd_chunk_scan, ssd_scan_ref

FP32 = tolerance(torch.float32)
NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")


@dataclass(frozen=True)
class Case:
    T: int = 70
    chunk_size: int = 64
    G: int = 2
    decay: str = "model"           # model, none, strong, reset
    softplus: bool = True
    D: str = "channel"             # channel ([H, P]), head ([H]) or none
    z: bool = True
    bias: bool = True
    h0: bool = True
    loss: str = "both"             # both, y, final

    @property
    def id(self):
        return (f"T{self.T}-L{self.chunk_size}-G{self.G}-{self.decay}-{'softplus' if self.softplus else 'raw'}"
                f"-D{self.D}-{'z' if self.z else 'noz'}-{'bias' if self.bias else 'nobias'}"
                f"-{'h0' if self.h0 else 'noh0'}-loss_{self.loss}")


CASES = [
    Case(),
    Case(T=37, chunk_size=16, G=1, D="head", z=False),
    Case(T=70, chunk_size=256, decay="strong", softplus=False),
    Case(T=70, chunk_size=32, decay="none", softplus=False, D="none", h0=False),
    Case(T=37, chunk_size=64, decay="reset", softplus=False, G=1),
    Case(T=1, chunk_size=64, D="head"),
    Case(T=70, chunk_size=128, softplus=False, z=False, loss="y"),
    Case(T=37, chunk_size=64, D="none", z=False, bias=False, loss="final"),
]


def make_inputs(case: Case, Bt=1, H=4, P=8, N=16, dtype=torch.float32, device=DEVICE):
    """The scan's inputs for a case, as a dict by argument name (None where the case leaves one out)."""
    T, G = case.T, case.G
    rand = lambda *s: torch.randn(*s, device=device)    # noqa: E731
    bias = rand(H) * 0.3 if case.bias else None
    if case.softplus:
        dt = rand(Bt, T, H) * 0.5 - 1                    # softplus(dt + bias) around 0.3
    else:
        dt = torch.rand(Bt, T, H, device=device) * 0.5 + 0.05
    A = -torch.rand(H, device=device) * 2 - 0.1
    if case.decay == "none":
        A = torch.zeros(H, device=device)
    elif case.decay in ("strong", "reset"):
        # exact gates: dt in multiples of 1/8 and an integer A, so that every in-chunk sum of dt·A is exact
        # in fp32. An inexact sum near -2000 would move the exponents by 2^-24 · 2000 ≈ 1e-4, and dA (whose
        # diagonal terms cancel exactly, leaving the terms e^-5 and smaller) would show that cumsum's error
        # rather than the backward's.
        assert not case.softplus, "exact gates are given as they are: no softplus"
        dt = torch.randint(4, 13, (Bt, T, H), device=device) / 8                    # 0.5 .. 1.5
        bias = torch.randint(-2, 3, (H,), device=device) / 8 if case.bias else None
        if case.decay == "strong":
            A = -torch.randint(5, 24, (H,), device=device).float()                  # dt·A down to -35
        else:
            A = torch.full((H,), -4.0, device=device)
            dt[0, T // 2, 0] = dt[0, T - 1, H - 1] = 64.0     # dt·A = -256: far below the floor, a reset
    return {
        "x": rand(Bt, T, H, P).to(dtype), "dt": dt, "A": A,
        "B": rand(Bt, T, G, N).to(dtype), "C": rand(Bt, T, G, N).to(dtype),
        "D": {"channel": rand(H, P), "head": rand(H), "none": None}[case.D],
        "z": rand(Bt, T, H, P).to(dtype) if case.z else None,
        "dt_bias": bias,
        "initial_states": rand(Bt, H, P, N) if case.h0 else None,
    }


def run(fn, inputs, case: Case, dy, dfinal, math_dtype=None):
    """(y, final states, the gradient of every given input) for the loss sum(y·dy) + sum(final·dfinal),
    or one of its two terms (case.loss); math_dtype: the inputs cast to it first (the fp64 reference)."""
    leaves = {n: None if t is None else (t if math_dtype is None else t.to(math_dtype)).detach().clone()
              .requires_grad_() for n, t in inputs.items()}
    y, final = fn(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], chunk_size=case.chunk_size,
                  D=leaves["D"], z=leaves["z"], dt_bias=leaves["dt_bias"], dt_softplus=case.softplus,
                  initial_states=leaves["initial_states"], return_final_states=True)
    loss = 0
    if case.loss in ("both", "y"):
        loss = loss + (y.double() * dy.double()).sum()
    if case.loss in ("both", "final"):
        loss = loss + (final.double() * dfinal.double()).sum()
    given = [n for n in NAMES if leaves[n] is not None]
    grads = torch.autograd.grad(loss, [leaves[n] for n in given], allow_unused=True, materialize_grads=True)
    return y.detach(), final.detach(), dict(zip(given, grads))


# The gradients of A and of a per-head dt_bias hold one number per head, sums over every token of per-token
# terms of both signs (dg_t·dt_t for A; dt's gradient through the softplus for dt_bias), each as accurate as
# dt's gradient: the sum cancels and keeps their absolute error, so its relative error runs up to 100 times
# the others' (1e-5 where they show 1e-7, under strong decay).
CANCELLATION = 10
PER_HEAD_SUMS = ("A", "dt_bias")


def assert_same_gradients(out, ref, tol):
    assert_close(out[0], ref[0], tol, "y")
    assert_close(out[1], ref[1], tol, "final_states")
    assert out[2].keys() == ref[2].keys()
    for name in ref[2]:
        assert out[2][name].shape == ref[2][name].shape, name
        assert not out[2][name].isnan().any(), f"{name}: NaN"
        assert_close(out[2][name], ref[2][name], tol * (CANCELLATION if name in PER_HEAD_SUMS else 1), f"d{name}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gradients_match_the_fp64_loop(case):
    inputs = make_inputs(case)
    H, P, N = 4, 8, 16
    dy, dfinal = torch.randn(1, case.T, H, P, device=DEVICE), torch.randn(1, H, P, N, device=DEVICE)
    ref = run(ssd_scan_ref, inputs, case, dy, dfinal, math_dtype=torch.float64)
    assert_same_gradients(run(ssd_chunk_scan, inputs, case, dy, dfinal), ref, FP32)


def _recording_intra_launches(monkeypatch):
    """Count the launches of the intra-chunk dq/dk kernel."""
    kernel, launched = mamba2_chunk._ssd_dqk_intra_kernel, []

    class Recording:
        def __getitem__(self, grid):
            launched.append(grid)
            return kernel[grid]

    monkeypatch.setattr(mamba2_chunk, "_ssd_dqk_intra_kernel", Recording())
    return launched


def _recording_gate_shares(monkeypatch):
    """After each launch of the key-tile dq/dk kernel: its gates as given and its gate gradient's shares,
    [Bt, H, T] and [NK + 1, Bt, H, T] (the key tiles' and, last, the intra-chunk kernel's)."""
    kernel, recorded = mamba2_chunk._ssd_dqk_kernel, []

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                kernel[grid](*args, **kwargs)
                recorded.append((args[4].clone(), args[12].clone()))      # g_heads, dg_tiles
            return launch

    monkeypatch.setattr(mamba2_chunk, "_ssd_dqk_kernel", Recording())
    return recorded


def test_heads_summed_in_runs_over_dstate_tiles(monkeypatch):
    # B's and C's gradients are summed over a group's heads in runs of heads: runs of 3 of 4 heads a group
    # (the last run short), two groups, dstate 80 in key tiles of 32 (the last one partial), T 150 (the last
    # chunk partial), two batch rows, resets (gates under the floor: their gradient exactly 0 in every key
    # tile's share and in the intra-chunk one; without the intra kernel's zeroing its share keeps a rounding
    # error, ~1e-6, invisible in the gradients' comparison. The key tiles' shares there are 0 with or without
    # theirs: every term carries e^{b} with b <= GATE_FLOOR, 0 in fp32); the intra-chunk kernel launched
    # once a backward, over every chunk and run
    monkeypatch.setattr(mamba2_chunk, "_DQK_HEADS", 3)
    launched = _recording_intra_launches(monkeypatch)
    shares = _recording_gate_shares(monkeypatch)
    case = Case(T=150, G=2, decay="reset", softplus=False)
    Bt, H, P, N = 2, 8, 8, 80
    inputs = make_inputs(case, Bt=Bt, H=H, P=P, N=N)
    # more resets, inside chunks, where the intra-chunk share's sums over the tokens after the reset cancel
    # to a rounding error (~1e-6), not to 0: each in another head of the second batch row
    inputs["dt"][1, [5, 40, 70, 90, 101, 120, 140], [0, 1, 2, 3, 4, 5, 6]] = 64.0
    dy, dfinal = torch.randn(Bt, case.T, H, P, device=DEVICE), torch.randn(Bt, H, P, N, device=DEVICE)
    ref = run(ssd_scan_ref, inputs, case, dy, dfinal, math_dtype=torch.float64)
    assert_same_gradients(run(ssd_chunk_scan, inputs, case, dy, dfinal), ref, FP32)
    assert launched == [(3, Bt * 2 * 2)]      # (chunks, batch rows x groups x runs)
    ((g_heads, dg_tiles),) = shares
    reset = g_heads < GATE_FLOOR
    assert dg_tiles.shape[0] == 3 + 1 and reset.sum() == 2 + 7      # three key tiles and the intra shares
    assert (dg_tiles[:, reset] == 0).all()
    assert (dg_tiles[:, ~reset] != 0).any(dim=1).all()              # every share nonzero somewhere else


def test_dqk_kernel_takes_two_stages_where_shared_memory_is_short(monkeypatch):
    # with fp32 inputs a GPU with less shared memory a program than the H100 (~100 KB on sm_86, sm_89) refuses
    # the key-tile dq/dk kernel's pipeline of three stages: the launch is made again with two, the gradients hold,
    # and the next call launches two at once
    kernel, stages = mamba2_chunk._ssd_dqk_kernel, []

    class SharedMemoryShort:
        def __getitem__(self, grid):
            def launch(*args, num_stages, **kwargs):
                stages.append(num_stages)
                if num_stages > 2:
                    raise OutOfResources(120 * 1024, 99 * 1024, "shared memory")
                return kernel[grid](*args, num_stages=num_stages, **kwargs)
            return launch

    monkeypatch.setattr(mamba2_chunk, "_ssd_dqk_kernel", SharedMemoryShort())
    monkeypatch.setattr(mamba2_chunk, "_DQK_STAGES_ON", {})
    case = Case(T=70, G=1)
    inputs = make_inputs(case)
    dy, dfinal = torch.randn(1, case.T, 4, 8, device=DEVICE), torch.randn(1, 4, 8, 16, device=DEVICE)
    ref = run(ssd_scan_ref, inputs, case, dy, dfinal, math_dtype=torch.float64)
    assert_same_gradients(run(ssd_chunk_scan, inputs, case, dy, dfinal), ref, FP32)
    assert stages == [mamba2_chunk._DQK_STAGES, 2]
    run(ssd_chunk_scan, inputs, case, dy, dfinal)      # the refusal remembered: two stages at once
    assert stages == [mamba2_chunk._DQK_STAGES, 2, 2]


def test_the_reference_is_differentiable():
    """Autograd goes through the fp64 loop to every input (the tests above compare with it)."""
    inputs = make_inputs(Case(T=5))
    _, _, grads = run(ssd_scan_ref, inputs, Case(T=5), torch.randn(1, 5, 4, 8), torch.randn(1, 4, 8, 16),
                      math_dtype=torch.float64)
    assert set(grads) == set(NAMES) and all(g.abs().sum() > 0 for g in grads.values())


def test_gradient_flows_only_to_inputs_that_require_it():
    """A scan whose only trained input is dt_bias (the rest plain tensors) gives dt_bias its gradient,
    and the same call without grad mode returns a tensor with no graph."""
    inputs = make_inputs(Case(T=20))
    bias = inputs["dt_bias"].clone().requires_grad_()
    y = ssd_chunk_scan(inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"], D=inputs["D"],
                       z=inputs["z"], dt_bias=bias, dt_softplus=True, initial_states=inputs["initial_states"])
    (g,) = torch.autograd.grad(y.sum(), bias)
    ref = run(ssd_scan_ref, inputs, Case(T=20, loss="y"), torch.ones(1, 20, 4, 8), torch.zeros(1, 4, 8, 16),
              math_dtype=torch.float64)
    assert_close(g, ref[2]["dt_bias"], FP32, "ddt_bias")
    with torch.no_grad():
        assert not ssd_chunk_scan(inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"],
                                  dt_bias=bias).requires_grad


@pytest.mark.parametrize("chunk_size", [64, 256], ids=lambda L: f"chunk{L}")
def test_fp16_gradients(chunk_size, monkeypatch):
    """fp16 x, B, C, z at T=150 (three chunks of 64), P=80 (two headdim tiles of 64, the last one partial, in
    chunk_dv and in the key-tile dq/dk kernel's inter-chunk products), N=32, against the same kernels on the inputs in fp32; the chunk-start states' gradients, which
    chunk_dv reads, are stored in fp16. At chunk 256 the backward takes the ungated output the forward
    stored in fp16 from chunks of 256, where it would recompute it from chunks of 64."""
    seen = []

    def recording(C, B, x, b, A, dstates, *args, **kwargs):
        seen.append(dstates.dtype)
        return shared_chunk_dv(C, B, x, b, A, dstates, *args, **kwargs)

    shared_chunk_dv = mamba2_chunk.chunk_dv
    monkeypatch.setattr(mamba2_chunk, "chunk_dv", recording)
    case = Case(T=150, chunk_size=chunk_size)
    inputs = make_inputs(case, H=4, P=80, N=32)
    low = {n: None if t is None else (t.half() if n in ("x", "B", "C", "z") else t) for n, t in inputs.items()}
    dy, dfinal = torch.randn(1, 150, 4, 80, device=DEVICE), torch.randn(1, 4, 80, 32, device=DEVICE)
    ref = run(ssd_chunk_scan, {n: None if t is None else t.float() for n, t in low.items()}, case, dy, dfinal)
    assert_same_gradients(run(ssd_chunk_scan, low, case, dy, dfinal), ref, tolerance(torch.float16))
    assert seen == [torch.float32, torch.float16]


@pytest.mark.parametrize("D,z", [("head", True), ("head", False), ("channel", True), ("channel", False)],
                         ids=["Dhead-z", "Dhead-noz", "Dchannel-z", "Dchannel-noz"])
def test_fp16_skip_gradient_added_by_chunk_dv(D, z):
    """x's gradient takes the skip's share do ⊙ D inside chunk_dv, from o's gradient in x's dtype: fp16 x, B,
    C, z against the fp64 loop on the same fp16 values, D per head and per channel (a transposed view, its
    strides not [H, P]'s), with z and without, headdim 80 (chunk_dv's two value tiles, the last partial)."""
    case = Case(T=70, D=D, z=z)
    H, P, N = 4, 80, 16
    inputs = make_inputs(case, H=H, P=P, N=N)
    if D == "channel":
        inputs["D"] = inputs["D"].t().contiguous().t()
        assert inputs["D"].stride() == (1, H)
    low = {n: None if t is None else (t.half() if n in ("x", "B", "C", "z") else t) for n, t in inputs.items()}
    dy, dfinal = torch.randn(1, case.T, H, P, device=DEVICE), torch.randn(1, H, P, N, device=DEVICE)
    ref = run(ssd_scan_ref, low, case, dy, dfinal, math_dtype=torch.float64)
    assert_same_gradients(run(ssd_chunk_scan, low, case, dy, dfinal), ref, tolerance(torch.float16))


def _recording_output_launches(monkeypatch):
    """Record the output kernel's launches: per launch, a weak reference to the buffer it stored the ungated
    output in (its base, where a packed sequence's launch writes a view of it), or None where it stored none."""
    kernel, launched = mamba2_chunk._ssd_output_kernel, []
    where = kernel.fn.arg_names.index("y_ungated")

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                kept = args[where]
                launched.append(weakref.ref(kept if kept._base is None else kept._base)
                                if kwargs["STORE_UNGATED"] else None)
                return kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(mamba2_chunk, "_ssd_output_kernel", Recording())
    return launched


@pytest.mark.parametrize("lengths,chunk_size", [((70,), 32), ((33, 37), 256)], ids=["dense", "packed"])
def test_training_step_with_z_launches_the_output_kernel_once(lengths, chunk_size, monkeypatch):
    # the forward stores the ungated output beside y and the backward takes it: one output launch a step (a
    # sequence, when packed), the ungated output kept from the forward to the backward and freed with the graph,
    # the gradients still the fp64 loop's (the forward's chunk is not the backward's 64)
    launched = _recording_output_launches(monkeypatch)
    inputs, dy, dfinal = packed_inputs(lengths)
    cu = offsets(lengths)
    leaves = {n: t.detach().clone().requires_grad_() for n, t in inputs.items()}
    y, final = ssd_chunk_scan(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], chunk_size,
                              leaves["D"], leaves["z"], leaves["dt_bias"], True, leaves["initial_states"], True,
                              cu_seqlens=cu if len(lengths) > 1 else None)
    assert len(launched) == len(lengths) and all(r is not None for r in launched)
    assert len({r() for r in launched}) == 1 and launched[0]() is not None      # one buffer, kept
    grads = torch.autograd.grad((y * dy).sum() + (final * dfinal).sum(), list(leaves.values()))
    assert len(launched) == len(lengths) and launched[0]() is None              # none more; freed with the graph
    ref = separate_reference(inputs, cu, dy, dfinal)
    assert_same_gradients((y.detach(), final.detach(), dict(zip(leaves, grads))), ref, FP32)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "no_input_requires_grad", "no_z"])
def test_forward_without_a_gate_gradient_keeps_nothing(mode, monkeypatch):
    # a prefill stores no ungated output, and neither does a training step without z (dz needs it, nothing
    # else does): its backward launches no output kernel either
    launched = _recording_output_launches(monkeypatch)
    inputs = make_inputs(Case(T=70, z=mode != "no_z"))
    leaves = {n: None if t is None else t.clone().requires_grad_(mode != "no_input_requires_grad")
              for n, t in inputs.items()}
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, contextlib.nullcontext)
    with context():
        y = ssd_chunk_scan(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], D=leaves["D"],
                           z=leaves["z"], dt_bias=leaves["dt_bias"], dt_softplus=True,
                           initial_states=leaves["initial_states"])
    assert launched == [None]
    assert (y.grad_fn is not None) == (mode == "no_z")
    if mode == "no_z":
        torch.autograd.grad(y.sum(), leaves["x"])
        assert launched == [None]


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_size", [64, 256])
def test_bf16_gradients_on_the_gpu(chunk_size):
    """bf16 inputs at B=2, T=1000, H=8, P=64, N=64, G=2, against the same kernels on the inputs in fp32."""
    case = Case(T=1000, chunk_size=chunk_size)
    inputs = make_inputs(case, Bt=2, H=8, P=64, N=64)
    dy, dfinal = torch.randn(2, 1000, 8, 64, device=DEVICE), torch.randn(2, 8, 64, 64, device=DEVICE)
    ref = run(ssd_chunk_scan, inputs, case, dy, dfinal)
    low = {n: None if t is None else (t.to(torch.bfloat16) if n in ("x", "B", "C", "z") else t)
           for n, t in inputs.items()}
    assert_same_gradients(run(ssd_chunk_scan, low, case, dy, dfinal), ref, tolerance(torch.bfloat16))


@triton.jit
def _chunk_row_times(out, i_b, t0, i_h, T, H, D: tl.constexpr):
    tl.store(out, chunk_row(i_b, t0, i_h, T, H) * D)


def test_chunk_row_is_64_bit():
    """The backward's offsets past 2^31 (chunk_backward.py's 64-bit note): the row of the last chunk of batch
    row 7 at T 64K, 80 heads, times a dA row (64) is 2.7e9, exact, where 32 bits would wrap."""
    out = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    _chunk_row_times[(1,)](out, 7, 65472, 79, 65536, 80, D=64)
    expected = ((7 * 65536 + 65472) * 80 + 79) * 64
    assert expected > 2 ** 31 and out.item() == expected


@pytest.mark.gpu
def test_gradients_past_32_bit_offsets_on_the_gpu():
    """B 4, T 64K, 40 heads x headdim 128, dstate 128, bf16: the chunk-start states and their gradients,
    [4, 1024, 40, 128, 128], hold 2.7e9 elements, so every offset past chunk ~205 of the last batch row passes
    2^31 (x, do and dA stay under it: 1.3e9, 0.7e9). A sequence's gradients do not depend on the other batch
    rows: the last row's, from the batch of 4, match the same backward on that row alone (~22 GB); the same for
    the forward's output."""
    Bt, T, H, P, N = 4, 65536, 40, 128, 128
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    rand = lambda *s: torch.randn(*s, device=DEVICE, generator=gen, dtype=torch.bfloat16)   # noqa: E731
    x, dy = rand(Bt, T, H, P), rand(Bt, T, H, P)
    B, C = rand(Bt, T, 1, N), rand(Bt, T, 1, N)
    dt = torch.rand(Bt, T, H, device=DEVICE, generator=gen) * 0.5 - 1
    A = -torch.rand(H, device=DEVICE, generator=gen) * 2 - 0.1
    D = torch.randn(H, device=DEVICE, generator=gen)

    def last_row_grads(x, dt, B, C, dy):
        grads = mamba2_chunk.ssd_chunk_scan_bwd(x, dt, A, B, C, D, None, None, True, None, dy, None)
        return [g[-1].float() for g in (grads[0], grads[1], grads[3], grads[4])]     # dx, ddt, dB, dC

    whole = last_row_grads(x, dt, B, C, dy)
    alone = last_row_grads(x[-1:], dt[-1:], B[-1:], C[-1:], dy[-1:])
    for name, got, want in zip(("dx", "ddt", "dB", "dC"), whole, alone):
        assert torch.isfinite(got).all(), name
        assert_close(got, want, tolerance(torch.bfloat16), name)
    del whole, alone

    # the forward at chunks of 64 (the sequential state pass): the states it stores and the output kernel reads,
    # [4, 1024, 40, 128, 128], past 2^31 as the backward's (x and y, 1.3e9, stay under it)
    def last_row_output(x, dt, B, C):
        y, _ = mamba2_chunk.ssd_chunk_scan_fwd((x.shape[0], T, H, P, N, 1), x, dt, A, B, C, 64, D, None, None,
                                               True, None, False)
        return y[-1].float()

    got = last_row_output(x, dt, B, C)
    assert torch.isfinite(got).all()
    assert_close(got, last_row_output(x[-1:], dt[-1:], B[-1:], C[-1:]), tolerance(torch.bfloat16), "y")


# ------------------------------------------------------------------ packed sequences (cu_seqlens)
LENGTHS = (1, 64, 65, 129, 300)     # one token, a chunk, a chunk and one, two and one, many chunks


def offsets(lengths, device=DEVICE):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


def packed_inputs(lengths, H=4, P=8, N=16, G=2):
    """The inputs of one packed call (batch 1, the sequences along seqlen) and its upstream gradients."""
    inputs = make_inputs(Case(T=sum(lengths), G=G), H=H, P=P, N=N)
    inputs["initial_states"] = torch.randn(len(lengths), H, P, N, device=DEVICE)
    dy = torch.randn(1, sum(lengths), H, P, device=DEVICE)
    return inputs, dy, torch.randn(len(lengths), H, P, N, device=DEVICE)


def packed_run(inputs, cu, chunk_size, dy, dfinal):
    """(y, final states, gradients by name) of one packed call."""
    leaves = {n: t.detach().clone().requires_grad_() for n, t in inputs.items()}
    y, final = ssd_chunk_scan(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], chunk_size,
                              leaves["D"], leaves["z"], leaves["dt_bias"], True, leaves["initial_states"], True,
                              cu_seqlens=cu)
    grads = torch.autograd.grad((y * dy).sum() + (final * dfinal).sum(), list(leaves.values()))
    return y.detach(), final.detach(), dict(zip(leaves, grads))


def separate_reference(inputs, cu, dy, dfinal):
    """The same through the fp64 loop, each sequence alone (its own initial state), outputs concatenated."""
    leaves = {n: t.detach().double().requires_grad_() for n, t in inputs.items()}
    bounds = cu.tolist()
    ys, finals = [], []
    for n, (s, e) in enumerate(zip(bounds[:-1], bounds[1:])):
        rows = {k: leaves[k][:, s:e] for k in ("x", "dt", "B", "C", "z")}
        y, h = ssd_scan_ref(rows["x"], rows["dt"], leaves["A"], rows["B"], rows["C"], D=leaves["D"], z=rows["z"],
                            dt_bias=leaves["dt_bias"], dt_softplus=True,
                            initial_states=leaves["initial_states"][n:n + 1], return_final_states=True)
        ys.append(y)
        finals.append(h[0])
    y, final = torch.cat(ys, 1), torch.stack(finals)
    grads = torch.autograd.grad((y * dy.double()).sum() + (final * dfinal.double()).sum(), list(leaves.values()))
    return y.detach(), final.detach(), dict(zip(leaves, grads))


@pytest.fixture(scope="module")
def packed_case():
    """One packed call's inputs and the fp64 reference for them (the loop over 559 tokens is computed once
    for every chunk size)."""
    inputs, dy, dfinal = packed_inputs(LENGTHS)
    cu = offsets(LENGTHS)
    return inputs, cu, dy, dfinal, separate_reference(inputs, cu, dy, dfinal)


@pytest.mark.parametrize("chunk_size", [16, 32, 64, 128, 256], ids=lambda L: f"chunk{L}")
def test_packed_sequences_match_each_sequence_alone(packed_case, chunk_size):
    """Lengths 1, 64, 65, 129 and 300 packed (so every later sequence starts mid-chunk at chunk 256), each
    with its own initial state: y, the final states and every gradient as the fp64 loop gives them for
    each sequence alone."""
    inputs, cu, dy, dfinal, ref = packed_case
    assert_same_gradients(packed_run(inputs, cu, chunk_size, dy, dfinal), ref, FP32)


def test_packed_empty_sequence_keeps_its_initial_state():
    """A sequence of length 0 ends in the state it starts from, and that state's gradient is the final
    state's; its neighbours are as alone."""
    lengths = (5, 0, 7)
    inputs, dy, dfinal = packed_inputs(lengths)
    out = packed_run(inputs, offsets(lengths), 64, dy, dfinal)
    assert torch.equal(out[1][1], inputs["initial_states"][1])
    assert torch.equal(out[2]["initial_states"][1], dfinal[1])
    nonempty = (5, 7)
    cu = offsets(nonempty)
    kept = {**inputs, "initial_states": inputs["initial_states"][[0, 2]]}
    ref = separate_reference(kept, cu, dy, dfinal[[0, 2]])
    assert_close(out[0], ref[0], FP32, "y")
    for name in ("x", "dt", "B", "C", "z"):
        assert_close(out[2][name], ref[2][name], FP32, f"d{name}")


def test_nan_in_one_sequence_reaches_no_other():
    """A NaN in sequence 1's x (lengths 40, 50, 30: it starts and ends mid-chunk) leaves the other
    sequences' outputs, final states and their rows' gradients (x, dt, B, C, z, initial state) finite;
    the parameters every sequence shares (A, D, dt_bias) take it, as their gradient is a sum."""
    lengths = (40, 50, 30)
    inputs, dy, dfinal = packed_inputs(lengths)
    inputs["x"][0, 40 + 17, 2, 3] = float("nan")
    y, final, grads = packed_run(inputs, offsets(lengths), 64, dy, dfinal)
    others = torch.ones(sum(lengths), dtype=torch.bool, device=DEVICE)
    others[40:90] = False
    assert y[0, 40:90].isnan().any() and not y[0, others].isnan().any()
    assert final[1].isnan().any() and not final[[0, 2]].isnan().any()
    for name in ("x", "dt", "B", "C", "z"):
        assert not grads[name][0, others].isnan().any(), name
    assert not grads["initial_states"][[0, 2]].isnan().any()


BAD_OFFSETS = [   # (offsets, x's batch, message)
    ([1, 5, 10], 1, "cu_seqlens must start at 0"),
    ([0, 5, 9], 1, "cu_seqlens must end at the packed length 10"),
    ([0, 6, 4, 10], 1, "cu_seqlens must be non-decreasing"),
    ([10], 1, "cu_seqlens must hold N \\+ 1 >= 2 offsets"),
    ([0, 5, 10], 2, "x must have batch 1"),
]


@pytest.mark.parametrize("bad,batch,message", BAD_OFFSETS, ids=["start", "end", "decreasing", "one-offset", "batch2"])
def test_bad_offsets_are_refused_by_name(bad, batch, message):
    inputs = make_inputs(Case(T=10, h0=False), Bt=batch)
    with pytest.raises(ValueError, match=message):
        ssd_chunk_scan(*(inputs[n] for n in ("x", "dt", "A", "B", "C")),
                       cu_seqlens=torch.tensor(bad, dtype=torch.int32))


def test_offsets_of_a_wrong_type_or_states_of_a_wrong_count_are_refused():
    inputs = make_inputs(Case(T=10, h0=False))
    args = [inputs[n] for n in ("x", "dt", "A", "B", "C")]
    with pytest.raises(TypeError, match="cu_seqlens has dtype int64"):
        ssd_chunk_scan(*args, cu_seqlens=torch.tensor([0, 10]))
    with pytest.raises(ValueError, match="initial_states"):
        ssd_chunk_scan(*args, initial_states=torch.zeros(1, 4, 8, 16),
                       cu_seqlens=torch.tensor([0, 4, 10], dtype=torch.int32))
