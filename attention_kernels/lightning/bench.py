"""Lightning Attention's benchmarks on the H200 (bf16 inputs, fp32 state): declarations the shared
harness runs.

    CONTEXT_SOFTMAX, CONTEXT_LIGHTNING  decode one token at context T = 4K..64K: softmax over a KV cache
                                        of 4 KV heads (MiniMax-01's 8:1 grouping at H = 32) against one
                                        Lightning step (two operations, two tables)
    DECODE_PLAIN, DECODE_GRAPH          one Lightning step at B = 1, 8, 64: plain calls, CUDA-graph replay
    PREFILL                             a whole prompt, T = 1K..16K: the book's tiled prefill, fla's
                                        chunk_simple_gla, and causal softmax (SDPA flash): the crossover
    PREFILL_GRAPH                       PREFILL's B = 1 prompts up to 4K, replayed from a CUDA graph
    TRAIN                               a training step (forward and backward) of the same three
    PACKED                              the same step on 16K tokens of packed sequences of long-tailed
                                        lengths (flash_attn.bench.packed_lengths): chunk_lightning with
                                        cu_seqlens, the same sequences padded to the longest, fla's
                                        chunk_simple_gla with cu_seqlens

    >>> from attention_kernels.bench import run
    >>> df = run(PREFILL)          # times on a GPU, loads results/lightning_prefill.csv elsewhere

Cases: B, T, H, D with K = V = D (the decode-step tables have no T). The slopes are MiniMax-01's for
the first of 80 layers (the strongest decay; the kernels' time does not depend on the values). fla's
`simple_gla` ops take the same decay as g_gamma = -slopes and scale = 1. Peers come from
attention_kernels.peers inside the factories, and give None (an "n/a" row) where they are not installed.
"""
from __future__ import annotations

import inspect

import torch

from ..bench import Benchmark, Panel
from ..linear import costs
from ..peers import fla
from .interface import chunk_lightning, fused_recurrent_lightning
from .reference import lightning_slopes, torch_lightning_step

DT = torch.bfloat16
H_DEC, D_DEC = 32, 128


def _qkv(B, T, H, D):
    return tuple(torch.randn(B, T, H, D, device="cuda", dtype=DT) for _ in range(3))


def _slopes(H):
    return lightning_slopes(H, layer_idx=0, num_layers=80).cuda()


def _fla_decay(fn, slopes, B, T):
    """fla's simple_gla arguments for a fixed decay per head: g_gamma [H] where the installed fla
    takes it, else the same decay as a per-token gate g [B, T, H]."""
    if "g_gamma" in inspect.signature(fn).parameters:
        return {"g_gamma": -slopes}
    return {"g": (-slopes).expand(B, T, -1).contiguous()}


# ---------------------------------------------------------------- decode
# the least a step moves: the fp32 state read and written, q, k, v in and o out (bf16)
STEP_BYTES = costs.decode_bytes(vectors_per_token=4)


def _book_step(c):
    q, k, v = _qkv(c["B"], 1, c["H"], c["D"])
    s, S = _slopes(c["H"]), costs.random_state(c)
    return lambda: fused_recurrent_lightning(q, k, v, s, initial_state=S, output_final_state=True)


def _torch_step(c):
    q, k, v = (x[:, 0] for x in _qkv(c["B"], 1, c["H"], c["D"]))
    s, S = _slopes(c["H"]), costs.random_state(c)
    return lambda: torch_lightning_step(q, k, v, s, S)


def _fla_step(c):
    step = fla("simple_gla", "fused_recurrent_simple_gla")
    if step is None:
        return None
    q, k, v = _qkv(c["B"], 1, c["H"], c["D"])
    S, decay = costs.random_state(c), _fla_decay(step, _slopes(c["H"]), c["B"], 1)
    return lambda: step(q, k, v, **decay, scale=1.0, initial_state=S, output_final_state=True)


DECODE_CASES = [{"B": b, "H": H_DEC, "D": D_DEC} for b in (1, 8, 64)]
DECODE_PROVIDERS = {"book": _book_step, "PyTorch step": _torch_step,
                    "fla fused_recurrent_simple_gla": _fla_step}

# One step, B = 1, 8, 64: a plain Python call (launch and wrapper overhead included), and the same
# call replayed from a CUDA graph (GPU time alone). The state dominates the bytes: 268 MB at B = 64.
DECODE_PLAIN = Benchmark("lightning_decode_plain", DECODE_CASES, DECODE_PROVIDERS, costs.decode_flops, STEP_BYTES,
                         module=__name__)
DECODE_GRAPH = Benchmark("lightning_decode_graph", DECODE_CASES, DECODE_PROVIDERS, costs.decode_flops, STEP_BYTES,
                         timer="graph", module=__name__)


# ---------------------------------------------------------------- decode against the context length
CONTEXT_CASES = [{"B": 1, "T": t, "H": H_DEC, "D": D_DEC} for t in (4096, 16384, 65536)]

# The softmax layer of the hybrid has MiniMax-01's grouping: its softmax layers give 64 query heads 8 KV
# heads (8:1). At the chapter's 32 query heads that is 4 KV heads: both sides of the comparison are half
# of MiniMax-01's layer (32 of its 64 Lightning heads, 4 of its 8 KV heads).
HKV_SOFTMAX = 4

# Softmax decode: one query per head over a T-long KV cache of HKV_SOFTMAX heads, 4·B·H·T·D FLOPs and
# the 2·B·HKV·T·D bf16 cache read. Graph-replayed.
CONTEXT_SOFTMAX = Benchmark("lightning_decode_context_softmax_gqa",
                            [{**c, "HKV": HKV_SOFTMAX} for c in CONTEXT_CASES], {"SDPA flash": costs.sdpa_decode},
                            flops=costs.softmax_decode_flops, bytes_moved=costs.softmax_decode_bytes,
                            timer="graph", module=__name__)
