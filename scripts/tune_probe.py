"""Tuning probe for the open performance problems (notes/TUNING.md); GPU only, prints tables.

    python scripts/tune_probe.py fa_host fa_bwd mla fa_mask

fa_host: where the host time of one FlashAttention-2 call goes (tiny shapes).
fa_bwd: the backward at short T (B=1, H=32, D=128) against SDPA flash: through autograd, the
  kernels alone, a CUDA-graph replay (GPU time only), and autograd on one thread.
mla: the Triton MLA decode kernel's tile configurations (TMA and pointer loads) at B=128, H=128, T=8K.
mla_splits: MLA decode on shuffled pages of 64 at B = 8, 32, 64 (T = 8K): the Gluon kernel at the split count
  `_num_splits` picks and at others, graph replays beside FlashMLA, and each launch's GPU time (main, combine).
mla_host: where the host time of a plain paged MLA call at B = 1 goes (64 positions: the GPU is never the
  bottleneck): the whole call, each piece, and Triton's launcher called in leaner ways.
mla_mixed: MLA decode on shuffled pages at B = 64 with lengths drawn from 1K to 16K: the Gluon kernel beside
  FlashMLA (whose schedule gives every SM an equal share of the batch's tiles), graph replays, checked against
  each other first.
mla_ncu [B,T ...]: one plain call each of the book's Gluon MLA decode and FlashMLA's on shuffled pages (at B = 64
  and 8, T = 8K, unless shapes are given, e.g. `mla_ncu 128,32768`), after warm-up, between cudaProfilerStart and
  Stop: the target of `ncu --profile-from-start off --clock-control none`, to read both kernels' counters side by
  side.
mla_variants FILE... [B,T ...] [in_order]: copies of kernels/mla/gluon_decode.py (each a module file), each checked
  against `mla_decode_ref` (dense and paged, lengths that end mid-tile, NaN past them, one and several slices; a
  few long sequences, then 300 short ones) and against the committed kernel, then timed beside it and FlashMLA on
  shuffled pages (graph replays, min of two rounds); with `in_order` also on pages in order, and the committed
  kernel on the dense cache those pages are a view of (the same memory, read without a block table).
fa_mask: what keeping hidden NaN out costs the causal forward: the kernel as it is against a copy whose
  masked path multiplies P and V with a plain `tl.dot` (short lengths, where diagonal blocks weigh most).
m2_step: Mamba-2's decode step at B = 64 (80 and 64 heads x 64 x 128), graph replays, % of the copy ceiling
  measured in the same run: the book's kernel at the tiles `step_tiles` picks and at others.
kda_step: KDA's decode step (H = 32, K = V = 128): at B = 64 the book's kernel against itself at other tiles and
  without its whole-tile (EVEN) and one-token (STEP) variants, graph replays, % of the copy ceiling; at B = 1, 8
  and 64 plain calls (do_bench, and back to back as the chapter times them), the graph replay and the host
  time, and the pieces of a B = 1 call's host time (Triton's launcher given tensors or integer pointers).
kda_prefill: KDA's prefill at T = 4K and 16K, GPU time per kernel, the book's and fla's (torch.profiler).
"""
import importlib.util
import pathlib
import sys
import tempfile
import time

import torch
import triton
import triton.testing

from kernels.bench import time_graph_ms, time_ms
from kernels.common import rel_err
from kernels.flash_attn import backward as fb
from kernels.flash_attn import interface
from kernels.flash_attn.bench import attention_flops
from kernels.flash_attn.forward import attention_fwd
from kernels.flash_attn.interface import flash_attn_func


