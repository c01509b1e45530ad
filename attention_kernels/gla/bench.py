"""GLA's benchmarks on the H200 (bf16 inputs, fp32 state): declarations the shared harness runs.

    CONTEXT_SOFTMAX, CONTEXT_GLA  decode one token at context T = 4K..64K: softmax over a KV cache of
                                  8 KV heads (LLaMA-3 8B's 4:1 grouping) against one GLA step (two
                                  operations, two tables, each its own work)
    DECODE_PLAIN, DECODE_GRAPH    one GLA step at B = 1, 8, 64: plain Python calls, CUDA-graph replay
    PREFILL                       a whole prompt: chunk-parallel (Triton, and TileLang where it is installed),
                                  the article's chunk kernel, fla, SDPA
    PREFILL_GRAPH                 PREFILL's B = 1 prompts up to 4K, replayed from a CUDA graph (GPU time)
    TRAIN                         a training step (forward and backward) of chunk_gla, fla's, and SDPA's
    PACKED                        the same step on 16K tokens of packed sequences of long-tailed lengths
                                  (flash_attn.bench.packed_lengths): chunk_gla with cu_seqlens, the same
                                  sequences padded to the longest, fla's chunk_gla with cu_seqlens

    >>> from attention_kernels.bench import run
    >>> df = run(PREFILL)          # times on a GPU, loads results/gla_prefill.csv elsewhere

Cases: B, T, H, D with K = V = D (the decode-step tables have no T). Peers come from attention_kernels.peers
inside the factories, and give None (an "n/a" row) where they are not installed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..bench import Benchmark, Panel
from ..linear import costs
from ..peers import fla, tilelang
from .interface import chunk_gla, chunk_gla_tilelang, fused_recurrent_gla, sequential_chunk_gla
from .reference import naive_recurrent_gla, torch_gla_step

DT = torch.bfloat16
H_DEC, D_DEC = 32, 128


def _qkvg(B, T, H, D):
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=DT) for _ in range(3))
    gk = (F.logsigmoid(torch.randn(B, T, H, D, device="cuda")) / 16).to(DT)   # the paper's gate
    return q, k, v, gk


# ---------------------------------------------------------------- decode
# the least a step moves: the fp32 state read and written, q, k, gk, v in and o out (bf16)
STEP_BYTES = costs.decode_bytes(vectors_per_token=5)


def _book_step(c):
    q, k, v, gk = _qkvg(c["B"], 1, c["H"], c["D"])
    S = costs.random_state(c)
    return lambda: fused_recurrent_gla(q, k, v, gk, initial_state=S, output_final_state=True)


def _torch_step(c):
    q, k, v, gk = (x[:, 0] for x in _qkvg(c["B"], 1, c["H"], c["D"]))
    S = costs.random_state(c)
    return lambda: torch_gla_step(q, k, v, gk, S)


def _fla_step(c):
    step = fla("gla", "fused_recurrent_gla")
    if step is None:
        return None
    q, k, v, gk = _qkvg(c["B"], 1, c["H"], c["D"])
    S = costs.random_state(c)
    return lambda: step(q, k, v, gk, initial_state=S, output_final_state=True)


DECODE_CASES = [{"B": b, "H": H_DEC, "D": D_DEC} for b in (1, 8, 64)]
DECODE_PROVIDERS = {"book": _book_step, "PyTorch step": _torch_step, "fla fused_recurrent_gla": _fla_step}

# One step, B = 1, 8, 64: a plain Python call (launch and wrapper overhead included), and the same
# call replayed from a CUDA graph (GPU time alone). The state dominates the bytes: 268 MB at B = 64.
DECODE_PLAIN = Benchmark("gla_decode_plain", DECODE_CASES, DECODE_PROVIDERS, costs.decode_flops, STEP_BYTES,
                         module=__name__)
DECODE_GRAPH = Benchmark("gla_decode_graph", DECODE_CASES, DECODE_PROVIDERS, costs.decode_flops, STEP_BYTES,
                         timer="graph", module=__name__)


# ---------------------------------------------------------------- decode against the context length
CONTEXT_CASES = [{"B": 1, "T": t, "H": H_DEC, "D": D_DEC} for t in (4096, 8192, 16384, 32768, 65536)]

# The softmax baseline is grouped-query attention as today's transformers run it: 8 KV heads for the 32
# query heads of 128 channels, LLaMA-3 8B's layout (4:1).
HKV_SOFTMAX = 8

# Softmax decode: one query per head over a T-long KV cache of HKV_SOFTMAX heads, 4·B·H·T·D FLOPs and
# the 2·B·HKV·T·D bf16 cache read (its roofline grows with T). Graph-replayed.
CONTEXT_SOFTMAX = Benchmark("gla_decode_context_softmax_gqa",
                            [{**c, "HKV": HKV_SOFTMAX} for c in CONTEXT_CASES], {"SDPA flash": costs.sdpa_decode},
                            flops=costs.softmax_decode_flops, bytes_moved=costs.softmax_decode_bytes,
                            timer="graph", module=__name__)
# One GLA step at the same B, H, D: the fixed state read and write, whatever T is. Graph-replayed.
CONTEXT_GLA = Benchmark("gla_decode_context_gla", CONTEXT_CASES, {"book": _book_step, "PyTorch step": _torch_step},
                        flops=costs.decode_flops, bytes_moved=STEP_BYTES, timer="graph", module=__name__)


# ---------------------------------------------------------------- prefill
prefill_flops = costs.chunk_flops
prefill_bytes = costs.prefill_bytes(vectors_per_token=5)  # q, k, gk, v read and o written once, bf16


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


def _tilelang_chunk(c):
    """The book's TileLang chunk kernels (`tilelang_chunk.py`); n/a where TileLang is not installed."""
    return None if tilelang() is None else _prefill(chunk_gla_tilelang)(c)


