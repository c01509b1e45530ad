"""Mamba-2's benchmarks on the H200 (bf16 inputs, fp32 state): declarations the shared harness runs.

    DECODE_PLAIN, DECODE_GRAPH   one step (selective_state_update) at B = 1, 8, 64: plain calls and
                                 CUDA-graph replay, against mamba_ssm's Triton step and the PyTorch step
    PREFILL                      a whole prompt, B = 1 and 8, T = 1K..16K: the book's SSD chunk scan,
                                 mamba_ssm's mamba_chunk_scan_combined, the PyTorch chunked form, and
                                 causal softmax (SDPA flash) at the same heads
    PREFILL_GRAPH                PREFILL's B = 1 prompts up to 4K, replayed from a CUDA graph (GPU time)
    PREFILL_CHUNKS               the chunk length: the book's scan at 64, 128, 256 and mamba_ssm's at
                                 256 and 64, B = 1, T = 4K and 16K
    LAYER                        the scan as a Mamba-2 layer calls it: z=None, then the gated RMSNorm,
                                 the book's (chunk 64, its Triton rmsnorm_fn) against mamba_ssm's (chunk
                                 256, RMSNormGated's rmsnorm_fn), and each scan alone; B = 1 and 8, T = 4K, 16K
    TRAIN                        a training step (forward + backward), the book's scan and mamba_ssm's
                                 at chunks 256 and 64, B = 1, T = 4K and 16K

    >>> from attention_kernels.bench import run
    >>> df = run(PREFILL)          # times on a GPU, loads results/mamba2_prefill.csv elsewhere

Sizes are mamba_ssm's usual ones: headdim D = 64, dstate = 128, one group; H = 80 heads is Mamba-2
2.7B (d_model 2560, expand 2: d_inner 5120 = 80 × 64), H = 64 the d_inner 4096 of the source article.
The step is called as a Mamba-2 model calls it: A, dt, dt_bias and D one number per head, broadcast
with stride 0 to [.., headdim(, dstate)], with D, z, dt_bias and the softplus. Case columns: B, T, H,
D (headdim), dstate, G (groups).

mamba_ssm is a peer, never a requirement: `attention_kernels.peers.mamba_ssm` imports its Triton ops where it
can (installed, or a source checkout named by MAMBA_SSM_PATH) and gives None (an "n/a" row) elsewhere.
"""
from __future__ import annotations

import torch

from ..bench import Benchmark, Panel
from ..linear.chunk import CHUNK
from ..linear.costs import sdpa_causal, train_step
from ..peers import mamba_ssm
from .interface import rmsnorm_fn, selective_state_update, ssd_chunk_scan
from .reference import mamba2_step, ssd_chunked_torch

DT = torch.bfloat16
HEADDIM, DSTATE = 64, 128


# ---------------------------------------------------------------- decode
def _step_inputs(c):
    """One step's arguments, as a Mamba-2 model passes them (stride-0 per-head A, dt, dt_bias, D)."""
    B, H, P, N, G = c["B"], c["H"], c["D"], c["dstate"], c["G"]
    dev = "cuda"
    A = -torch.exp(torch.rand(H, device=dev))
    dt = torch.randn(B, H, device=dev, dtype=DT)
    bias, D = torch.rand(H, device=dev) - 4, torch.randn(H, device=dev)
    return dict(state=torch.randn(B, H, P, N, device=dev), x=torch.randn(B, H, P, device=dev, dtype=DT),
                dt=dt[:, :, None].expand(B, H, P), A=A[:, None, None].expand(H, P, N),
                B=torch.randn(B, G, N, device=dev, dtype=DT), C=torch.randn(B, G, N, device=dev, dtype=DT),
                D=D[:, None].expand(H, P), z=torch.randn(B, H, P, device=dev, dtype=DT),
                dt_bias=bias[:, None].expand(H, P), dt_softplus=True)


def step_flops(c):
    """Per (batch, head, headdim row, state): decay, update, read-out, about 6 FLOPs."""
    return 6 * c["B"] * c["H"] * c["D"] * c["dstate"]


