"""Does a CUDA-graph replay of an MLA paged-decode provider do the work of a plain call? (GPU only.)

    python3 scripts/mla_replay_check.py                       # FlashMLA and the book's kernels, the usual cases
    python3 scripts/mla_replay_check.py "book: TileLang" 128 16384

For each provider of `mla_bench.PAGED_PROVIDERS` named and each (B, T) case (pages in order), on the inputs the
benchmark uses: one plain call, then the same call captured in a CUDA graph and replayed once. It prints both
outputs' largest difference from the fp32 reference of the first sequence, the plain and replayed times, and
the replay's TFLOP/s against the GPU's measured ceiling: a replay faster than the ceiling, or with another
answer, does not do the plain call's work. Each line is printed before the next case starts, so a case that
never finishes is the one after the last line (run it under `timeout`).

Why: in the H200 sweep FlashMLA's replayed times at B = 64 and B = 128 from T = 8K on came out above the GPU's
ceiling (1,053 TFLOP/s at B = 128, T = 8K), while its plain calls matched its published speed; and the sweep
never got past the TileLang kernel's replay at B = 128, T = 16K, whose plain call finished in 2 s.
"""
import sys
import time

import torch
import triton.testing

from attention_kernels.bench import measure_ceilings, time_graph_ms
from attention_kernels.mla import bench as mla_bench
from attention_kernels.mla.reference import mla_decode_ref

CASES = [(8, 8192), (64, 8192), (128, 8192), (128, 16384)]
PROVIDERS = ["book", "FlashMLA", "book: TileLang"]


def first_sequence_ref(case):
    """The fp32 reference output of sequence 0 (the benchmark's inputs: one seed per case)."""
    q, _, pages, table, seqlens = mla_bench._paged_inputs(case)
    out, _ = mla_decode_ref(q[:1].float(), pages.float(), table[:1], seqlens[:1], mla_bench.D_C, mla_bench.SCALE)
    return out


def check(label, B, T, peak_tflops):
    case = mla_bench._paged_case(B, T, "in order")
    fn = mla_bench.PAGED_PROVIDERS[label](case)
    if fn is None:
        print(f"{label:16s} B={B:4d} T={T:6d}: n/a here", flush=True)
        return
    ref = first_sequence_ref(case)
    plain = fn()[0][:1].float()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn()
    start = time.time()
    graph.replay()
    torch.cuda.synchronize()
    replay_s = time.time() - start
    replayed = captured[0][:1].float()
    plain_ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    graph_ms = time_graph_ms(fn)
    tflops = mla_bench.decode_flops(case) / graph_ms / 1e9
    print(f"{label:16s} B={B:4d} T={T:6d}: max |plain - ref| {(plain - ref).abs().max():.3g}, "
          f"max |replay - ref| {(replayed - ref).abs().max():.3g}, first replay {replay_s * 1e3:.1f} ms; "
          f"plain {plain_ms:.4f} ms, replayed {graph_ms:.4f} ms = {tflops:.0f} TFLOP/s "
          f"({100 * tflops / peak_tflops:.0f} % of the measured ceiling)", flush=True)


if __name__ == "__main__":
    labels = [sys.argv[1]] if len(sys.argv) > 1 else PROVIDERS
    cases = [(int(sys.argv[2]), int(sys.argv[3]))] if len(sys.argv) > 3 else CASES
    peak = measure_ceilings()["peak_tflops"]
    for B, T in cases:
        for label in labels:
            check(label, B, T, peak)
