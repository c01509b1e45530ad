"""Tuning probe for the open performance problems (notes/TUNING.md); GPU only, prints tables.

    python scripts/tune_probe.py fa_host fa_bwd fa_mask
    python scripts/tune_probe.py fa_gluon      # the next GPU session's first call
    python scripts/tune_probe.py fa_gluon_bwd  # the Gluon backward: right, then timed

fa_host: where the host time of one FlashAttention-2 call goes (tiny shapes).
fa_bwd: the backward at short T (B=1, H=32, D=128) against SDPA flash: through autograd, the
  kernels alone, a CUDA-graph replay (GPU time only), and autograd on one thread.
mla_splits: MLA decode on shuffled pages of 64 at B = 8, 32, 64 (T = 8K): the Gluon kernel at the split count
  `mla_decode` picks and at others, graph replays beside FlashMLA, and each launch's GPU time (main, combine).
mla_mixed: MLA decode on shuffled pages at B = 64 with lengths drawn from 1K to 16K: the Gluon kernel beside
  FlashMLA (whose schedule gives every SM an equal share of the batch's tiles), graph replays, checked against
  each other first.
mla_ncu [B,T ...]: one plain call each of the book's Gluon MLA decode and FlashMLA's on shuffled pages (at B = 64
  and 8, T = 8K, unless shapes are given, e.g. `mla_ncu 128,32768`), after warm-up, between cudaProfilerStart and
  Stop: the target of `ncu --profile-from-start off --clock-control none`, to read both kernels' counters side by
  side.
mla_variants FILE... [B,T ...] [in_order]: copies of attention_kernels/mla/gluon_decode.py (each a module file), each checked
  against `mla_decode_ref` (dense and paged, lengths that end mid-tile, NaN past them, one and several slices; a
  few long sequences, then 300 short ones) and against the committed kernel, then timed beside it and FlashMLA on
  shuffled pages (graph replays, min of two rounds); with `in_order` also on pages in order, and the committed
  kernel on the dense cache those pages are a view of (the same memory, read without a block table).
fa_mask: what keeping hidden NaN out costs the causal forward: the kernel as it is against a copy whose
  masked path multiplies P and V with a plain `tl.dot` (short lengths, where diagonal blocks weigh most).
fa_gluon: the Gluon FlashAttention forward for Hopper (attention_kernels/flash_attn/gluon_forward.py; its timings are
  flash_attn/interface.py's GLUON_FWD_MEASURED, which the dispatch reads), its three loops (in order, overlapped,
  ping-pong): each checked against the fp64 formula on 3 shapes (a wrong one is not timed), then timed beside the
  Triton forward, SDPA cuDNN and flash, and FA4 where it imports, at B = 4, H = 32, D = 128, T = 2K to 16K, causal
  and not: TFLOP/s and the in-order loop's speed ratio to each. One table, about a minute.
fa_gluon_bwd: the Gluon FlashAttention backward for Hopper (attention_kernels/flash_attn/gluon_backward.py: a Gluon
  dK/dV kernel beside the Triton dQ pass, or beside the Gluon dQ kernel, gluon_dq.py), both forms checked against
  the fp64 formula on 3 shapes (a wrong one is not timed), then timed beside the Triton backward and cuDNN's (SDPA)
  at B = 4, H = 32, D = 128, T = 512 to 16K, causal and not: TFLOP/s and the Gluon backward's speed ratio to each
  (interface.GLUON_BWD_MEASURED's source); last, each kernel's GPU time in both forms at T = 4K and 16K.
kda_step: KDA's decode step (H = 32, K = V = 128) at B = 1, 8 and 64: single calls with L2 flushed (do_bench),
  calls back to back (as the chapter times plain calls), the graph replay, and the host time of a call.

Only the package's public names are used (tests/test_package.py checks it), but for the split count
`mla_decode` picks, until the MLA package makes it public, the warps of Mamba-2's dq/dk kernels, which
ssd_dqk_configs changes, the chunk length from which Mamba-2's state pass splits, which ssd_state_split changes, and
the sub-chunk dq/dk kernel's key tile and warps, which gla_intra_configs changes.
train_kernels [mamba2] [gla] [kda]: where a training step's GPU time goes at 16K, per kernel (torch.profiler), the
  book's and its peer's.
train_ncu: one training step each of the book's Mamba-2 and GLA (B = 1, T = 16K) between cudaProfilerStart and
  Stop, after warm-up: the target of `ncu --profile-from-start off -k regex:'^_(chunk|ssd)'`.
kda_prefill: KDA's prefill at T = 4K and 16K, GPU time per kernel, the book's and fla's (torch.profiler).
ssd_dqk_configs: Mamba-2's dq/dk launches (the intra-chunk kernel, then the key tiles), as launched, with the
  intra kernel on 8 warps, and with both on 8, the backward alone at 16K: checked against each other, then the
  dq/dk kernels' and the backward's GPU time (~30 s).
gla_intra_configs: GLA's sub-chunk dq/dk kernel (`_chunk_dqk_intra_kernel`) as launched (key tiles of 32 on 2
  warps), over all 128 key channels on 8 warps and on key tiles of 64 and 32 on 4 warps, in the backward of a GLA
  training step at 16K (B 1, 32 heads, K = V = 128, bf16): gradients checked against the first config's, then
  the kernel's and the backward's GPU time (~30 s).
delta_state_grad: KDA's backward at 16K with the delta rule's reverse state pass as launched (key halves of 64) and
  as one tile and in halves at two other (BV, warps, stages), each variant in its own process: gradients checked
  against the launched pass's, then the pass's and the backward's GPU time (~1 min).
kda_solve_precision: KDA's in-chunk solve for bf16 inputs in TF32 (as launched) and in IEEE fp32, at 16K: the
  output's and the gradients' errors against the fp32 step, the solve's and the forward's GPU time (~30 s).
ssd_state_split: Mamba-2's state pass at chunks of 64 (what the backward and the book's forward take) at 16K, the
  sequential pass against the split (chunk states all at once, then the walk), states in bf16 and fp32: checked
  against each other, then each launch's GPU time (~20 s).
"""
import importlib.util
import pathlib
import sys
import tempfile
import time

