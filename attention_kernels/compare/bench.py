"""Every family side by side on the H200 (bf16 inputs, fp32 states): one declaration for the whole
comparison, each family at a published model's layer shape (`models.LAYERS`), timed by the families' own
providers and charged the families' own counted work.

    DECODE   one token's step at B = 1 and 64: softmax (GQA, LLaMA-3-8B's layer) and MLA (DeepSeek-V3's)
             over a cache of T = 4K, 16K, 64K; the four fixed-state steps (GLA, Lightning, KDA, Mamba-2)
             at one T, since their step does not depend on it. CUDA-graph replay.
    PREFILL  a whole prompt, B = 1, T = 4K and 16K: causal GQA softmax and the four chunked prefills
    TRAIN    forward and backward of the same, B = 1, T = 4K and 16K; TRAIN_MEMORY, the peak GPU memory
             of one such step (`bench.peak_memory`: inputs, what the forward keeps, the gradients)
    STACK    a few layers of a hybrid decoded in one graph (Kimi Linear's 3 KDA + 1 MLA, MiniMax-01's
             7 Lightning + 1 GQA), to check `models.stack_time`, the sum of the per-layer times

    >>> from attention_kernels.bench import run
    >>> df = run(DECODE)       # times on a GPU, loads results/compare_decode_graph.csv elsewhere

Cases: layer (its kind), B, T, H (query heads), D (head width: 576 for MLA's latent key, headdim for
Mamba-2); each layer's other numbers (KV heads, dstate, groups) come from its `Layer`. Providers: "book"
(the family's kernel), and the strongest peer each family's chapter measured ("SDPA flash", "FlashMLA",
"fla", "mamba_ssm"), "n/a" on the layers it does not run; the GQA rows of PREFILL also time "SDPA cuDNN",
"FlexAttention" and "FA4" (the FlashAttention chapter's providers of those names, the last two where installed),
and those of TRAIN "SDPA cuDNN" and "FA4" instead of "SDPA flash". A committed table written before a provider was declared has no rows for it: `run` loads it
as it is, and the chapter's tables show the providers it holds.
"""
from __future__ import annotations

import torch

from ..bench import Benchmark, peak_memory
from ..flash_attn import bench as fa_bench
from ..flash_attn.interface import flash_attn_func
from ..flash_attn.reference import attention_flops
from ..gla import bench as gla_bench
from ..kda import bench as kda_bench
from ..kda.interface import chunk_kda
from ..lightning import bench as lightning_bench
from ..linear import costs
from ..mamba2 import bench as mamba2_bench
from ..mla import bench as mla_bench
from ..peers import fla, sdpa
from . import tiny
from .models import LAYERS

DT = torch.bfloat16
DECODE_T = (4096, 16384, 65536)
STATE_T = 4096  # the fixed-state steps are timed once: their work does not depend on T
PREFILL_T = (4096, 16384)
CACHE_KINDS, STATE_KINDS = ("GQA", "MLA"), ("GLA", "Lightning", "KDA", "Mamba-2")


def family_case(c) -> dict:
    """The case as the layer's own family declares its cases: B, T, H, D and what the family adds."""
    layer = LAYERS[c["layer"]]
    case = {"B": c["B"], "T": c["T"], "H": layer.heads, "D": layer.head_dim}
    if layer.kind == "GQA":
        case.update(Hkv=layer.kv_heads, causal=True, **{"pass": "fwd"})
    elif layer.kind == "MLA":
        case.update(pages="shuffled")
    elif layer.kind == "Mamba-2":
        case.update(dstate=layer.dstate, G=layer.groups)
    return case


def _case(kind, B, T):
    layer = LAYERS[kind]
    return {"layer": kind, "B": B, "T": T, "H": layer.heads, "D": layer.head_dim}


def _by_layer(table):
    """A provider (or a count) that dispatches on the case's layer: table[kind](family case); a layer the
    table does not name gives None (an "n/a" row)."""
    def pick(c):
        f = table.get(c["layer"])
        return None if f is None else f(family_case(c))
    return pick


# ---------------------------------------------------------------- decode
# GQA: the FlashAttention chapter's decode table's providers, at LLaMA-3-8B's layer: the book's split-KV
# kernel (flash_attn_with_kvcache: the group's query heads in one program, the cache cut into slices) and
# SDPA's flash backend with enable_gqa
_gqa_decode_book = fa_bench.DECODE.providers["book"]
_gqa_decode_sdpa = fa_bench.DECODE.providers["SDPA flash"]

