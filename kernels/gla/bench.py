"""GLA's benchmarks on the H200 (bf16 inputs, fp32 state): declarations the shared harness runs.

    CONTEXT_SOFTMAX, CONTEXT_GLA  decode one token at context T = 4K..64K: softmax over a KV cache
                                  against one GLA step (two operations, two tables, each its own work)
    DECODE_PLAIN, DECODE_GRAPH    one GLA step at B = 1, 8, 64: plain Python calls, CUDA-graph replay
    PREFILL                       a whole prompt: chunk-parallel, the article's chunk kernel, fla, SDPA

    >>> from kernels.bench import run
    >>> df = run(PREFILL)          # times on a GPU, loads results/gla_prefill.csv elsewhere

Cases: B, T, H, D with K = V = D (the decode-step tables have no T). Peers come from kernels.peers
inside the factories, and give None (an "n/a" row) where they are not installed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..bench import Benchmark, Panel
from ..linear import CHUNK
from ..peers import fla, sdpa
from .interface import chunk_gla, fused_recurrent_gla, sequential_chunk_gla
from .reference import naive_recurrent_gla, torch_gla_step

DT = torch.bfloat16
H_DEC, D_DEC = 32, 128


def _qkvg(B, T, H, D):
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=DT) for _ in range(3))
    gk = (F.logsigmoid(torch.randn(B, T, H, D, device="cuda")) / 16).to(DT)   # the paper's gate
    return q, k, v, gk


def _state(c):
    return torch.randn(c["B"], c["H"], c["D"], c["D"], device="cuda")


# ---------------------------------------------------------------- decode
def decode_flops(c):
    """One step: decay + rank-1 update (2·K·V) and the read-out (2·K·V), per (batch, head); K = V = D."""
    return 4 * c["B"] * c["H"] * c["D"] * c["D"]


def decode_bytes(c):
    """fp32 state read + write, plus q, k, gk, v in and o out (bf16): the least a step must move."""
    B, H, D = c["B"], c["H"], c["D"]
    return 2 * B * H * D * D * 4 + B * H * 5 * D * 2


def _book_step(c):
    q, k, v, gk = _qkvg(c["B"], 1, c["H"], c["D"])
    S = _state(c)
    return lambda: fused_recurrent_gla(q, k, v, gk, initial_state=S, output_final_state=True)


def _torch_step(c):
    q, k, v, gk = (x[:, 0] for x in _qkvg(c["B"], 1, c["H"], c["D"]))
    S = _state(c)
    return lambda: torch_gla_step(q, k, v, gk, S)


def _fla_step(c):
    step = fla("gla", "fused_recurrent_gla")
    if step is None:
        return None
    q, k, v, gk = _qkvg(c["B"], 1, c["H"], c["D"])
    S = _state(c)
    return lambda: step(q, k, v, gk, initial_state=S, output_final_state=True)


DECODE_CASES = [{"B": b, "H": H_DEC, "D": D_DEC} for b in (1, 8, 64)]
DECODE_PROVIDERS = {"book": _book_step, "PyTorch step": _torch_step, "fla fused_recurrent_gla": _fla_step}

# One step, B = 1, 8, 64: a plain Python call (launch and wrapper overhead included), and the same
# call replayed from a CUDA graph (GPU time alone). The state dominates the bytes: 268 MB at B = 64.
DECODE_PLAIN = Benchmark("gla_decode_plain", DECODE_CASES, DECODE_PROVIDERS, decode_flops, decode_bytes)
DECODE_GRAPH = Benchmark("gla_decode_graph", DECODE_CASES, DECODE_PROVIDERS, decode_flops, decode_bytes,
                         timer="graph")


# ---------------------------------------------------------------- decode against the context length
def _sdpa_decode(c):
    attend = sdpa("flash")
    q = torch.randn(c["B"], c["H"], 1, c["D"], device="cuda", dtype=DT)          # SDPA's [B, H, T, D]
    kc, vc = (torch.randn(c["B"], c["H"], c["T"], c["D"], device="cuda", dtype=DT) for _ in range(2))
    return lambda: attend(q, kc, vc)


CONTEXT_CASES = [{"B": 1, "T": t, "H": H_DEC, "D": D_DEC} for t in (4096, 8192, 16384, 32768, 65536)]

# Softmax decode: one query over a T-long KV cache, 4·B·H·T·D FLOPs and the 2·B·H·T·D bf16 cache
# read (its roofline grows with T). Graph-replayed.
CONTEXT_SOFTMAX = Benchmark("gla_decode_context_softmax", CONTEXT_CASES, {"SDPA flash": _sdpa_decode},
                            flops=lambda c: 4 * c["B"] * c["H"] * c["T"] * c["D"],
                            bytes_moved=lambda c: 2 * c["B"] * c["H"] * c["T"] * c["D"] * 2, timer="graph")
# One GLA step at the same B, H, D: the fixed state read and write, whatever T is. Graph-replayed.
CONTEXT_GLA = Benchmark("gla_decode_context_gla", CONTEXT_CASES, {"book": _book_step, "PyTorch step": _torch_step},
                        flops=decode_flops, bytes_moved=decode_bytes, timer="graph")


# ---------------------------------------------------------------- prefill
def prefill_flops(c):
    """Matmul work of the chunk algorithm (chunk C = 64, NT = ceil(T / C) chunks), per (batch, head):

    per chunk, intra scores Q K^T on the causal triangle: C(C+1)/2 pairs x 2K = C(C+1)·K;
    intra A V on the same triangle: C(C+1)·V; inter (Q ⊙ e^b) S: 2·C·K·V;
    state update (K ⊙ e^{b_C - b})^T V: 2·C·K·V. Total B·H·NT·(C(C+1)(K+V) + 4·C·K·V).
    The same count is used for every provider (SDPA's own work is different: read its ms).
    At K = V = 128 that is 5.3 MFLOP per chunk and head, 64 FLOP per byte of `prefill_bytes`:
    below the H200's ~160 FLOP/byte ridge, so the roofline is the memory floor (reading
    q, k, v, gk and writing o once); the chunk states and scores are extra traffic on top.
    """
    C, K, V = CHUNK, c["D"], c["D"]
    nt = -(-c["T"] // C)
    return c["B"] * c["H"] * nt * (C * (C + 1) * (K + V) + 4 * C * K * V)


def prefill_bytes(c):
    """Read q, k, gk, v and write o once (bf16): B·T·H·(3K + 2V)·2."""
    return c["B"] * c["T"] * c["H"] * (3 * c["D"] + 2 * c["D"]) * 2


def _prefill(fn, max_T=None):
    """fn(q, k, v, gk) on the case's inputs; None above max_T tokens."""
    def factory(c):
        if max_T is not None and c["T"] > max_T:
            return None
        q, k, v, gk = _qkvg(c["B"], c["T"], c["H"], c["D"])
        return lambda: fn(q, k, v, gk)
    return factory