import torch
import triton
import triton.testing

from attention_kernels.bench import time_graph_ms, time_ms
from attention_kernels.common import rel_err
from attention_kernels.flash_attn import backward as fb
from attention_kernels.flash_attn import interface
from attention_kernels.flash_attn.bench import attention_flops
from attention_kernels.flash_attn.forward import attention_fwd
from attention_kernels.flash_attn.interface import ONE_LAUNCH_MAX_FLOPS, flash_attn_func


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


def _one_launch(q, k, causal):
    """Whether flash_attn_func's backward runs as one launch at this shape (ONE_LAUNCH_MAX_FLOPS)."""
    B, T, H, D = q.shape
    return attention_flops(B, H, T, k.shape[1], D, causal, backward=True) < ONE_LAUNCH_MAX_FLOPS


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
        "flash_attn_func, no grad": lambda: flash_attn_func(q.detach(), k.detach(), v.detach()),
        "flash_attn_func, grad": lambda: flash_attn_func(q, k, v),
        "attention_bwd": lambda: fb.attention_bwd(g, q.detach(), k.detach(), v.detach(), o.detach(), lse, False,
                                                  D ** -0.5, _one_launch(q, k, False)),
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
        one = _one_launch(qd, kd, causal)
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


def load_module(path):
    """The Python file at `path` as a module named after it (a probe's modified copy of a package file)."""
    spec = importlib.util.spec_from_file_location(pathlib.Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _forward_without_masking_check():
    """A copy of attention_kernels/flash_attn/forward.py whose causal masked path uses a plain tl.dot for P V."""
    from attention_kernels.flash_attn import forward
    src = pathlib.Path(forward.__file__).read_text().replace("from ..", "from attention_kernels.")
    checked = 'b_acc = dot_visible(b_p.to(b_v.dtype), b_v, b_acc * b_alpha[:, None], "tf32")'
    assert checked in src, "the forward's masked path changed: update this probe"
    path = pathlib.Path(tempfile.mkdtemp()) / "forward_plain_dot.py"
    path.write_text(src.replace(checked, "b_acc = tl.dot(b_p.to(b_v.dtype), b_v, b_acc * b_alpha[:, None])"))
    return load_module(path)


def fa_mask():
    """Causal forward with and without the masking check, twice each, alternating (µs)."""
    import attention_kernels.launch
    from attention_kernels.flash_attn import forward
    plain = _forward_without_masking_check()
    # the direct-launch cache is keyed by shape, not by module: the copy's launches get keys of their own
    plain.launch = lambda kernel, grid, candidates, key, *args, **constexprs: attention_kernels.launch.launch(
        kernel, grid, candidates, ("plain dot", key), *args, **constexprs)
    for B, H, T in [(32, 16, 512), (1, 32, 1024), (1, 32, 2048), (1, 32, 4096)]:
        q, k, v = (torch.randn(B, T, H, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        times = {"checked": [], "plain dot": []}
        for _ in range(2):
            for name, module in (("checked", forward), ("plain dot", plain)):
                times[name].append(time_ms(lambda: module.attention_fwd(q, k, v, True, 128 ** -0.5)) * 1000)
        print(f"B={B} H={H} T={T} causal: " + "  ".join(f"{n} {min(t):.1f} us" for n, t in times.items()))


# The Gluon forward's consumer loops (the table's columns), as `gluon_attention_fwd` takes them.
GLUON_LOOPS = {"Gluon": dict(overlap=False), "Gluon overlapped": dict(overlap=True),
               "Gluon ping-pong": dict(pingpong=True)}


def fa_gluon():
    """The Gluon forward's loops: each right first (3 shapes against the fp64 formula, o and the base-2 lse; a
    wrong one is left out of the table, and nothing is timed if the in-order loop is wrong), then one table of
    TFLOP/s (bf16, B = 4, H = 32, D = 128, do_bench medians) and the in-order loop's speed ratio to each."""
    from attention_kernels import peers
    from attention_kernels.flash_attn import attention_ref, gluon_forward

    wrong = set()
    for B, T, S, HQ, HKV, D, causal in [(2, 1000, 1000, 8, 2, 128, True), (1, 4100, 4100, 4, 4, 64, False),
                                        (2, 300, 77, 8, 2, 128, True)]:
        q = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = torch.randn(2, B, S, HKV, D, device="cuda", dtype=torch.bfloat16)
        ref = attention_ref(q, k, v, causal=causal, compute_dtype=torch.float64, out_dtype=torch.float64)
        _, lse_triton = attention_fwd(q, k, v, causal, D ** -0.5)
        for loop, keywords in GLUON_LOOPS.items():
            o, lse = gluon_forward.gluon_attention_fwd(q, k, v, causal, D ** -0.5, **keywords)
            # rows with no key to attend (causal, T > S) have lse -inf in both: compared as a pattern
            finite = torch.isfinite(lse_triton)
            same_empty_rows = torch.equal(torch.isfinite(lse), finite)
            err, lse_err = rel_err(o, ref), (lse - lse_triton)[finite].abs().max().item()
            right = not torch.isnan(o).any() and err < 1e-2 and lse_err < 1e-3 and same_empty_rows
            print(f"B={B} T={T} S={S} H={HQ}/{HKV} D={D} causal={causal} {loop}: rel err {err:.1e}, "
                  f"lse vs Triton {lse_err:.1e}: {'right' if right else 'WRONG'}", flush=True)
            if not right:
                wrong.add(loop)
    if wrong:
        print(f"wrong, not timed: {', '.join(sorted(wrong))}")
    if "Gluon" in wrong:
        return
    cudnn, flash, fa4 = peers.sdpa("cuDNN"), peers.sdpa("flash"), peers.fa4()
    B, H, D = 4, 32, 128
    names = ([n for n in GLUON_LOOPS if n not in wrong] + ["Triton", "cuDNN", "SDPA flash"]
             + (["FA4"] if fa4 else []))
    print(f"bf16, B={B} H={H} D={D}: TFLOP/s; in brackets the Gluon kernel's speed ratio to it")
    print(f"  {'T':>6s} {'causal':>6s} " + " ".join(f"{n:>16s}" for n in names))
    for causal in (False, True):
        for T in (512, 1024, 2048, 4096, 8192, 16384):
            q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            calls = {n: (lambda kw=kw: gluon_forward.gluon_attention_fwd(q, k, v, causal, D ** -0.5, **kw))
                     for n, kw in GLUON_LOOPS.items() if n not in wrong}
            calls |= {"Triton": lambda: attention_fwd(q, k, v, causal, D ** -0.5),
                      "cuDNN": lambda: cudnn(qt, kt, vt, causal=causal),
                      "SDPA flash": lambda: flash(qt, kt, vt, causal=causal)}
            if fa4:
                calls["FA4"] = lambda: fa4(q, k, v, causal=causal)
            flops = attention_flops(B, H, T, T, D, causal)
            tflops = {n: flops / (time_ms(c) * 1e-3) / 1e12 for n, c in calls.items()}
            print(f"  {T:6d} {str(causal):>6s} " + " ".join(
                f"{tflops[n]:8.0f} ({tflops['Gluon'] / tflops[n]:4.2f})" for n in names), flush=True)
            del q, k, v, qt, kt, vt



# The two forms of the Gluon backward's dQ pass (the table's Gluon columns), as `gluon_attention_bwd` takes them:
# the Triton dQ pass, or the Gluon dQ kernel (`gluon_dq.py`), each beside the Gluon dK/dV kernel.
GLUON_BWD_DQ = {"Gluon": dict(dq_kernel="triton"), "Gluon dQ": dict(dq_kernel="gluon")}


def fa_gluon_bwd():
    """The Gluon backward (its dK/dV kernel beside the Triton dQ pass, or beside the Gluon dQ kernel): right first
    (3 shapes, dq, dk, dv against autograd through the fp64 formula; a wrong dQ form is left out of the table, and
    nothing is timed if the Triton one's is wrong), then one table of TFLOP/s (bf16, B = 4, H = 32, D = 128,
    do_bench medians, the backward's 2.5x FLOPs) beside the Triton backward (launched as flash_attn_func launches
    it) and cuDNN's (SDPA, autograd.grad on a kept graph: the backward alone), with the Gluon backward's speed
    ratio to each; last, each kernel's GPU time in both forms at T = 4K and 16K (the dQ pass's share)."""
    from attention_kernels import peers
    from attention_kernels.common import tolerance
    from attention_kernels.flash_attn import attention_ref, gluon_backward

    tol = 3 * tolerance(torch.bfloat16, tf32_dots=True)   # the Triton backward's (tests/test_flash_attn.py)
    wrong = set()
    for B, T, S, HQ, HKV, D, causal in [(2, 1000, 1000, 8, 2, 128, True), (1, 4100, 4100, 4, 4, 64, False),
                                        (2, 300, 77, 8, 1, 128, True)]:
        q = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16)
        k, v = torch.randn(2, B, S, HKV, D, device="cuda", dtype=torch.bfloat16)
        do = torch.randn_like(q)
        o, lse = attention_fwd(q, k, v, causal, D ** -0.5)
        qr, kr, vr = (t.double().requires_grad_() for t in (q, k, v))
        refs = torch.autograd.grad(attention_ref(qr, kr, vr, causal=causal, compute_dtype=torch.float64),
                                   (qr, kr, vr), do.double())
        for form, keywords in GLUON_BWD_DQ.items():
            grads = gluon_backward.gluon_attention_bwd(do, q, k, v, o, lse, causal, D ** -0.5, **keywords)
            errs = [rel_err(g, r) for g, r in zip(grads, refs)]
            right = not any(torch.isnan(g).any() for g in grads) and max(errs) <= tol
            print(f"B={B} T={T} S={S} H={HQ}/{HKV} D={D} causal={causal} {form}: rel err dq {errs[0]:.1e} "
                  f"dk {errs[1]:.1e} dv {errs[2]:.1e}: {'right' if right else 'WRONG'}", flush=True)
            if not right:
                wrong.add(form)
    if wrong:
        print(f"wrong, not timed: {', '.join(sorted(wrong))}")
    if "Gluon" in wrong:
        return
    cudnn = peers.sdpa("cuDNN")
    B, H, D = 4, 32, 128
    forms = [n for n in GLUON_BWD_DQ if n not in wrong]
    names = forms + ["Triton", "cuDNN"]
    print(f"bf16, B={B} H={H} D={D}, backward: TFLOP/s; in brackets the Gluon backward's speed ratio to it")
    print(f"  {'T':>6s} {'causal':>6s} " + " ".join(f"{n:>18s}" for n in names))
    for causal in (False, True):
        for T in (512, 1024, 2048, 4096, 8192, 16384):
            q, k, v, do = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            o, lse = attention_fwd(q, k, v, causal, D ** -0.5)
            one = _one_launch(q, k, causal)
            qs, ks, vs = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
            os_ = cudnn(qs, ks, vs, causal=causal)
            dos = do.transpose(1, 2)
            calls = {n: (lambda kw=GLUON_BWD_DQ[n]: gluon_backward.gluon_attention_bwd(do, q, k, v, o, lse, causal,
                                                                                      D ** -0.5, **kw))
                     for n in forms}
            calls |= {"Triton": lambda: fb.attention_bwd(do, q, k, v, o, lse, causal, D ** -0.5, one),
                      "cuDNN": lambda: torch.autograd.grad(os_, (qs, ks, vs), dos, retain_graph=True)}
            flops = attention_flops(B, H, T, T, D, causal, backward=True)
            tflops = {n: flops / (time_ms(c) * 1e-3) / 1e12 for n, c in calls.items()}
            print(f"  {T:6d} {str(causal):>6s} " + " ".join(
                f"{tflops[n]:11.0f} ({tflops['Gluon'] / tflops[n]:4.2f})" for n in names), flush=True)
            del q, k, v, do, o, lse, qs, ks, vs, os_, dos, calls
    print("GPU us per backward, kernel by kernel (torch.profiler): the dQ pass (Triton or Gluon), the dK/dV kernel")
    for causal in (False, True):
        for T in (4096, 16384):
            q, k, v, do = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            o, lse = attention_fwd(q, k, v, causal, D ** -0.5)
            for form in forms:
                times = _kernel_times_us(lambda kw=GLUON_BWD_DQ[form]: gluon_backward.gluon_attention_bwd(
                    do, q, k, v, o, lse, causal, D ** -0.5, **kw))
                parts = ", ".join(f"{name[:40]} {us:.1f}" for name, us in sorted(times.items(), key=lambda kv: -kv[1]))
                print(f"  T={T} causal={causal} {form}: {sum(times.values()):.1f} in all: {parts}", flush=True)
            del q, k, v, do, o, lse

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
    from attention_kernels.kda import bench
    for case in (c for c in bench.PREFILL.cases if c["T"] in (4096, 16384)):
        print(f"--- KDA prefill, T = {case['T']}")
        for name, make in (("book", bench.PREFILL.providers["book: chunk"]),
                           ("fla", bench.PREFILL.providers["fla chunk_kda"])):
            fn = make(case)
            if fn is None:
                print(f"  {name}: not installed")
                continue
            times = _kernel_times_us(fn)
            for kernel, us in sorted(times.items(), key=lambda kv: -kv[1]):
                print(f"  {name:5s} {us:8.1f} us  {kernel[:90]}")
            print(f"  {name:5s} {sum(times.values()):8.1f} us  GPU time in all; plain call {time_ms(fn) * 1000:.1f} us",
                  flush=True)


def train_kernels(*families):
    """Where a training step's GPU time goes (forward + backward, bf16, B = 1, T = 16K): each kernel the
    book's step launches and each its peer's, GPU µs per step, largest first; `families` ("mamba2", "gla")
    picks some, none picks all. Mamba-2 at Mamba-2 2.7B's heads (chunk 64 for the book, 256 for mamba_ssm),
    GLA and KDA at 32 heads x 128 against fla's chunk_gla and chunk_kda."""
    from attention_kernels.gla import bench as gla_bench
    from attention_kernels.kda import bench as kda_bench
    from attention_kernels.mamba2 import bench as mamba2_bench
    rows = ((mamba2_bench.TRAIN, {"B": 1, "T": 16384, "H": 80, "D": 64, "dstate": 128, "G": 1},
             ("book: chunk 64", "mamba_ssm chunk 256")),
            (gla_bench.TRAIN, {"B": 1, "T": 16384, "H": 32, "D": 128}, ("book: chunk", "fla chunk_gla")),
            (kda_bench.TRAIN, {"B": 1, "T": 16384, "H": 32, "D": 128}, ("book: chunk", "fla chunk_kda")))
    for table, case, names in rows:
        if families and table.name.split("_")[0] not in families:   # "mamba2", "gla", "kda"
            continue
        print(f"--- {table.name}, {case}")
        for name in names:
            fn = table.providers[name](case)
            if fn is None:
                print(f"  {name}: not installed")
                continue
            times = _kernel_times_us(fn, reps=5)
            for kernel, us in sorted(times.items(), key=lambda kv: -kv[1])[:25]:
                print(f"  {name[:18]:18s} {us:9.1f} us  {kernel[:100]}")
            print(f"  {name[:18]:18s} {sum(times.values()):9.1f} us  GPU time in all; plain call "
                  f"{time_ms(fn) * 1000:.1f} us", flush=True)
            del fn


def _each_config(module, configs, backward):
    """For each config of `configs` (name -> {module constant: value}), set on `module` over the values it has
    at the start, in turn: (name, gradients' rel err against the first config's, or None where the config does
    not fit this GPU, with the reason). The caller times each while it is set; the module's values are restored
    at the end, or on an error."""
    landed = {n: getattr(module, n) for patch in configs.values() for n in patch}
    first = None
    try:
        for name, patch in configs.items():
            for n, value in {**landed, **patch}.items():
                setattr(module, n, value)
            try:
                grads = [g.float() for g in backward()]
            except Exception as e:   # a config that does not fit this GPU: say so, go on
                yield name, None, f"failed: {type(e).__name__}: {str(e)[:120]}"
                continue
            first = first or grads
            yield name, max(((g - f).norm() / f.norm().clamp_min(1e-30)).item() for g, f in zip(grads, first)), ""
    finally:
        for n, value in landed.items():
            setattr(module, n, value)


def _timed_configs(module, configs, backward, report):
    """Each config's backward (`_each_config`) timed per kernel, unless it failed or its gradients are off the
    first config's by more than bf16's rounding (2e-2): `report(name, times, err)` prints its row."""
    for name, err, why in _each_config(module, configs, backward):
        if err is None or not err < 2e-2:
            print(f"  {name:24s} " + (why or f"WRONG: gradients vs the first rel err {err:.1e}; not timed"),
                  flush=True)
            continue
        report(name, _kernel_times_us(backward, reps=10), err)


def ssd_dqk_configs():
    """Mamba-2's dq/dk launches (`_ssd_dqk_intra_kernel`, then the key tiles `_ssd_dqk_kernel`) at the training
    table's 16K case (B 1, 80 heads x 64, dstate 128, G 1, bf16), in their config, with the intra kernel on 8
    warps, and with the key tiles on 8 warps too. One forward; each config's gradients checked against
    the first's (bf16: equal to rounding; a config off by more is not timed), then the backward alone: the two
    launches' GPU µs, every backward kernel's (torch.profiler) and the plain backward call (~30 s)."""
    from attention_kernels.mamba2 import bench as mamba2_bench
    from attention_kernels.mamba2 import chunk as mamba2_chunk
    B, T, H, P, N, bf16 = 1, 16384, 80, 64, 128, torch.bfloat16
    configs = {"as launched": {}, "intra 8 warps": {"_DQK_INTRA_WARPS": 8},
               "both on 8 warps": {"_DQK_INTRA_WARPS": 8, "_DQK_WARPS": 8}}
    inputs = dict(x=torch.randn(B, T, H, P, dtype=bf16), dt=torch.randn(B, T, H, dtype=bf16),
                  A=-torch.exp(torch.rand(H)), B=torch.randn(B, T, 1, N, dtype=bf16),
                  C=torch.randn(B, T, 1, N, dtype=bf16), D=torch.randn(H), z=torch.randn(B, T, H, P, dtype=bf16),
                  dt_bias=torch.rand(H) - 4)
    inputs = {n: t.cuda().requires_grad_() for n, t in inputs.items()}
    y = mamba2_bench.ssd_chunk_scan(**inputs, chunk_size=64, dt_softplus=True)
    dy = torch.randn_like(y)

    def backward():
        return torch.autograd.grad(y, list(inputs.values()), dy, retain_graph=True)

    def report(name, times, err):
        keys = sum(us for k, us in times.items() if "_ssd_dqk_kernel" in k)
        intra = sum(us for k, us in times.items() if "_ssd_dqk_intra_kernel" in k)
        print(f"  {name:24s} dq/dk {keys + intra:8.1f} us (key tiles {keys:.1f}, intra {intra:.1f}); backward GPU "
              f"{sum(times.values()):8.1f} us, plain call {time_ms(backward) * 1000:8.1f} us; gradients vs the "
              f"first rel err {err:.1e}", flush=True)
    print(f"--- Mamba-2 backward alone, B {B}, T {T}, {H} heads x {P}, dstate {N}, bf16; GPU µs per call")
    _timed_configs(mamba2_chunk, configs, backward, report)


def gla_intra_configs():
    """GLA's sub-chunk dq/dk kernel in four configs (module docstring), timed inside the backward of one training
    step (B 1, T 16K, 32 heads, K = V = 128, bf16); each config's gradients against the first's (bf16: equal to
    rounding; a config off by more is not timed)."""
    from attention_kernels.gla import chunk_gla
    from attention_kernels.linear import chunk_backward
    B, T, H, K, bf16 = 1, 16384, 32, 128, torch.bfloat16
    configs = {"as launched": {}, "all of K, 8 warps": {"_INTRA_BK": None, "_INTRA_WARPS": 8},
               **{f"key tiles of {bk}, {w} warps": {"_INTRA_BK": bk, "_INTRA_WARPS": w} for bk, w in ((64, 4), (32, 4))}}
    q, k, v = (torch.randn(B, T, H, K, dtype=bf16, device="cuda", requires_grad=True) for _ in range(3))
    gk = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device="cuda")).div(16).to(bf16).requires_grad_()
    o, _ = chunk_gla(q, k, v, gk=gk)
    do = torch.randn_like(o)

    def backward():
        return torch.autograd.grad(o, (q, k, v, gk), do, retain_graph=True)

    def report(name, times, err):
        intra = sum(us for n, us in times.items() if "_chunk_dqk_intra_kernel" in n)
        print(f"  {name:24s} sub-chunk kernel {intra:8.1f} us; backward GPU {sum(times.values()):8.1f} us; "
              f"gradients vs the first rel err {err:.1e}", flush=True)
    print(f"--- GLA backward alone, B {B}, T {T}, {H} heads, K = V = {K}, bf16; GPU µs per call")
    _timed_configs(chunk_backward, configs, backward, report)