# One Lightning step at the same B, H, D: the fixed state read and write, whatever T is. Graph-replayed.
CONTEXT_LIGHTNING = Benchmark("lightning_decode_context", CONTEXT_CASES, {"book": _book_step},
                              flops=costs.decode_flops, bytes_moved=STEP_BYTES, timer="graph", module=__name__)


# ---------------------------------------------------------------- prefill
prefill_flops = costs.chunk_flops  # the same tiled algorithm as GLA's chunk form
prefill_bytes = costs.prefill_bytes(vectors_per_token=4)  # q, k, v read and o written once, bf16; the decay is [H]


def _book_chunk(c):
    q, k, v = _qkv(c["B"], c["T"], c["H"], c["D"])
    s = _slopes(c["H"])
    return lambda: chunk_lightning(q, k, v, s)


def _fla_chunk(c):
    chunk = fla("simple_gla", "chunk_simple_gla")
    if chunk is None:
        return None
    q, k, v = _qkv(c["B"], c["T"], c["H"], c["D"])
    decay = _fla_decay(chunk, _slopes(c["H"]), c["B"], c["T"])
    return lambda: chunk(q, k, v, **decay, scale=1.0)


# B = 1, H = 32, D = 128, T = 1K..16K. Plain calls. SDPA flash is the softmax layer of a hybrid at
# the same shape, with 32 KV heads (one per query head: the cases hold no HKV): its matmul work is what
# a grouped layer does too, only its K and V reads are larger. Where its quadratic time crosses the
# linear one is the crossover in context length.
PREFILL = Benchmark(
    "lightning_prefill",
    [{"B": 1, "T": t, "H": 32, "D": 128} for t in (1024, 2048, 4096, 8192, 16384)],
    {"book: chunk": _book_chunk, "fla chunk_simple_gla": _fla_chunk, "SDPA flash": costs.sdpa_causal},
    prefill_flops, prefill_bytes, timer="flushed", module=__name__)


# ---------------------------------------------------------------- training
def _book_train(c, cu_seqlens=None):
    """chunk_lightning forward and backward to q, k, v; given cu_seqlens, a packed call (`costs.packed`)."""
    q, k, v = (x.requires_grad_() for x in _qkv(c["B"], c["T"], c["H"], c["D"]))
    s, packed = _slopes(c["H"]), costs.offsets(cu_seqlens)
    return costs.train_step(lambda *x: chunk_lightning(*x, s, **packed), (q, k, v), (q, k, v))


def _fla_train(c, cu_seqlens=None):
    chunk = fla("simple_gla", "chunk_simple_gla")
    if chunk is None:
        return None
    q, k, v = (x.requires_grad_() for x in _qkv(c["B"], c["T"], c["H"], c["D"]))
    decay = _fla_decay(chunk, _slopes(c["H"]), c["B"], c["T"])
    packed = costs.offsets(cu_seqlens)
    return costs.train_step(lambda *x: chunk(*x, **decay, scale=1.0, **packed), (q, k, v), (q, k, v))


# B = 1 and 8, H = 32, D = 128, T = 4K and 16K: forward + backward to q, k, v (the decay is fixed), plain calls.
# SDPA flash has 32 KV heads, one per query head.
TRAIN = Benchmark(
    "lightning_train",
    [{"B": b, "T": t, "H": 32, "D": 128} for b in (1, 8) for t in (4096, 16384)],
    {"book: chunk": _book_train, "fla chunk_simple_gla": _fla_train, "SDPA flash": costs.sdpa_causal_train},
    costs.train_flops, costs.train_bytes(inputs_per_token=3), timer="flushed", module=__name__)

# The training step on packed sequences: 16K tokens of long-tailed lengths (the FlashAttention chapter's mix,
# `costs.packed_cases`), H = 32, D = 128, plain calls. The packed call, the same sequences padded to the
# longest into a [N, T_max, H, D] batch, and fla's packed call; the work is TRAIN's, sequence by sequence.
PACKED = Benchmark(
    "lightning_packed", costs.packed_cases(H=32, D=128),
    {"book: packed": costs.packed(_book_train), "book: padded": costs.padded(_book_train),
     "fla chunk_simple_gla": costs.packed(_fla_train)},
    costs.per_sequence(TRAIN.flops), costs.per_sequence(TRAIN.bytes_moved), timer="flushed", module=__name__)

# The prompts at B = 1 up to 4K replayed from a CUDA graph: the GPU's time, without the host's
PREFILL_GRAPH = PREFILL.replayed(("book: chunk", "fla chunk_simple_gla", "SDPA flash"))

BENCHMARKS = [CONTEXT_SOFTMAX, CONTEXT_LIGHTNING, DECODE_PLAIN, DECODE_GRAPH, PREFILL, PREFILL_GRAPH, TRAIN, PACKED]

HEADLINE = Panel("lightning_prefill", {"B": 1}, "T", "ms", ("book: chunk", "fla chunk_simple_gla", "SDPA flash"),
                 "Lightning prefill (SDPA: causal softmax)\nB=1, H=32, D=128")


__all__ = ["CONTEXT_SOFTMAX", "CONTEXT_LIGHTNING", "DECODE_PLAIN", "DECODE_GRAPH", "PREFILL", "PREFILL_GRAPH", "TRAIN",
           "PACKED", "BENCHMARKS", "HEADLINE", "STEP_BYTES", "prefill_flops", "prefill_bytes"]