def _host_us(fn, n=300):
    """Host time of one call, microseconds (tiny shapes: the GPU is never the bottleneck)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


@triton.jit
def _noop1(a):
    pass


@triton.jit
def _noop15(a, b, c, d, e, f, g, h, i0, i1, i2, i3, i4, f0, f1):
    pass


class _Trivial(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        return q.clone()

    @staticmethod
    def backward(ctx, do):
        return do, do, do


def fa_host():
    """Where the host time of a short call goes (tiny shapes)."""
    D = 128
    q, k, v = (torch.randn(1, 64, 1, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    o = flash_attn_func(q, k, v)
    g = torch.randn_like(o)
    _, lse = attention_fwd(q.detach(), k.detach(), v.detach(), False, D ** -0.5)
    ot = _Trivial.apply(q, k, v)
    x = torch.empty(8, device="cuda")
    inside = []
    real_bwd = interface.attention_bwd

    def timed_bwd(*a):
        t0 = time.perf_counter()
        r = real_bwd(*a)
        inside.append(time.perf_counter() - t0)
        return r
    rows = {
        "torch.empty": lambda: torch.empty(1, 64, 1, D, device="cuda"),
        "triton launch, 1 arg": lambda: _noop1[(1,)](x),
        "triton launch, 15 args": lambda: _noop15[(1,)](x, x, x, x, x, x, x, x, 1, 2, 3, 4, 5, 1.0, 2.0),
        "_validate": lambda: interface._validate(q, k, v, False, None),
        "flash_attn_func, no grad": lambda: flash_attn_func(q.detach(), k.detach(), v.detach()),
        "flash_attn_func, grad": lambda: flash_attn_func(q, k, v),
        "attention_bwd": lambda: fb.attention_bwd(g, q.detach(), k.detach(), v.detach(), o.detach(), lse, False,
                                                  D ** -0.5, interface._one_launch(q, k, False)),
        "autograd.grad, trivial Function": lambda: torch.autograd.grad(ot, (q, k, v), g, retain_graph=True),
        "autograd.grad, book": lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True),
    }
    for name, fn in rows.items():
        print(f"host  {name:40s} {_host_us(fn):7.1f} us")
    with torch.autograd.set_multithreading_enabled(False):
        print(f"host  {'autograd.grad, trivial, one thread':40s} "
              f"{_host_us(lambda: torch.autograd.grad(ot, (q, k, v), g, retain_graph=True)):7.1f} us")
        print(f"host  {'autograd.grad, book, one thread':40s} "
              f"{_host_us(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True)):7.1f} us")
    interface.attention_bwd = timed_bwd
    print(f"host  {'autograd.grad, book (again)':40s} "
          f"{_host_us(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True)):7.1f} us, "
          f"of which attention_bwd {sorted(inside)[len(inside) // 2] * 1e6:.1f} us (median)")
    interface.attention_bwd = real_bwd


def fa_bwd():
    """The backward at short T against SDPA flash, through autograd and without it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    torch.manual_seed(0)
    D, H = 128, 32
    for T, causal in ((1024, False), (1024, True), (2048, False), (2048, True), (4096, False), (4096, True)):
        flops = attention_flops(1, H, T, T, D, causal, backward=True)
        q, k, v = (torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        o = flash_attn_func(q, k, v, causal=causal)
        g = torch.randn_like(o)
        qd, kd, vd, od = q.detach(), k.detach(), v.detach(), o.detach()
        _, lse = attention_fwd(qd, kd, vd, causal, D ** -0.5)
        one = interface._one_launch(qd, kd, causal)
        qs, ks, vs = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            os_ = sdpa(qs, ks, vs, is_causal=causal)
        gs = g.transpose(1, 2).contiguous()
        flash_grad = lambda: torch.autograd.grad(os_, (qs, ks, vs), gs, retain_graph=True)  # noqa: E731
        t = {
            "SDPA flash grad": time_ms(flash_grad),
            "book grad": time_ms(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True)),
            "book attention_bwd": time_ms(lambda: fb.attention_bwd(g, qd, kd, vd, od, lse, causal, D ** -0.5, one)),
            "book attention_bwd graph": time_graph_ms(
                lambda: fb.attention_bwd(g, qd, kd, vd, od, lse, causal, D ** -0.5, one)),
        }
        with torch.autograd.set_multithreading_enabled(False):
            t["book grad, one thread"] = time_ms(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True))
            t["SDPA flash grad, one thread"] = time_ms(flash_grad)
        print(f"=== T={T} causal={causal}  ({flops / 1e9:.1f} GFLOP)")
        for name, ms in t.items():
            print(f"  {name:32s} {ms * 1e3:8.1f} us  {flops / ms / 1e9:6.0f} TFLOP/s")