DECODE_FLOPS = {"GQA": fa_bench.decode_flops, "MLA": mla_bench.decode_flops, "GLA": costs.decode_flops,
                "Lightning": costs.decode_flops, "KDA": kda_bench.decode_flops, "Mamba-2": mamba2_bench.step_flops}
DECODE_BYTES = {"GQA": fa_bench.decode_bytes, "MLA": mla_bench.decode_bytes, "GLA": gla_bench.STEP_BYTES,
                "Lightning": lightning_bench.STEP_BYTES, "KDA": kda_bench.STEP_BYTES, "Mamba-2": mamba2_bench.step_bytes}
# MLA: the book on a contiguous cache, FlashMLA on shuffled pages (the MLA chapter times both on the same pages)
DECODE_BOOK = {"GQA": _gqa_decode_book, "MLA": mla_bench.DECODE_PROVIDERS["book"],
               "GLA": gla_bench.DECODE_PROVIDERS["book"], "Lightning": lightning_bench.DECODE_PROVIDERS["book"],
               "KDA": kda_bench.DECODE_PROVIDERS["book"], "Mamba-2": mamba2_bench.DECODE_PROVIDERS["book"]}
DECODE_PEERS = {
    "SDPA flash": {"GQA": _gqa_decode_sdpa},
    "FlashMLA": {"MLA": mla_bench.PAGED_PROVIDERS["FlashMLA"]},
    "fla": {"GLA": gla_bench.DECODE_PROVIDERS["fla fused_recurrent_gla"],
            "Lightning": lightning_bench.DECODE_PROVIDERS["fla fused_recurrent_simple_gla"],
            "KDA": kda_bench.DECODE_PROVIDERS["fla fused_recurrent_kda"]},
    "mamba_ssm": {"Mamba-2": mamba2_bench.DECODE_PROVIDERS["mamba_ssm selective_state_update"]},
}

DECODE = Benchmark(
    "compare_decode_graph",
    [_case(kind, b, t) for kind in CACHE_KINDS for b in (1, 64) for t in DECODE_T]
    + [_case(kind, b, STATE_T) for kind in STATE_KINDS for b in (1, 64)],
    {"book": _by_layer(DECODE_BOOK), **{peer: _by_layer(table) for peer, table in DECODE_PEERS.items()}},
    _by_layer(DECODE_FLOPS), _by_layer(DECODE_BYTES), timer="graph", module=__name__)


def against_peer(table):
    """Each family's rows against its one peer: the book's rows as they are, the peer's renamed "peer" with
    its name in a column `peer` (every layer is run by one peer, the others are n/a), so that a table of all
    the families has one time column per side instead of one per peer.

    >>> summary(against_peer(run(DECODE)), index=["layer", "peer", "B", "T"], over=["peer"])
    """
    timed = table[table["provider"].eq("book") | table["ms"].notna()]
    peer_of = timed[timed["provider"] != "book"].groupby("layer")["provider"].first()
    paired = timed.assign(peer=timed["layer"].map(peer_of).fillna("—"),
                          provider=timed["provider"].where(timed["provider"] == "book", "peer"))
    paired = paired.sort_values("provider", key=lambda p: p != "book", kind="stable")  # the book's column first
    paired.attrs = table.attrs
    return paired


# ---------------------------------------------------------------- prefill
PREFILL_FLOPS = {"GQA": fa_bench.flops, "GLA": gla_bench.prefill_flops, "Lightning": lightning_bench.prefill_flops,
                 "KDA": kda_bench.prefill_flops, "Mamba-2": mamba2_bench.prefill_flops}
PREFILL_BYTES = {"GQA": fa_bench.bytes_moved, "GLA": gla_bench.prefill_bytes,
                 "Lightning": lightning_bench.prefill_bytes, "KDA": kda_bench.prefill_bytes,
                 "Mamba-2": mamba2_bench.prefill_bytes}
PREFILL_BOOK = {"GQA": fa_bench.GQA.providers["book"], "GLA": gla_bench.PREFILL.providers["book: chunk"],
                "Lightning": lightning_bench.PREFILL.providers["book: chunk"],
                "KDA": kda_bench.PREFILL.providers["book: chunk"],
                "Mamba-2": mamba2_bench.PREFILL.providers["book: SSD chunk scan"]}