def step_bytes(c):
    """The least a step moves: the fp32 state read and written (2 × state bytes), x, z and y (bf16
    [B, H, D]), B and C (bf16 [B, G, dstate]), dt (bf16 [B, H])."""
    B, H, P, N, G = c["B"], c["H"], c["D"], c["dstate"], c["G"]
    return 2 * B * H * P * N * 4 + 3 * B * H * P * 2 + 2 * B * G * N * 2 + B * H * 2


def _book_step(c):
    a = _step_inputs(c)
    return lambda: selective_state_update(**a)


def _mamba_ssm_step(c):
    op = mamba_ssm("selective_state_update", "selective_state_update")
    if op is None:
        return None
    a = _step_inputs(c)
    return lambda: op(**a)


def _torch_step(c):
    a = _step_inputs(c)
    return lambda: mamba2_step(**a)


DECODE_CASES = [{"B": b, "H": h, "D": HEADDIM, "dstate": DSTATE, "G": 1} for h in (80, 64) for b in (1, 8, 64)]
DECODE_PROVIDERS = {"book": _book_step, "mamba_ssm selective_state_update": _mamba_ssm_step,
                    "PyTorch step": _torch_step}

# One step, B = 1, 8, 64: a plain Python call (launch and checks included), and the same call replayed
# from a CUDA graph (GPU time alone). The state dominates the bytes: 168 MB read and written at B = 64, H = 80.
DECODE_PLAIN = Benchmark("mamba2_decode_plain", DECODE_CASES, DECODE_PROVIDERS, step_flops, step_bytes,
                         module=__name__)
DECODE_GRAPH = Benchmark("mamba2_decode_graph", DECODE_CASES, DECODE_PROVIDERS, step_flops, step_bytes,
                         timer="graph", module=__name__)


# ---------------------------------------------------------------- prefill
def _scan_inputs(c):
    B, T, H, P, N, G = c["B"], c["T"], c["H"], c["D"], c["dstate"], c["G"]
    dev = "cuda"
    return dict(x=torch.randn(B, T, H, P, device=dev, dtype=DT), dt=torch.randn(B, T, H, device=dev, dtype=DT),
                A=-torch.exp(torch.rand(H, device=dev)), B=torch.randn(B, T, G, N, device=dev, dtype=DT),
                C=torch.randn(B, T, G, N, device=dev, dtype=DT), D=torch.randn(H, device=dev),
                z=torch.randn(B, T, H, P, device=dev, dtype=DT), dt_bias=torch.rand(H, device=dev) - 4,
                dt_softplus=True)