def mla():
    from kernels.launch import LOG2E
    from kernels.mla import decode as md, mla_decode
    B, H, T, DQK, DV = 128, 128, 8192, 576, 512
    torch.manual_seed(0)
    q = torch.randn(B, 1, H, DQK, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(B, T, DQK, device="cuda", dtype=torch.bfloat16)
    lens = torch.full((B,), T, device="cuda", dtype=torch.int32)
    flops = 2.0 * B * H * T * (DQK + DV)
    ms = time_graph_ms(lambda: mla_decode(q, kv, None, lens, check_seqlens=False, backend="triton"))
    print(f"Triton kernel (autotuned, picked {md._mla_decode_tuned.best_config}): {ms:.3f} ms, "
          f"{flops / ms / 1e9:.0f} TFLOP/s")
    out = torch.empty(B, 1, H, DV, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(B, H, 1, device="cuda", dtype=torch.float32)
    for bh, bn, w, s, tma in [(64, 64, 8, 2, True), (64, 64, 8, 2, False), (64, 32, 8, 3, True), (64, 32, 8, 4, True),
                              (64, 128, 8, 1, True), (64, 64, 8, 1, True)]:
        def call():
            md._mla_decode_kernel[(triton.cdiv(H, bh), 1, B)](
                q, kv, lens, lens, out, lse, out, lse, DQK ** -0.5 * LOG2E,
                kv.stride(0), kv.stride(1), 0, 1, S_Q=1, H=H, D_QK=DQK, D_V=DV, PAGE=1, PAGED=False, TMA=tma,
                CAUSAL=False, SPLIT=False, BV=512, BP=64, BX=1, BH=bh, BN=bn, num_warps=w, num_stages=s)
        try:
            ms = time_graph_ms(call)
            print(f"  BH={bh:3d} BN={bn:3d} warps={w:2d} stages={s} TMA={tma}: {ms:.3f} ms  "
                  f"{flops / ms / 1e9:.0f} TFLOP/s")
        except Exception as e:  # noqa: BLE001 - a config that does not fit: say so, go on
            print(f"  BH={bh:3d} BN={bn:3d} warps={w:2d} stages={s} TMA={tma}: {type(e).__name__} {str(e)[:80]}")


def load_module(path):
    """The Python file at `path` as a module named after it (a probe's modified copy of a package file)."""
    spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _forward_without_masking_check():
    """A copy of kernels/flash_attn/forward.py whose causal masked path uses a plain tl.dot for P V."""
    from kernels.flash_attn import forward
    src = pathlib.Path(forward.__file__).read_text().replace("from ..", "from kernels.")
    checked = 'b_acc = dot_visible(b_p.to(b_v.dtype), b_v, b_acc * b_alpha[:, None], "tf32")'
    assert checked in src, "the forward's masked path changed: update this probe"
    path = pathlib.Path(tempfile.mkdtemp()) / "forward_plain_dot.py"
    path.write_text(src.replace(checked, "b_acc = tl.dot(b_p.to(b_v.dtype), b_v, b_acc * b_alpha[:, None])"))
    return load_module(path)


def fa_mask():
    """Causal forward with and without the masking check, twice each, alternating (µs)."""
    import kernels.launch
    from kernels.flash_attn import forward
    plain = _forward_without_masking_check()
    for B, H, T in [(32, 16, 512), (1, 32, 1024), (1, 32, 2048), (1, 32, 4096)]:
        q, k, v = (torch.randn(B, T, H, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        times = {"checked": [], "plain dot": []}
        for _ in range(2):
            for name, module in (("checked", forward), ("plain dot", plain)):
                kernels.launch._VARIANTS.clear()  # the direct-launch cache is keyed by shape, not by module
                times[name].append(time_ms(lambda: module.attention_fwd(q, k, v, True, 128 ** -0.5)) * 1000)
        print(f"B={B} H={H} T={T} causal: " + "  ".join(f"{n} {min(t):.1f} us" for n, t in times.items()))


# ---------------------------------------------------------------- the decode steps' tiles (Mamba-2, KDA)
def _decode_sweep(title, nbytes, variants):
    """Time each (label, call) by graph replay, after checking it against the book's result; print µs and %
    of the copy ceiling measured in this process."""
    from kernels.bench import measure_ceilings
    copy_gbps = measure_ceilings()["peak_gbps"]
    print(f"--- {title}: {nbytes / 1e6:.0f} MB a step, copy ceiling {copy_gbps:.0f} GB/s "
          f"(at the ceiling: {nbytes / copy_gbps / 1e3:.1f} us)")
    for label, call, check in variants:
        try:
            check()
            us = min(time_graph_ms(call) for _ in range(2)) * 1000
            print(f"  {label:40s} {us:7.2f} us  {nbytes / us / 1e3 / copy_gbps * 100:5.1f} % of copy", flush=True)
        except Exception as e:  # noqa: BLE001 - a variant that fails or does not fit: say so, go on
            print(f"  {label:40s} {type(e).__name__}: {str(e)[:100]}", flush=True)


def _book_step_with_tiles(a, BM, units, warps):
    """The book's Mamba-2 step with its tile choice replaced: BM headdim rows, `units` tiles a program."""
    from kernels.mamba2 import decode, selective_state_update
    chosen = decode.step_tiles
    decode.step_tiles = lambda P, N: (BM, chosen(P, N)[1], units, warps)
    try:
        return selective_state_update(**a)
    finally:
        decode.step_tiles = chosen


def m2_step():
    """Mamba-2's decode step at B = 64 (80 and 64 heads x 64 x 128, with D, z, dt_bias, softplus): the book's
    kernel with `step_tiles`' choice against the same kernel at other tiles, rows x tiles per program x warps."""
    from kernels.mamba2 import bench, selective_state_update
    for heads in (80, 64):
        case = {"B": 64, "H": heads, "D": bench.HEADDIM, "dstate": bench.DSTATE, "G": 1}
        torch.manual_seed(0)
        a = bench._step_inputs(case)
        state0 = a["state"].clone()

        def check_with(y_fn, a=a, state0=state0):
            def check():
                a["state"].copy_(state0)
                y_ref = selective_state_update(**a)
                s_ref = a["state"].clone()
                a["state"].copy_(state0)
                y = y_fn()
                # bf16 outputs by relative error: another summation order may round an element one bf16 step
                # the other way
                assert rel_err(y, y_ref) < 1e-2 and (a["state"] - s_ref).abs().max() < 1e-4
            return check

        variants = [("book (step_tiles)", lambda a=a: selective_state_update(**a), lambda: None)]
        for rows, units, warps in ((4, 1, 1), (4, 2, 1), (4, 4, 1), (8, 1, 1), (8, 2, 1), (8, 4, 1), (16, 2, 2)):
            call = (lambda r, n, w, a=a: lambda: _book_step_with_tiles(a, r, n, w))(rows, units, warps)
            variants.append((f"book: {rows} rows x {units} tiles, {warps} warp(s)", call, check_with(call)))
        _decode_sweep(f"Mamba-2 step, B=64 {heads} heads x 64 x 128", bench.step_bytes(case), variants)


# ---------------------------------------------------------------- where a prefill's time goes
def _kernel_times_us(fn, reps=20):
    """GPU time per call of each kernel `fn` launches, in µs (torch.profiler, `reps` calls after a warm-up)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        if event.device_type.name == "CUDA" and event.self_device_time_total > 0:
            times[event.key] = event.self_device_time_total / reps
    return times


def kda_prefill():
    """KDA's prefill (B = 1, H = 32, K = V = 128, bf16) at T = 4K and 16K: the book's launches and fla's,
    GPU µs per call, and both whole calls (plain, as the chapter times them)."""
    from kernels.kda import bench
    for case in (c for c in bench.PREFILL.cases if c["T"] in (4096, 16384)):
        print(f"--- KDA prefill, T = {case['T']}")
        for name, make in (("book", bench._book_chunk), ("fla", bench._fla_chunk)):
            fn = make(case)
            if fn is None:
                print(f"  {name}: not installed")
                continue
            times = _kernel_times_us(fn)
            for kernel, us in sorted(times.items(), key=lambda kv: -kv[1]):
                print(f"  {name:5s} {us:8.1f} us  {kernel[:90]}")
            print(f"  {name:5s} {sum(times.values()):8.1f} us  GPU time in all; plain call {time_ms(fn) * 1000:.1f} us",
                  flush=True)


def kda_step():
    """KDA's step at B = 64: the book's launch against the same kernel at forced (value columns, warps, EVEN,
    STEP); then plain calls (do_bench, as most chapters time them; back to back, as the KDA chapter does),
    graph replay and host time at B = 1, 8, 64, and where a B = 1 call's host time goes."""
    from kernels.bench import time_loop_ms
    from kernels.kda import bench, fused_recurrent as fr
    from kernels.kda import fused_recurrent_kda

    def inputs(B):
        torch.manual_seed(0)
        q, k, v, g, beta = bench._inputs(B, 1, bench.H_DEC, bench.D_DEC)
        return q, k, v, g, beta, torch.randn(B, bench.H_DEC, bench.D_DEC, bench.D_DEC, device="cuda")

    def book(a):
        return lambda: fused_recurrent_kda(*a[:5], initial_state=a[5], output_final_state=True,
                                           use_qk_l2norm_in_kernel=True)

    def forced(a, BN, warps, even, step):
        q, k, v, g, beta, S = a
        o, ht = torch.empty_like(v), torch.empty_like(S)

        def call():
            fr.launch_step(fr._fused_recurrent_kda_kernel, "kda probe", (q, k, v, g, beta), o, q.shape[-1] ** -0.5,
                           S, ht, key=(g.dtype, beta.dtype, even, step), tiles=[(q.shape[-1], BN, warps, 1)],
                           L2NORM=True, EPS=fr.L2NORM_EPS, EVEN=even, STEP=step)
            return o, ht
        return call

    def check_with(a, call):
        def check():
            o_ref, S_ref = book(a)()
            o, S = call()
            assert rel_err(o, o_ref) < 1e-2 and rel_err(S, S_ref) < 1e-5
        return check

    case = {"B": 64, "H": bench.H_DEC, "D": bench.D_DEC}
    a = inputs(64)
    variants = [("book (kda_step_tiles)", book(a), lambda: None)]
    for BN, warps, even, step in ((16, 1, False, False), (16, 1, True, False), (16, 1, False, True),
                                  (16, 1, True, True), (8, 1, True, True), (32, 1, True, True), (32, 2, False, False),
                                  (32, 2, True, True), (16, 2, True, True), (64, 4, True, True)):
        call = forced(a, BN, warps, even, step)
        variants.append((f"{BN} cols, {warps} warp(s), EVEN={even:d} STEP={step:d}", call, check_with(a, call)))
    _decode_sweep("KDA step, B=64, 32 heads x 128 x 128", bench.STEP_BYTES(case), variants)

    print("--- KDA step: plain (do_bench) / back to back / graph replay / host time per call, us")
    for B in (1, 8, 64):
        fn = book(inputs(B))
        plain, loop, graph = time_ms(fn) * 1000, time_loop_ms(fn) * 1000, time_graph_ms(fn) * 1000
        print(f"  B={B:3d}  plain {plain:7.2f}  back to back {loop:7.2f}  graph {graph:7.2f}  "
              f"({loop / graph:.2f}x)  host {_host_us(fn):7.2f}", flush=True)
    _kda_host_parts(inputs(1), book)


def _kda_host_parts(a, book):
    """Where a B = 1 step's host time goes: each piece of the wrapper alone (µs a call), then the whole call
    under cProfile (the functions with the most time of their own)."""
    import cProfile
    import pstats

    from kernels import launch as launch_module
    from kernels.kda import fused_recurrent as fr
    from kernels.kda.interface import _checked
    q, k, v, g, beta, S = a
    o, ht = torch.empty_like(v), torch.empty_like(S)
    whole = book(a)
    whole()
    key = next(key for key in launch_module._VARIANTS if key[0] == "kda step")
    _, c, tail = launch_module._VARIANTS[key]
    args = (q, k, v, g, beta, o, S, ht, q.shape[-1] ** -0.5, 1, q.shape[2])
    ints = [x.data_ptr() if isinstance(x, torch.Tensor) else x for x in args]
    grid = (launch_module.cdiv(v.shape[-1], key[-1][1]), q.shape[0] * q.shape[2], 1)
    stream = torch.cuda.current_stream().cuda_stream
    parts = {
        "whole call": whole,
        "input checks (_checked)": lambda: _checked(q, k, v, g, beta, None, S, True, True),
        "two torch.empty": lambda: (torch.empty_like(v), torch.empty_like(S)),
        "fused_recurrent_fwd (launch_step)": lambda: fr.fused_recurrent_fwd(q, k, v, g, beta, o, 0.1, S, ht, True),
        "compiled[grid](*args), as launch does": lambda: c[grid](*args, *tail),
        "Triton's launcher, tensors": lambda: c.run(*grid, stream, c.function, c.packed_metadata, None, None, None,
                                                    *args, *tail),
        "Triton's launcher, integer pointers": lambda: c.run(*grid, stream, c.function, c.packed_metadata, None,
                                                             None, None, *ints, *tail),
        "torch.cuda.current_device": torch.cuda.current_device,
    }
    print("--- KDA step at B = 1: host time of each piece, us")
    for label, fn in parts.items():
        print(f"  {label:40s} {_host_us(fn, n=2000):7.2f}", flush=True)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        whole()
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(16)


def _mla_planned_splits(case, device):
    """The slice count `mla_decode` picks for a benchmark case of the MLA decode on this GPU."""
    from kernels.launch import sm_count
    from kernels.mla import planning
    return planning.num_splits(case["B"], case["H"] // planning.PLAN_HEAD_BLOCK, case["T"], sm_count(device))


def mla_splits():
    """The Gluon MLA decode on shuffled pages at B = 8, 32, 64, T = 8K: graph-replayed time and each kernel's
    GPU time (torch.profiler) at every split count worth trying, the cost model's pick marked, and FlashMLA's
    replayed time on the same pages."""
    from kernels.mla import bench as mla_bench
    from kernels.mla import interface
    for B in (8, 32, 64):
        case = mla_bench._paged_case(B, 8192, "shuffled")
        q, _, pages, table, seqlens = mla_bench._paged_inputs(case)
        picked = _mla_planned_splits(case, q.device)
        flash = mla_bench._flashmla_paged(case)
        flash_ms = time_graph_ms(flash) if flash is not None else float("nan")
        print(f"--- MLA paged decode, B = {B}, T = 8K, shuffled: FlashMLA {flash_ms * 1000:.1f} us replayed; "
              f"num_splits picks {picked}", flush=True)
        for splits in sorted({1, 2, 3, 4, 6, 8, 12, 16, picked}):
            def call(splits=splits):
                return interface.mla_decode(q, pages, table, seqlens, softmax_scale=mla_bench.SCALE,
                                            check_seqlens=False, num_splits=splits)
            ms = time_graph_ms(call)
            kernels = ", ".join(f"{name[:40]} {us:.1f}" for name, us in
                                sorted(_kernel_times_us(call).items(), key=lambda kv: -kv[1]))
            print(f"  {splits:3d} slices{' (picked)' if splits == picked else '':9s} {ms * 1000:7.1f} us "
                  f"({flash_ms / ms:.2f}x FlashMLA's speed); GPU us per kernel: {kernels}", flush=True)


def mla_mixed():
    """Lengths that differ: 64 sequences of 1K to 16K positions on shuffled pages. FlashMLA's schedule gives
    every SM an equal share of the tiles whatever the lengths; the book's kernel gives each CTA a sequence."""
    from kernels import peers
    from kernels.mla import bench as mla_bench
    from kernels.mla import interface
    case = mla_bench._paged_case(64, 16384, "shuffled")
    q, _, pages, table, _ = mla_bench._paged_inputs(case)
    torch.manual_seed(3)
    seqlens = torch.randint(1024, 16385, (64,), device="cuda", dtype=torch.int32)
    run = peers.flashmla("flash_mla_with_kvcache")
    sched, _ = peers.flashmla("get_mla_metadata")()

    def flash():
        return run(q, pages.unsqueeze(2), table, seqlens, mla_bench.D_C, sched, None, softmax_scale=mla_bench.SCALE,
                   causal=False)

    def book():
        return interface.mla_decode(q, pages, table, seqlens, softmax_scale=mla_bench.SCALE, check_seqlens=False)
    (o_f, _), (o_b, _) = flash(), book()
    err = ((o_b.float() - o_f.float()).norm() / o_f.float().norm()).item()
    t_f, t_b = time_graph_ms(flash), time_graph_ms(book)
    print(f"--- MLA paged decode, B = 64, lengths 1K-16K (total {int(seqlens.sum())}), shuffled: "
          f"book {t_b * 1e3:.1f} us, FlashMLA {t_f * 1e3:.1f} us ({t_f / t_b:.2f}x FlashMLA's speed); "
          f"rel diff {err:.1e}", flush=True)


def mla_host():
    """Host time of a plain Gluon MLA call at B = 1 (one page, so the GPU is never the bottleneck), piece by piece,
    each launch both ways: through `kernels.launch.DirectLaunch` (the book's path) and through Triton's runner,
    `compiled[grid]` (with the TMA scratch allocated per launch); then plain calls back to back against replays."""
    from kernels import launch as launch_module
    from kernels.bench import time_loop_ms
    from kernels.launch import LOG2E, tma_scratch
    from kernels.mla import bench as mla_bench
    from kernels.mla import decode, gluon_decode, interface, planning
    from kernels.mla.inputs import check_decode_inputs

    def inputs(B, T):
        q, _, pages, table, seqlens = mla_bench._paged_inputs(mla_bench._paged_case(B, T, "shuffled"))
        return q, pages, table, seqlens
    q, pages, table, seqlens = inputs(1, 64)
    scale, splits = mla_bench.SCALE, 4
    B, _, H, _ = q.shape
    out, lse = interface.mla_decode(q, pages, table, seqlens, softmax_scale=scale, num_splits=splits,
                                    check_seqlens=False)
    ws_o, ws_lse = planning.workspace(B, H, splits, 512, q.device)
    direct = {kernel: launcher for (kernel, _), launcher in launch_module._DIRECT.items()}
    gluon, combine = direct[gluon_decode._mla_decode_ws_kernel], direct[decode._mla_combine_kernel]
    gargs = (q, pages, seqlens, table, out, lse, ws_o, ws_lse, scale * LOG2E, pages.shape[0] * 64,
             pages.stride(0), pages.stride(1), table.stride(0), splits)
    cargs = (ws_o, ws_lse, out, lse, splits)

    def triton_runner(direct, grid, args):
        with tma_scratch():
            direct._compiled[grid](*args, *direct._constexprs)
    pieces = {
        "whole call (check_seqlens=False)": lambda: interface.mla_decode(q, pages, table, seqlens, softmax_scale=scale,
                                                                         num_splits=splits, check_seqlens=False),
        "check_decode_inputs (cached)": lambda: check_decode_inputs(q, pages, table, seqlens, 512, scale, kernel=True),
        "gluon_misfit": lambda: planning.gluon_misfit(q, pages, table, 512),
        "two torch.empty": lambda: (torch.empty(B, 1, H, 512, device="cuda", dtype=q.dtype),
                                    torch.empty(B, H, 1, device="cuda", dtype=torch.float32)),
        "workspace": lambda: planning.workspace(B, H, splits, 512, q.device),
        "launch_gluon (direct)": lambda: gluon_decode.launch_gluon(q, pages, table, seqlens, scale, out, lse, ws_o,
                                                                   ws_lse, splits),
        "launch_combine (direct)": lambda: decode.launch_combine(ws_o, ws_lse, out, lse, splits),
        "Gluon kernel through Triton's runner": lambda: triton_runner(gluon, (H // 64, splits, B), gargs),
        "combine through Triton's runner": lambda: triton_runner(combine, (B * H, 1, 1), cargs),
    }
    print(f"--- MLA plain call, paged, B = 1, T = 64, {splits} slices: host time of each piece, us")
    for label, fn in pieces.items():
        print(f"  {label:44s} {_host_us(fn, n=2000):7.2f}", flush=True)
    for B, T in ((1, 8192), (1, 16384), (8, 8192)):
        q2, p2, t2, s2 = inputs(B, T)

        def call():
            return interface.mla_decode(q2, p2, t2, s2, softmax_scale=scale, check_seqlens=False)
        loop, replay = time_loop_ms(call), time_graph_ms(call)
        print(f"  B = {B}, T = {T}: back to back {loop * 1e3:.1f} us, replayed {replay * 1e3:.1f} us "
              f"({loop / replay:.2f}x)", flush=True)


def mla_ncu(*shapes):
    """The calls `ncu --profile-from-start off` profiles: the book's and FlashMLA's at each "B,T" of `shapes`
    (B = 64 and 8 at T = 8K if none is given)."""
    from kernels.mla import bench as mla_bench
    from kernels.mla import interface
    calls = []
    for B, T in [tuple(map(int, shape.split(","))) for shape in shapes] or [(64, 8192), (8, 8192)]:
        case = mla_bench._paged_case(B, T, "shuffled")
        q, _, pages, table, seqlens = mla_bench._paged_inputs(case)
        flash = mla_bench._flashmla_paged(case)

        def book(q=q, pages=pages, table=table, seqlens=seqlens):
            return interface.mla_decode(q, pages, table, seqlens, softmax_scale=mla_bench.SCALE, check_seqlens=False)
        for _ in range(3):   # compiled, launched directly, caches warm
            book(), flash()
        calls += [book, flash]
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("mla_ncu: profiled", len(calls), "calls", flush=True)


def mla_variants(*args):
    """Variants of the Gluon MLA kernel (module files with its `launch_gluon`) against the committed one, at the
    shapes given as "B,T" among the arguments (the chapter's paged table up to B = 128, 8K if none is)."""
    paths = [a for a in args if a.endswith(".py")]
    orders = ["shuffled"] + (["in order"] if "in_order" in args else [])
    shapes = [tuple(map(int, a.split(","))) for a in args if "," in a]
    from kernels.mla import bench as mla_bench
    from kernels.mla import decode, gluon_decode, planning
    from kernels.mla.reference import mla_decode_ref
    variants = {"committed": gluon_decode, **{pathlib.Path(p).stem: load_module(p) for p in paths}}

    def run(module, q, cache, seqlens, table, splits):
        B, _, H, _ = q.shape
        out = torch.empty(B, 1, H, 512, device=q.device, dtype=q.dtype)
        lse = torch.empty(B, H, 1, device=q.device, dtype=torch.float32)
        ws_o, ws_lse = planning.workspace(B, H, splits, 512, q.device) if splits > 1 else (None, None)
        module.launch_gluon(q, cache, table, seqlens, mla_bench.SCALE, out, lse, ws_o, ws_lse, splits)
        if splits > 1:
            decode.launch_combine(ws_o, ws_lse, out, lse, splits)
        return out, lse

    def inputs(lens, T):
        """q, a dense cache with NaN past every length, the same cache in shuffled pages, its block table."""
        B = len(lens)
        seqlens = torch.tensor(lens, device="cuda", dtype=torch.int32)
        q = torch.randn(B, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
        dense = torch.randn(B, T, 576, device="cuda", dtype=torch.bfloat16)
        for b, n in enumerate(lens):
            dense[b, n:] = float("nan")
        pages, table = mla_bench.shuffled_pages(dense.view(-1, mla_bench.PAGE, 576), B)
        return q, dense, pages, table, seqlens

    torch.manual_seed(1)
    # Few long sequences, then many short ones of every tile count's parity: more work items than SMs, so a
    # kernel whose CTAs take items in turn meets items of odd and even tile counts, and empty slices, in a row.
    cases = [([1, 63, 65, 640, 4097, 8000], 8192, (1, 3, 16)),
             (torch.randint(1, 700, (300, )).tolist(), 704, (1, 3))]
    for name, module in list(variants.items()):
        worst, same, lse_worst, finite = 0.0, True, 0.0, True
        for lens, T, all_splits in cases:
            q, dense, pages, table, seqlens = inputs(lens, T)
            ref, ref_lse = mla_decode_ref(q, dense, None, seqlens, softmax_scale=mla_bench.SCALE)
            for cache, bt in ((dense, None), (pages, table)):
                for splits in all_splits:
                    out, lse = run(module, q, cache, seqlens, bt, splits)
                    mine, _ = run(gluon_decode, q, cache, seqlens, bt, splits)
                    # (max() would drop a NaN error: NaN is tracked on its own)
                    finite = finite and bool(out.isfinite().all()) and bool(lse.isfinite().all())
                    worst = max(worst, rel_err(out.float(), ref.float()))
                    lse_worst = max(lse_worst, rel_err(lse, ref_lse.float()))
                    same = same and torch.equal(out, mine)
        right = finite and worst < 5e-3 and lse_worst < 1e-4
        print(f"  {name:24s} {'right' if right else 'WRONG, not timed'}: worst rel err {worst:.1e} (lse "
              f"{lse_worst:.1e}); bit-identical to the committed kernel: {same}", flush=True)
        if not right:
            del variants[name]
    for order in orders:
        # In order, the pages are the dense cache's memory: the committed kernel on that dense cache is timed too.
        dense_col = ["committed, dense"] if order == "in order" else []
        print(f"--- paged, {order}, graph replays, us (min of two rounds), speed ratio to FlashMLA in brackets")
        print(f"  {'B, T':10s} {'FlashMLA':>9s} " + " ".join(f"{n[:22]:>22s}" for n in [*variants, *dense_col]))
        for B, T in shapes or ((1, 8192), (8, 8192), (32, 8192), (64, 8192), (128, 4096), (128, 8192)):
            case = mla_bench._paged_case(B, T, order)
            q, dense, pages, table, seqlens = mla_bench._paged_inputs(case)
            splits = _mla_planned_splits(case, q.device)
            flash = mla_bench._flashmla_paged(case)
            calls = {n: (lambda m=m: run(m, q, pages, seqlens, table, splits)) for n, m in variants.items()}
            if dense_col:
                calls[dense_col[0]] = lambda: run(gluon_decode, q, dense, seqlens, None, splits)
            best = {n: float("inf") for n in calls}
            f_us = float("inf")
            for _ in range(2):
                f_us = min(f_us, time_graph_ms(flash) * 1e3) if flash is not None else float("nan")
                for n, c in calls.items():
                    best[n] = min(best[n], time_graph_ms(c) * 1e3)
            print(f"  {B:3d}, {T:5d} {f_us:9.1f} " + " ".join(f"{best[n]:12.1f} ({f_us / best[n]:.3f})" for n in calls),
                  flush=True)
            del q, dense, pages, table, seqlens, flash, calls


if __name__ == "__main__":
    if sys.argv[1:2] in (["mla_variants"], ["mla_ncu"]):   # these take arguments: files, shapes
        {"mla_variants": mla_variants, "mla_ncu": mla_ncu}[sys.argv[1]](*sys.argv[2:])
        sys.exit()
    for part in sys.argv[1:]:
        {"fa_host": fa_host, "fa_bwd": fa_bwd, "mla": mla, "fa_mask": fa_mask, "m2_step": m2_step,
         "kda_step": kda_step, "mla_splits": mla_splits, "mla_mixed": mla_mixed, "mla_host": mla_host,
         "kda_prefill": kda_prefill}[part]()