PREFILL_PEERS = {
    "SDPA flash": {"GQA": fa_bench.GQA.providers["SDPA flash"]},
    "SDPA cuDNN": {"GQA": fa_bench.GQA.providers["SDPA cuDNN"]},   # as in the training table: the strongest peer
    "FlexAttention": {"GQA": fa_bench.GQA.providers["FlexAttention"]},
    "FA4": {"GQA": fa_bench.GQA.providers["FA4"]},
    "fla": {"GLA": gla_bench.PREFILL.providers["fla chunk_gla"],
            "Lightning": lightning_bench.PREFILL.providers["fla chunk_simple_gla"],
            "KDA": kda_bench.PREFILL.providers["fla chunk_kda"]},
    "mamba_ssm": {"Mamba-2": mamba2_bench.PREFILL.providers["mamba_ssm"]},
}
# MLA is left out of prefill and training: its prompt runs as ordinary attention over the decompressed
# keys and values (the FlashAttention chapter's kernels), not as a kernel of its own.
PREFILL_KINDS = ("GQA", *STATE_KINDS)

PREFILL = Benchmark(
    "compare_prefill",
    [_case(kind, 1, t) for kind in PREFILL_KINDS for t in PREFILL_T],
    {"book": _by_layer(PREFILL_BOOK), **{peer: _by_layer(table) for peer, table in PREFILL_PEERS.items()}},
    _by_layer(PREFILL_FLOPS), _by_layer(PREFILL_BYTES), timer="flushed", module=__name__)


# ---------------------------------------------------------------- training
def _gqa_train_flops(c):
    """Causal attention forward and backward (the backward 2.5 times the forward's matmuls)."""
    return sum(attention_flops(c["B"], c["H"], c["T"], c["T"], c["D"], True, backward=b) for b in (False, True))


def _gqa_train_bytes(c):
    return sum(fa_bench.bytes_moved({**c, "pass": p}) for p in ("fwd", "bwd"))


def _gqa_train(layout, attention):
    """Forward and backward of attention(c)(q, k, v), q, k, v in `layout`; attention(c) None: n/a."""
    def factory(c):
        attend = attention(c)
        if attend is None:
            return None
        B, T, H, Hkv, D = c["B"], c["T"], c["H"], c["Hkv"], c["D"]
        shape = (lambda h: (B, T, h, D)) if layout == "bthd" else (lambda h: (B, h, T, D))
        q, k, v = (torch.randn(shape(h), device="cuda", dtype=DT, requires_grad=True) for h in (H, Hkv, Hkv))
        return costs.train_step(attend, (q, k, v), (q, k, v))
    return factory


def _book_gqa(c):
    return lambda q, k, v: flash_attn_func(q, k, v, causal=True)


def _sdpa_gqa(backend):
    """SDPA pinned to `backend` ("flash" or "cuDNN"), causal, k and v with the layer's fewer heads; a backend
    that does not take them (it raises on a first call) is n/a."""
    def attention(c):
        attend = sdpa(backend)

        def causal(q, k, v):
            return attend(q, k, v, causal=True, enable_gqa=True)
        try:  # one call on a short sequence with the layer's heads
            q, k = (torch.randn(1, h, 128, c["D"], device="cuda", dtype=DT) for h in (c["H"], c["Hkv"]))
            causal(q, k, k)
        except RuntimeError:
            return None
        return causal
    return attention


def _kda_train(chunk):
    """forward and backward of chunk(q, k, v, g, beta) to all five, q and k normalised inside."""
    def factory(c):
        fn = chunk()
        if fn is None:
            return None
        q, k, v, x = (torch.randn(c["B"], c["T"], c["H"], c["D"], device="cuda", dtype=DT) for _ in range(4))
        g = (torch.nn.functional.logsigmoid(x.float()) / 16).to(DT)
        beta = torch.rand(c["B"], c["T"], c["H"], device="cuda", dtype=DT)
        inputs = [t.requires_grad_() for t in (q, k, v, g, beta)]
        return costs.train_step(lambda *a: fn(*a, use_qk_l2norm_in_kernel=True), inputs, inputs)
    return factory


def _kda_train_flops(c):
    """3 · the chunked prefill's matmul work, as for the other linear families."""
    return 3 * kda_bench.prefill_flops(c)


TRAIN_FLOPS = {"GQA": _gqa_train_flops, "GLA": costs.train_flops, "Lightning": costs.train_flops,
               "KDA": _kda_train_flops, "Mamba-2": mamba2_bench.train_flops}