# The variants `delta_state_grad` times against the reverse state pass as launched, each in its own process
DELTA_VARIANTS = {
    "one tile": {"_DELTA_HALVES": False},
    "halves, BV 32, 4w 2s": {"_DELTA_HALVES_CONFIG": (32, 4, 2)},
    "halves, BV 64, 8w 1s": {"_DELTA_HALVES_CONFIG": (64, 8, 1)},
    "A_qk row-masked": {"_DELTA_AQK_ROW_MASK": True, "_DELTA_HALVES_SHARED_KB": 160},
    "A_qk row-masked, BV 32": {"_DELTA_AQK_ROW_MASK": True, "_DELTA_HALVES_CONFIG": (32, 4, 2)},
    "gated queries": {"_DELTA_GATED_QUERIES": True},
    "both, 3 stages": {"_DELTA_GATED_QUERIES": True, "_DELTA_AQK_ROW_MASK": True,
                       "_DELTA_HALVES_CONFIG": (64, 4, 3), "_DELTA_HALVES_SHARED_KB": 208},
    "both, BV 32, 3 stages": {"_DELTA_GATED_QUERIES": True, "_DELTA_AQK_ROW_MASK": True,
                              "_DELTA_HALVES_CONFIG": (32, 4, 3), "_DELTA_HALVES_SHARED_KB": 188},
}