def prefill_flops(c):
    """Matmul work of the chunk form (C = 64, NT chunks), per (batch, head):
    C Bᵀ on the causal triangle C(C+1)·dstate, (L ∘ C Bᵀ) X on it C(C+1)·D, C
    S_start 2·C·dstate·D, the chunk state Bᵀ X 2·C·dstate·D (counted per
    head, as the book computes it, also where heads share a group)."""
    C, N, P = CHUNK, c["dstate"], c["D"]
    nt = -(-c["T"] // C)
    return c["B"] * c["H"] * nt * (C * (C + 1) * (N + P) + 4 * C * N * P)


def prefill_bytes(c):
    """Each bf16 input read and y written once: x, z, y [B, T, H, D], B and C [B, T, G, dstate], dt."""
    B, T, H, P, N, G = c["B"], c["T"], c["H"], c["D"], c["dstate"], c["G"]
    return B * T * (3 * H * P + 2 * G * N + H) * 2


def _book_scan(chunk_size: int):
    """The book's scan at one chunk length, as a provider."""
    def make(c):
        a = _scan_inputs(c)
        return lambda: ssd_chunk_scan(**a, chunk_size=chunk_size)
    return make


def _mamba_ssm_scan(chunk_size: int):
    """mamba_ssm's mamba_chunk_scan_combined at one chunk length, as a provider (None where it is not
    importable)."""
    def make(c):
        op = mamba_ssm("ssd_combined", "mamba_chunk_scan_combined")
        if op is None:
            return None
        a = _scan_inputs(c)
        return lambda: op(chunk_size=chunk_size, **a)
    return make


def _torch_scan(c):
    if c["B"] * c["T"] > 4096:                       # its [B, H, chunks, 64, 64] masks in fp32: keep it small
        return None
    a = _scan_inputs(c)
    return lambda: ssd_chunked_torch(**a)


PREFILL_CASES = [{"B": b, "T": t, "H": 80, "D": HEADDIM, "dstate": DSTATE, "G": 1}
                 for b in (1, 8) for t in (1024, 2048, 4096, 8192, 16384)]
PREFILL = Benchmark(
    "mamba2_prefill", PREFILL_CASES,
    {"book: SSD chunk scan": _book_scan(CHUNK),
     "mamba_ssm": _mamba_ssm_scan(256),      # mamba_chunk_scan_combined at Mamba-2's default chunk
     "PyTorch chunked": _torch_scan, "SDPA flash": sdpa_causal},
    prefill_flops, prefill_bytes, timer="flushed", module=__name__)

# The chunk length, B = 1 at Mamba-2 2.7B's heads, T = 4K and 16K: the book's scan at 64, 128 and 256
# against mamba_ssm's at 256 (its models' chunk) and 64 (the book's default). The work counted is the
# chunk-64 form's for every provider (prefill_flops), so TFLOP/s compare times, not algorithms.
CHUNK_CASES = [{"B": 1, "T": t, "H": 80, "D": HEADDIM, "dstate": DSTATE, "G": 1} for t in (4096, 16384)]
PREFILL_CHUNKS = Benchmark(
    "mamba2_prefill_chunks", CHUNK_CASES,
    {**{f"book: chunk {L}": _book_scan(L) for L in (64, 128, 256)},
     **{f"mamba_ssm chunk {L}": _mamba_ssm_scan(L) for L in (256, 64)}},
    prefill_flops, prefill_bytes, timer="flushed", module=__name__)



# ---------------------------------------------------------------- the layer's call
NORM_EPS = 1e-5                                      # RMSNormGated's default in a Mamba-2 layer


def _layer_inputs(c):
    """The scan's arguments with z taken out (the layer gates in the norm), z and the norm's weight
    flattened to the layer's [B, T, d_inner], and the norm's group: d_inner / ngroups channels."""
    scan = _scan_inputs(c)
    z = scan.pop("z").flatten(-2)
    weight = torch.ones(z.shape[-1], device=z.device, dtype=DT)    # a bf16 model's parameter
    return scan, z, weight, z.shape[-1] // c["G"]


def _book_layer(norm: bool):
    """The book's scan at chunk 64 with z=None, then (norm=True) the book's gated RMSNorm, one Triton pass
    (rmsnorm_fn, norm.py), called as mamba_ssm's is below."""
    def make(c):
        scan, z, weight, group = _layer_inputs(c)
        if not norm:
            return lambda: ssd_chunk_scan(**scan, chunk_size=CHUNK)
        return lambda: rmsnorm_fn(ssd_chunk_scan(**scan, chunk_size=CHUNK).flatten(-2), weight, None, z=z,
                                  eps=NORM_EPS, group_size=group, norm_before_gate=False)
    return make


def _mamba_ssm_layer(norm: bool):
    """mamba_chunk_scan_combined at chunk 256 with z=None, then (norm=True) mamba_ssm's rmsnorm_fn as its
    RMSNormGated calls it; None where either is not importable."""
    def make(c):
        op = mamba_ssm("ssd_combined", "mamba_chunk_scan_combined")
        rmsnorm = mamba_ssm("layernorm_gated", "rmsnorm_fn") if norm else None
        if op is None or (norm and rmsnorm is None):
            return None
        scan, z, weight, group = _layer_inputs(c)
        if not norm:
            return lambda: op(chunk_size=256, **scan)
        return lambda: rmsnorm(op(chunk_size=256, **scan).flatten(-2), weight, None, z=z, eps=NORM_EPS,
                               group_size=group, norm_before_gate=False)
    return make


# The scan as a Mamba-2 layer calls it: z=None (given z, mamba_ssm's scan also writes the ungated output),
# then y = rmsnorm(y · silu(z)) · weight over groups of d_inner / ngroups channels, each side with its own
# Triton norm (rmsnorm_fn). Each side at its own chunk (the book 64, mamba_ssm its models' 256), the norm shown
# by the scan-alone rows. The work and bytes are PREFILL's (z read once, y written once): the norm's second
# pass over y is not counted.
LAYER_CASES = [{"B": b, "T": t, "H": 80, "D": HEADDIM, "dstate": DSTATE, "G": 1} for b in (1, 8) for t in (4096, 16384)]
LAYER = Benchmark(
    "mamba2_layer", LAYER_CASES,
    {"book: scan + norm": _book_layer(norm=True), "book: scan": _book_layer(norm=False),
     "mamba_ssm: scan + RMSNormGated": _mamba_ssm_layer(norm=True), "mamba_ssm: scan": _mamba_ssm_layer(norm=False)},
    prefill_flops, prefill_bytes, timer="flushed", module=__name__)


# ---------------------------------------------------------------- training
TRAINED = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias")


def train_flops(c):
    """A training step's matmul work, forward and backward: 3 · prefill_flops (the backward's products are
    twice the forward's, as in the other linear families: attention_kernels/linear/costs.train_flops)."""
    return 3 * prefill_flops(c)


def train_bytes(c):
    """The least a training step moves, in bf16: the forward reads x, z, B, C, dt and writes y; the backward
    reads them again with dy and writes dx, dz, dB, dC, ddt (the per-head gradients are negligible)."""
    B, T, H, P, N, G = c["B"], c["T"], c["H"], c["D"], c["dstate"], c["G"]
    return B * T * (8 * H * P + 6 * G * N + 3 * H) * 2


def _train(scan, chunk_size: int):
    """A provider: scan(**inputs, chunk_size=...) forward and backward to every input but the softplus flag."""
    def make(c):
        a = _scan_inputs(c)
        for name in TRAINED:
            a[name].requires_grad_()
        return train_step(lambda *_: scan(**a, chunk_size=chunk_size), (), [a[n] for n in TRAINED])
    return make


def _book_train(chunk_size: int):
    return _train(ssd_chunk_scan, chunk_size)


def _mamba_ssm_train(chunk_size: int):
    def make(c):
        op = mamba_ssm("ssd_combined", "mamba_chunk_scan_combined")
        return None if op is None else _train(op, chunk_size)(c)
    return make


# A training step (forward + backward to x, dt, A, B, C, D, z, dt_bias), B = 1 at Mamba-2 2.7B's heads,
# T = 4K and 16K: the book's scan (forward at 256 or 64, backward always in chunks of 64) against
# mamba_ssm's mamba_chunk_scan_combined at the same chunk lengths. Plain calls, caches flushed.
TRAIN = Benchmark(
    "mamba2_train", CHUNK_CASES,
    {**{f"book: chunk {L}": _book_train(L) for L in (256, 64)},
     **{f"mamba_ssm chunk {L}": _mamba_ssm_train(L) for L in (256, 64)}},
    train_flops, train_bytes, timer="flushed", module=__name__)

# The prompts at B = 1 up to 4K replayed from a CUDA graph: the GPU's time, without the host's
PREFILL_GRAPH = PREFILL.replayed(("book: SSD chunk scan", "mamba_ssm", "SDPA flash"))

BENCHMARKS = [DECODE_PLAIN, DECODE_GRAPH, PREFILL, PREFILL_GRAPH, PREFILL_CHUNKS, LAYER, TRAIN]

HEADLINE = Panel("mamba2_prefill", {"B": 1}, "T", "ms",
                 ("book: SSD chunk scan", "mamba_ssm", "SDPA flash"),
                 "Mamba-2 prefill (SDPA: causal softmax)\nB=1, 80 heads x 64, dstate 128")

__all__ = ["DECODE_PLAIN", "DECODE_GRAPH", "PREFILL", "PREFILL_GRAPH", "PREFILL_CHUNKS", "LAYER", "TRAIN", "BENCHMARKS",
           "HEADLINE", "step_bytes", "step_flops", "prefill_flops", "prefill_bytes", "train_flops", "train_bytes"]