# B = 1, H = 32, D = 128, T = 1K..16K, plus fla's test shape B = 4, T = 2048, H = 16. Plain calls.
PREFILL = Benchmark(
    "gla_prefill",
    [{"B": 1, "T": t, "H": 32, "D": 128} for t in (1024, 2048, 4096, 8192, 16384)]
    + [{"B": 4, "T": 2048, "H": 16, "D": 128}],
    {
        "book: chunk": _prefill(chunk_gla),
        "book: TileLang chunk": _tilelang_chunk,   # the same chunks and math, in TileLang (forward only)
        # one launch per chunk, linear in T: three points show the slope
        "book: sequential chunk": _prefill(sequential_chunk_gla, max_T=4096),
        "fla chunk_gla": _fla_chunk,
        "SDPA flash": costs.sdpa_causal,     # causal softmax at the same shape, 32 KV heads, for scale
        # tens of ms per 1K tokens: the first point only
        "PyTorch step loop": _prefill(naive_recurrent_gla, max_T=1024),
    },
    prefill_flops, prefill_bytes, timer="flushed", module=__name__)


# ---------------------------------------------------------------- training
def _train(fn):
    """fn(q, k, v, gk) forward and backward to all four, on the case's inputs; given cu_seqlens, a packed
    call (`costs.packed`)."""
    def factory(c, cu_seqlens=None):
        inputs = [x.requires_grad_() for x in _qkvg(c["B"], c["T"], c["H"], c["D"])]
        return costs.train_step(lambda *x: fn(*x, **costs.offsets(cu_seqlens)), inputs, inputs)
    return factory


def _fla_train(c, cu_seqlens=None):
    fla_chunk_gla = fla("gla", "chunk_gla")
    return None if fla_chunk_gla is None else _train(fla_chunk_gla)(c, cu_seqlens)


# B = 1 and 8, H = 32, D = 128, T = 4K and 16K: forward + backward, plain calls. Four vectors in, four
# gradients out (q, k, v, gk). SDPA flash has 32 KV heads, one per query head.
TRAIN = Benchmark(
    "gla_train",
    [{"B": b, "T": t, "H": 32, "D": 128} for b in (1, 8) for t in (4096, 16384)],
    {"book: chunk": _train(chunk_gla), "fla chunk_gla": _fla_train, "SDPA flash": costs.sdpa_causal_train},
    costs.train_flops, costs.train_bytes(inputs_per_token=4), timer="flushed", module=__name__)

# The training step on packed sequences: 16K tokens of long-tailed lengths (the FlashAttention chapter's mix,
# `costs.packed_cases`), H = 32, D = 128, plain calls. The packed call, the same sequences padded to the
# longest into a [N, T_max, H, D] batch, and fla's packed call; the work is TRAIN's, sequence by sequence.
PACKED = Benchmark(
    "gla_packed", costs.packed_cases(H=32, D=128),
    {"book: packed": costs.packed(_train(chunk_gla)), "book: padded": costs.padded(_train(chunk_gla)),
     "fla chunk_gla": costs.packed(_fla_train)},
    costs.per_sequence(TRAIN.flops), costs.per_sequence(TRAIN.bytes_moved), timer="flushed", module=__name__)

# The prompts at B = 1 up to 4K replayed from a CUDA graph: the GPU's time, without the host's
PREFILL_GRAPH = PREFILL.replayed(("book: chunk", "fla chunk_gla", "SDPA flash"))

BENCHMARKS = [CONTEXT_SOFTMAX, CONTEXT_GLA, DECODE_PLAIN, DECODE_GRAPH, PREFILL, PREFILL_GRAPH, TRAIN, PACKED]

HEADLINE = Panel("gla_prefill", {"B": 1}, "T", "ms", ("book: chunk", "fla chunk_gla", "SDPA flash"),
                 "GLA prefill (SDPA: causal softmax)\nB=1, H=32, D=128")