def delta_state_grad(variant=None):
    """KDA's backward (B 1, T 16K, 32 heads, K = V = 128, bf16) with the delta rule's reverse state pass as
    launched (two halves of 64 key rows at `_DELTA_HALVES_CONFIG`) and with one of DELTA_VARIANTS (the one-tile
    pass, the halves at other (BV, warps, stages), the experiments `_DELTA_AQK_ROW_MASK` and
    `_DELTA_GATED_QUERIES` alone and together), each variant in a
    process of its own (one that reads out of bounds ends its process, not the probe): the gradients against
    the launched pass's, then the pass's and the backward's GPU time."""
    import subprocess
    if variant is None:
        print("--- KDA backward alone, B 1, T 16384, 32 heads, K = V = 128, bf16; GPU µs per call", flush=True)
        for name in DELTA_VARIANTS:
            try:
                run = subprocess.run([sys.executable, __file__, "delta_state_grad", name], capture_output=True,
                                     text=True, timeout=150)
                rows = [ln for ln in run.stdout.splitlines() if ln.startswith("  ")]
                print("\n".join(rows) if run.returncode == 0 else
                      f"  {name}: process ended {run.returncode}: {run.stderr.strip()[-200:]}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"  {name}: no result in 150 s", flush=True)
        return
    from attention_kernels.kda import chunk_kda
    from attention_kernels.linear import chunk_backward
    B, T, H, K, bf16 = 1, 16384, 32, 128, torch.bfloat16
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, T, H, K, dtype=bf16, device="cuda", requires_grad=True) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device="cuda")).div(16).to(bf16).requires_grad_()
    beta = torch.rand(B, T, H, dtype=bf16, device="cuda", requires_grad=True)
    o, _ = chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    do = torch.randn_like(o)

    def backward():
        return torch.autograd.grad(o, (q, k, v, g, beta), do, retain_graph=True)

    def report(name, times, err):
        walk = sum(us for n, us in times.items() if "state_grad" in n)
        print(f"  {name:24s} reverse state pass {walk:8.1f} us; backward GPU {sum(times.values()):8.1f} us; "
              f"gradients vs the first rel err {err:.1e}", flush=True)
    _timed_configs(chunk_backward, {"as launched": {}, variant: DELTA_VARIANTS[variant]}, backward, report)