def _fla_chunk(c):
    fla_chunk_gla = fla("gla", "chunk_gla")
    return None if fla_chunk_gla is None else _prefill(fla_chunk_gla)(c)


def _sdpa_causal(c):
    attend = sdpa("flash")
    q, k, v = (torch.randn(c["B"], c["H"], c["T"], c["D"], device="cuda", dtype=DT) for _ in range(3))
    return lambda: attend(q, k, v, causal=True)


# B = 1, H = 32, D = 128, T = 1K..16K, plus fla's test shape B = 4, T = 2048, H = 16. Plain calls.
PREFILL = Benchmark(
    "gla_prefill",
    [{"B": 1, "T": t, "H": 32, "D": 128} for t in (1024, 2048, 4096, 8192, 16384)]
    + [{"B": 4, "T": 2048, "H": 16, "D": 128}],
    {
        "book: chunk": _prefill(chunk_gla),
        # one launch per chunk, linear in T: three points show the slope
        "book: sequential chunk": _prefill(sequential_chunk_gla, max_T=4096),
        "fla chunk_gla": _fla_chunk,
        "SDPA flash": _sdpa_causal,     # causal softmax at the same shape, for scale
        # tens of ms per 1K tokens: the first point only
        "PyTorch step loop": _prefill(naive_recurrent_gla, max_T=1024),
    },
    prefill_flops, prefill_bytes)

BENCHMARKS = [CONTEXT_SOFTMAX, CONTEXT_GLA, DECODE_PLAIN, DECODE_GRAPH, PREFILL]

HEADLINE = Panel("gla_prefill", {"B": 1}, "T", "ms", ("book: chunk", "fla chunk_gla", "SDPA flash"),
                 "GLA prefill (SDPA: causal softmax)\nB=1, H=32, D=128")