# KDA: q, k, v, g per token (beta, one number per head, left out)
TRAIN_BYTES = {"GQA": _gqa_train_bytes, "GLA": costs.train_bytes(4), "Lightning": costs.train_bytes(3),
               "KDA": costs.train_bytes(4), "Mamba-2": mamba2_bench.train_bytes}
TRAIN_BOOK = {"GQA": _gqa_train("bthd", _book_gqa), "GLA": gla_bench.TRAIN.providers["book: chunk"],
              "Lightning": lightning_bench.TRAIN.providers["book: chunk"], "KDA": _kda_train(lambda: chunk_kda),
              "Mamba-2": mamba2_bench.TRAIN.providers["book: chunk 64"]}
# Softmax's training rows take cuDNN (the FlashAttention chapter's strongest measured peer) and FA4 where it is
# installed. SDPA flash and FlexAttention are that chapter's to time: FlexAttention's backward compiles for
# minutes, which would be most of this table's sweep.
TRAIN_PEERS = {
    "SDPA cuDNN": {"GQA": _gqa_train("bhtd", _sdpa_gqa("cuDNN"))},
    "FA4": {"GQA": _gqa_train("bthd", fa_bench.fa4_forward)},
    "fla": {"GLA": gla_bench.TRAIN.providers["fla chunk_gla"],
            "Lightning": lightning_bench.TRAIN.providers["fla chunk_simple_gla"],
            "KDA": _kda_train(lambda: fla("kda", "chunk_kda"))},
    "mamba_ssm": {"Mamba-2": mamba2_bench.TRAIN.providers["mamba_ssm chunk 256"]},
}

TRAIN = Benchmark(
    "compare_train",
    [_case(kind, 1, t) for kind in PREFILL_KINDS for t in PREFILL_T],
    {"book": _by_layer(TRAIN_BOOK), **{peer: _by_layer(table) for peer, table in TRAIN_PEERS.items()}},
    _by_layer(TRAIN_FLOPS), _by_layer(TRAIN_BYTES), timer="flushed", module=__name__)
# The same steps' peak GPU memory, one measured step a row (inputs and the upstream gradient included)
TRAIN_MEMORY = Benchmark("compare_train_memory", TRAIN.cases, TRAIN.providers, TRAIN.flops, TRAIN.bytes_moved,
                         measure=peak_memory, module=__name__)


# ---------------------------------------------------------------- a few layers of a hybrid in one graph
# Each stack is one repeat of its model's pattern (the names are attention_kernels.compare.models.MODELS's), every layer on its own inputs and state, decoded with
# the provider the DECODE table times for that layer: the book's kernels, and SDPA flash for GQA.
STACKS = {"Kimi Linear 48B": (("KDA", 3), ("MLA", 1)), "MiniMax-01": (("Lightning", 7), ("GQA", 1))}
STACK_PROVIDER = {**DECODE_BOOK, "GQA": _gqa_decode_sdpa}
STACK_T = 16384


def _stack_layers(c):
    return [(kind, n, {**c, "layer": kind}) for kind, n in STACKS[c["model"]]]


def _stack_book(c):
    steps = []
    for kind, n, case in _stack_layers(c):
        for _ in range(n):
            step = STACK_PROVIDER[kind](family_case(case))
            if step is None:
                return None
            steps.append(step)

    def run():
        for step in steps:
            step()
    return run


def _stack_count(per_layer):
    return lambda c: sum(n * per_layer[kind](family_case(case)) for kind, n, case in _stack_layers(c))


STACK = Benchmark(
    "compare_stack_graph",
    [{"model": name, "layer": "stack", "B": b, "T": STACK_T, "H": LAYERS[stack[0][0]].heads,
      "D": LAYERS[stack[0][0]].head_dim} for name, stack in STACKS.items() for b in (1, 64)],
    {"book": _stack_book}, _stack_count(DECODE_FLOPS), _stack_count(DECODE_BYTES), module=__name__)

BENCHMARKS = [DECODE, PREFILL, TRAIN, TRAIN_MEMORY, STACK]
# Tables a page shows that a script of their own writes, not gpu_probe.py: name -> the command that measures them
# (the loss curves of "In a model", trained by scripts/train_tiny.py)
SCRIPT_TABLES = {tiny.RESULTS_NAME: tiny.MEASURE_COMMAND}
HEADLINE = None  # the comparison is its own chapter's figure, not a panel of the headline

__all__ = ["DECODE", "PREFILL", "TRAIN", "TRAIN_MEMORY", "STACK", "BENCHMARKS", "SCRIPT_TABLES", "HEADLINE", "STACKS",
           "family_case", "against_peer"]