def kda_solve_precision():
    """KDA's in-chunk solve for bf16 inputs (B 1, T 16K, 32 heads, K = V = 128, L2 norm in the kernel) in TF32,
    as launched, and in IEEE fp32 (`_SOLVE_PRECISION`): the forward's output and one backward's gradients
    against the same forward and backward on the inputs in fp32 (IEEE throughout), then the solve's launch and
    the forward's GPU time."""
    from attention_kernels.kda import chunk as kda_chunk
    from attention_kernels.kda import chunk_kda
    B, T, H, K, bf16 = 1, 16384, 32, 128, torch.bfloat16
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, T, H, K, dtype=bf16, device="cuda") for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device="cuda")).div(16).to(bf16)
    beta = torch.rand(B, T, H, dtype=bf16, device="cuda")
    do = torch.randn_like(v)

    def step(dtype):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v, g, beta)]
        o, _ = chunk_kda(*leaves, use_qk_l2norm_in_kernel=True)
        return [o.detach(), *torch.autograd.grad(o, leaves, do.to(dtype))]

    ref = [t.float() for t in step(torch.float32)]
    names = ("o", "dq", "dk", "dv", "dg", "dbeta")
    print("--- KDA's solve in bf16: errors against the fp32 step, GPU µs per forward", flush=True)
    # each config is set while its row runs (and the module's value restored after the last)
    for name, err, why in _each_config(kda_chunk, {"tf32 (as launched)": {}, "ieee": {"_SOLVE_PRECISION": "ieee"}},
                                       lambda: step(bf16)):
        if err is None:
            print(f"  {name:20s} {why}", flush=True)
            continue
        errs = ", ".join(f"{n} {rel_err(x.float(), r):.1e}" for n, x, r in zip(names, step(bf16), ref))
        times = _kernel_times_us(lambda: chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True))
        solve = sum(us for n, us in times.items() if "wy" in n)
        print(f"  {name:20s} solve {solve:7.1f} us, forward {sum(times.values()):7.1f} us; rel err {errs}",
              flush=True)


