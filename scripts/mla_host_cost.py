"""Host time of one `mla_decode` call's Python path, with the kernel launches stubbed out (no GPU needed).

    python scripts/mla_host_cost.py            # this tree
    python scripts/mla_host_cost.py --repeat 20000

What it measures: argument checks, the layout fix-ups, the split plan, the output allocations and the
workspace, for the Gluon route (its misfit test stubbed to pass, as on an H200 with bf16) and the Triton
route, dense and paged, with check_seqlens True and False. What it cannot: Triton's dispatcher or the
direct launch of a compiled kernel (no driver here), and CUDA's caching allocator (tensors are CPU ones:
torch.empty on the CPU costs about what the caching allocator does, a few microseconds).
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from attention_kernels.mla import decode, gluon_decode, inputs, interface, planning  # noqa: E402  (sets the interpreter)


def per_call_us(fn, repeat):
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeat * 1e6)
    return best


def main(argv):
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 5000
    launches = []
    decode.launch_triton = lambda *a: launches.append("triton")
    decode.launch_combine = lambda *a: launches.append("combine")
    gluon_decode.launch_gluon = lambda *a: launches.append("gluon")
    B, T, H, D = 1, 16384, 128, 576
    q = torch.randn(B, 1, H, D)
    kv = torch.empty(B, T, D)
    pages = kv.view(B * T // 64, 64, D)
    table = torch.arange(B * T // 64, dtype=torch.int32).view(B, T // 64)
    lens = torch.full((B,), T, dtype=torch.int32)
    scale = 576 ** -0.5
    print(f"mla_decode host path, launches stubbed; B={B}, T={T}, H={H}, D={D}; best of 5 x {repeat} calls")
    misfit = planning.gluon_misfit
    for route in ("gluon", "triton"):
        planning.gluon_misfit = (lambda *a: None) if route == "gluon" else misfit
        for cache, bt, name in ((kv, None, "dense"), (pages, table, "paged")):
            for check in (True, False):
                launches.clear()
                us = per_call_us(lambda: interface.mla_decode(q, cache, bt, lens, 512, scale,
                                                              check_seqlens=check), repeat)
                per = ", ".join(sorted(set(launches)))
                print(f"  {route:6s} {name:5s} check_seqlens={check!s:5s}: {us:6.1f} us  (launches: {per})")
    planning.gluon_misfit = misfit
    # the pieces
    pieces = {
        "check_decode_inputs": lambda: inputs.check_decode_inputs(q, pages, table, lens, 512, scale, kernel=True),
        "check_cache_lengths (sync)": lambda: inputs.check_cache_lengths(pages, table, lens, 1, False),
        "num_splits (cached)": lambda: planning.num_splits(1, 2, T, 132),
        "torch.empty out + lse": lambda: (torch.empty(B, 1, H, 512), torch.empty(B, H, 1)),
    }
    print("pieces:")
    for name, fn in pieces.items():
        print(f"  {name:27s}{per_call_us(fn, repeat // 5):6.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