def ssd_state_split():
    """Mamba-2's state pass at chunks of 64 (B 1, T 16K, 80 heads x 64, dstate 128, bf16 inputs): the sequential
    pass (`_ssd_state_kernel`, today's below SPLIT_FROM_CHUNK) against the split (`_ssd_chunk_state_kernel` then
    `_ssd_state_pass_kernel`), the states written in bf16 (the backward's) and in fp32; each split's states
    checked against the sequential pass's, then every launch's GPU µs. The split moves 2.75x the bytes at this
    chunk but has 1,280x the programs (notes on SPLIT_FROM_CHUNK in attention_kernels/mamba2/chunk.py)."""
    from attention_kernels.mamba2 import chunk as mamba2_chunk
    B, T, H, P, N, L, bf16 = 1, 16384, 80, 64, 128, 64, torch.bfloat16
    x = torch.randn(B, T, H, P, dtype=bf16, device="cuda")
    Bm = torch.randn(B, T, 1, N, dtype=bf16, device="cuda")
    dt = torch.rand(B, T, H, device="cuda") * 0.1
    A = -torch.exp(torch.rand(H, device="cuda"))
    dtf = torch.empty(B, T, H, device="cuda")
    b = torch.empty(B, T, H, 1, device="cuda")
    mamba2_chunk.ssd_gates(dt, None, A, False, dtf, b, L)
    NT = triton.cdiv(T, L)
    landed = mamba2_chunk.SPLIT_FROM_CHUNK
    print(f"--- Mamba-2 state pass, B {B}, T {T}, {H} heads x {P}, dstate {N}, chunks of {L}; GPU µs per call")
    first = None
    for dtype in (bf16, torch.float32):
        for name, split_from in (("sequential", landed), ("split", L)):
            states = torch.empty(B, NT, H, N, P, dtype=dtype, device="cuda")
            mamba2_chunk.SPLIT_FROM_CHUNK = split_from
            try:
                def call():
                    mamba2_chunk.ssd_state_pass(Bm, x, dtf, b, states, None, None, L)
                call()
                err = 0.0 if first is None else ((states.float() - first).norm() / first.norm()).item()
                first = states.float() if first is None else first
                times = _kernel_times_us(call, reps=10)
            finally:
                mamba2_chunk.SPLIT_FROM_CHUNK = landed
            parts = ", ".join(f"{k[:30]} {us:.1f}" for k, us in sorted(times.items(), key=lambda kv: -kv[1]))
            print(f"  {name:10s} states {str(dtype)[6:]:8s} {sum(times.values()):8.1f} us ({parts}); "
                  f"states vs the first rel err {err:.1e}", flush=True)


def _profile_once(calls, label: str):
    """Each of `calls` once between cudaProfilerStart and Stop (what `ncu --profile-from-start off` records),
    the GPU idle before and after."""
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"{label}: profiled {len(calls)} calls", flush=True)


def train_ncu():
    """The target of `ncu --profile-from-start off`: one training step each of the book's Mamba-2 and GLA at
    `train_kernels`' shapes (B = 1, T = 16K), after two warm-up steps, between cudaProfilerStart and Stop."""
    from attention_kernels.gla import bench as gla_bench
    from attention_kernels.kda import bench as kda_bench
    from attention_kernels.mamba2 import bench as mamba2_bench
    steps = [mamba2_bench.TRAIN.providers["book: chunk 64"]({"B": 1, "T": 16384, "H": 80, "D": 64, "dstate": 128,
                                                              "G": 1}),
             gla_bench.TRAIN.providers["book: chunk"]({"B": 1, "T": 16384, "H": 32, "D": 128})]
    for step in steps:
        step(), step()
    _profile_once(steps, "train_ncu")


def plain_order():
    """Why the plain decode tables are slower at B = 1 than at B = 8 (e.g. GLA 53.0 against 45.0 µs, H100): B = 1
    is each sweep's first case. Each family's book step, timed back to back as its table times it
    (`time_loop_ms`), at B = 1, 8, 1, 64, 1 in one process: a first B = 1 slower than the later ones is the
    sweep's warm-up, equal ones are the step's own."""
    from attention_kernels.bench import time_loop_ms
    from attention_kernels.gla import bench as gla_bench
    from attention_kernels.kda import bench as kda_bench
    from attention_kernels.lightning import bench as lightning_bench
    from attention_kernels.mamba2 import bench as mamba2_bench
    print("--- the book's decode step, back to back (time_loop_ms), µs per call, B in the order timed", flush=True)
    for name, table in (("GLA", gla_bench.DECODE_PLAIN), ("Lightning", lightning_bench.DECODE_PLAIN),
                        ("KDA", kda_bench.DECODE_PLAIN), ("Mamba-2", mamba2_bench.DECODE_PLAIN)):
        cases = {}
        for c in table.cases:           # each B's first case, as the sweep takes them (Mamba-2: 80 heads)
            cases.setdefault(c["B"], c)
        times = [(B, time_loop_ms(table.providers["book"](cases[B])) * 1e3) for B in (1, 8, 1, 64, 1)]
        print(f"  {name:10s} H {cases[1]['H']:3d} " + "  ".join(f"B {B}: {us:6.1f}" for B, us in times), flush=True)


def kda_step():
    """KDA's step at B = 1, 8, 64 (H = 32, K = V = 128): single calls with L2 flushed (do_bench, as most chapters
    timed plain calls before), back to back (as the chapters time them now), graph replay and host time."""
    from torch.nn import functional as F

    from attention_kernels.bench import time_loop_ms
    from attention_kernels.kda import fused_recurrent_kda

    def step(B, H=32, D=128):
        torch.manual_seed(0)
        q, k, v, x = (torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        g = (F.logsigmoid(x.float()) / 16).to(torch.bfloat16)
        beta = torch.rand(B, 1, H, device="cuda", dtype=torch.bfloat16)
        state = torch.randn(B, H, D, D, device="cuda")
        return lambda: fused_recurrent_kda(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                           use_qk_l2norm_in_kernel=True)

    print("--- KDA step: flushed (do_bench) / back to back / graph replay / host time per call, us")
    for B in (1, 8, 64):
        fn = step(B)
        flushed, loop, graph = time_ms(fn) * 1000, time_loop_ms(fn) * 1000, time_graph_ms(fn) * 1000
        print(f"  B={B:3d}  flushed {flushed:7.2f}  back to back {loop:7.2f}  graph {graph:7.2f}  "
              f"({loop / graph:.2f}x)  host {_host_us(fn):7.2f}", flush=True)


def _mla_planned_splits(case, device):
    """The slice count `mla_decode` picks for a benchmark case of the MLA decode on this GPU."""
    from attention_kernels.launch import sm_count
    from attention_kernels.mla import planning
    return planning.num_splits(case["B"], case["H"] // planning.PLAN_HEAD_BLOCK, case["T"], sm_count(device))


def _mla_paged(B, T, order, seed=0):
    """A case of the MLA paged benchmark (its providers take it: `PAGED_PROVIDERS[label](case)`), and the
    inputs its rows read: q [B, 1, 128, 576], the dense cache [B, T, 576] (None when shuffled), its pages of 64
    in that order, the block table and the lengths (all T)."""
    from attention_kernels.mla import bench as mla_bench
    case = {"B": B, "T": T, "H": mla_bench.H, "D": mla_bench.D_QK, "pages": order}
    torch.manual_seed(seed)
    q = torch.randn(B, 1, mla_bench.H, mla_bench.D_QK, device="cuda", dtype=torch.bfloat16)
    dense = torch.randn(B, T, mla_bench.D_QK, device="cuda", dtype=torch.bfloat16)
    pages = dense.view(-1, mla_bench.PAGE, mla_bench.D_QK)
    if order == "in order":
        table = torch.arange(pages.shape[0], device="cuda", dtype=torch.int32).view(B, -1)
    else:
        (pages, table), dense = mla_bench.shuffled_pages(pages, B), None
    return case, q, dense, pages, table, torch.full((B,), T, device="cuda", dtype=torch.int32)


def _flashmla(case):
    """FlashMLA on the case's pages (the benchmark's own provider), or None where it is not built."""
    from attention_kernels.mla import bench as mla_bench
    return mla_bench.DECODE_PAGED.providers["FlashMLA"](case)


def mla_splits():
    """The Gluon MLA decode on shuffled pages at B = 8, 32, 64, T = 8K: graph-replayed time and each kernel's
    GPU time (torch.profiler) at every split count worth trying, the cost model's pick marked, and FlashMLA's
    replayed time on the same pages."""
    from attention_kernels.mla import bench as mla_bench
    from attention_kernels.mla import interface
    for B in (8, 32, 64):
        case, q, _, pages, table, seqlens = _mla_paged(B, 8192, "shuffled")
        picked = _mla_planned_splits(case, q.device)
        flash = _flashmla(case)
        flash_ms = time_graph_ms(flash) if flash is not None else float("nan")
        print(f"--- MLA paged decode, B = {B}, T = 8K, shuffled: FlashMLA {flash_ms * 1000:.1f} us replayed; "
              f"mla_decode picks {picked}", flush=True)
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
    from attention_kernels import peers
    from attention_kernels.mla import bench as mla_bench
    from attention_kernels.mla import interface
    _, q, _, pages, table, _ = _mla_paged(64, 16384, "shuffled")
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


def mla_ncu(*shapes):
    """The calls `ncu --profile-from-start off` profiles: the book's and FlashMLA's at each "B,T" of `shapes`
    (B = 64 and 8 at T = 8K if none is given)."""
    from attention_kernels.mla import bench as mla_bench
    from attention_kernels.mla import interface
    calls = []
    for B, T in [tuple(map(int, shape.split(","))) for shape in shapes] or [(64, 8192), (8, 8192)]:
        case, q, _, pages, table, seqlens = _mla_paged(B, T, "shuffled")
        flash = _flashmla(case)

        def book(q=q, pages=pages, table=table, seqlens=seqlens):
            return interface.mla_decode(q, pages, table, seqlens, softmax_scale=mla_bench.SCALE, check_seqlens=False)
        for _ in range(3):   # compiled, launched directly, caches warm
            book(), flash()
        calls += [book, flash]
    _profile_once(calls, "mla_ncu")


def mla_variants(*args):
    """Variants of the Gluon MLA kernel (module files with its `launch_gluon`) against the committed one, at the
    shapes given as "B,T" among the arguments (the chapter's paged table up to B = 128, 8K if none is)."""
    paths = [a for a in args if a.endswith(".py")]
    orders = ["shuffled"] + (["in order"] if "in_order" in args else [])
    shapes = [tuple(map(int, a.split(","))) for a in args if "," in a]
    from attention_kernels.mla import bench as mla_bench
    from attention_kernels.mla import decode, gluon_decode
    from attention_kernels.mla.reference import mla_decode_ref
    variants = {"committed": gluon_decode, **{pathlib.Path(p).stem: load_module(p) for p in paths}}

    def run(module, q, cache, seqlens, table, splits):
        B, _, H, _ = q.shape
        out = torch.empty(B, 1, H, 512, device=q.device, dtype=q.dtype)
        lse = torch.empty(B, H, 1, device=q.device, dtype=torch.float32)
        ws_o, ws_lse = None, None
        if splits > 1:  # the partials, as launch_gluon's docstring lays them out
            ws_o = torch.empty(B * H, splits, 512, device=q.device, dtype=torch.float32)
            ws_lse = torch.empty(B * H, splits, device=q.device, dtype=torch.float32)
        module.launch_gluon(q, cache, seqlens, mla_bench.SCALE, out, lse, ws_o, ws_lse, splits, table)
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
            case, q, dense, pages, table, seqlens = _mla_paged(B, T, order)
            splits = _mla_planned_splits(case, q.device)
            flash = _flashmla(case)
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
    if sys.argv[1:2] in (["mla_variants"], ["mla_ncu"], ["train_kernels"]):   # these take arguments
        {"mla_variants": mla_variants, "mla_ncu": mla_ncu, "train_kernels": train_kernels}[sys.argv[1]](*sys.argv[2:])
        sys.exit()
    if sys.argv[1:2] == ["delta_state_grad"]:
        delta_state_grad(*sys.argv[2:3])
        sys.exit()
    for part in sys.argv[1:]:
        {"fa_host": fa_host, "fa_bwd": fa_bwd, "fa_mask": fa_mask, "fa_gluon": fa_gluon, "fa_gluon_bwd": fa_gluon_bwd,
         "kda_step": kda_step, "mla_splits": mla_splits, "mla_mixed": mla_mixed, "kda_prefill": kda_prefill,
         "train_kernels": train_kernels, "train_ncu": train_ncu, "ssd_dqk_configs": ssd_dqk_configs,
         "gla_intra_configs": gla_intra_configs, "ssd_state_split": ssd_state_split,
         "kda_solve_precision": kda_solve_precision, "plain_order": plain_order}[part]()
