"""Ring attention's benchmark, declared for a machine with 2 (or more) GPUs; nothing runs at import.

The shared harness (`attention_kernels.bench`) times one process; ring attention needs one process per GPU, so
this module declares the cases and the per-rank timing, and `run_sweep` spawns the ranks
(`attention_kernels.ring.launcher.spawn`) and returns the tidy table (the harness's columns: family, op, provider,
B, T, H, D, causal, dtype, world, ms, tflops, note).

    RING_T    T = 128K, 256K, 512K, 1M tokens, B = 1, H = 32 (MHA), D = 128, bf16, causal, fwd + bwd
    providers "book" (flash_attn_func's Triton forward, world 1), "book: ring" (ring_flash_attn_func, zig-zag),
              "PyTorch context_parallel" (torch.distributed.tensor.experimental.context_parallel
              around SDPA, pinned to cuDNN or flash), world 1 where it applies and world W.

    >>> df = run_sweep(world=2)          # on a 2-GPU machine: a pandas DataFrame, one row per case
"""
from __future__ import annotations

import torch

DTYPE = "bfloat16"
RING_T = [131072, 262144, 524288, 1048576]
SHAPE = {"B": 1, "H": 32, "D": 128}
PROVIDERS = ("book", "book: ring", "PyTorch context_parallel (cuDNN)", "PyTorch context_parallel (flash)")


def cases(world: int):
    """Every (provider, world, T) to time: the single-GPU book kernel at world 1, the rest at `world`."""
    out = []
    for T in RING_T:
        out.append({**SHAPE, "T": T, "causal": True, "provider": "book", "world": 1})
        for p in PROVIDERS[1:]:
            out.append({**SHAPE, "T": T, "causal": True, "provider": p, "world": world})
    return out


def flops(c) -> float:
    """Forward + backward matmul FLOPs of causal attention over the whole sequence (all ranks together)."""
    from ..flash_attn.reference import attention_flops

    args = (c["B"], c["H"], c["T"], c["T"], c["D"], c["causal"])
    return attention_flops(*args) + attention_flops(*args, backward=True)


def comm_bytes(c) -> float:
    """Bytes each rank sends per fwd + bwd: K and V slices W - 1 times forward and W - 1 times backward,
    dK and dV (fp32) W times backward."""
    W = c["world"]
    kv = 2 * c["B"] * (c["T"] // W) * c["H"] * c["D"] * 2
    return kv * (W - 1) * 2 + 2 * kv * W


def model_ms(T: int, world: int, block_tflops: float, link_gbps: float, B: int = 1, H: int = 32, HKV: int = 32,
             D: int = 128, elem_bytes: int = 2) -> dict:
    """A model of one causal fwd + bwd on `world` GPUs, from two measured rates: block_tflops, what one
    GPU reaches on a ring block (a T/W x T/W half block, fwd and bwd counted as in `attention_flops`), and
    link_gbps, the rank-to-rank transfer rate (GB/s, one direction). Each ring step costs the larger of
    its compute and its transfer (they overlap); the backward adds the last hop of dK/dV.
    Returns ms for "fwd", "bwd", "total", and "compute_bound" (whether every step hides its transfer)."""
    n = T // world
    kv = 2 * B * n * HKV * D * elem_bytes  # K and V of one slice
    half_block = 4.0 * B * H * n * n * D / 2  # zig-zag: every step is half of an n x n block
    fwd_c, bwd_c = half_block / block_tflops / 1e9, 2.5 * half_block / block_tflops / 1e9  # ms
    link = link_gbps * 1e6  # bytes per ms
    if world == 1:
        return {"fwd": fwd_c, "bwd": bwd_c, "total": fwd_c + bwd_c, "compute_bound": True}
    fwd_x, bwd_x = kv / link, (kv + 2 * kv * 4 / elem_bytes) / link  # bwd: K, V and the fp32 dK, dV
    fwd = fwd_c + (world - 1) * max(fwd_c, fwd_x)
    bwd = bwd_c + (world - 1) * max(bwd_c, bwd_x) + 2 * kv * 4 / elem_bytes / link
    return {"fwd": fwd, "bwd": bwd, "total": fwd + bwd, "compute_bound": fwd_c >= fwd_x and bwd_c >= bwd_x}


def _full_inputs(c, device):
    g = torch.Generator(device=device).manual_seed(0)
    shape = (c["B"], c["T"], c["H"], c["D"])
    return [torch.randn(shape, generator=g, device=device, dtype=getattr(torch, DTYPE)) for _ in range(4)]


def _step_book(c, rank, world):
    from ..flash_attn import flash_attn_func

    if c["T"] * c["H"] * c["D"] >= 2 ** 31:  # past the int32 row offsets of attention_kernels.flash_attn's kernels
        return None

    q, k, v, do = _full_inputs(c, "cuda")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    return lambda: torch.autograd.grad(flash_attn_func(q, k, v, causal=True, backend="triton"), (q, k, v), do)


def _step_ring(c, rank, world):
    from .interface import ring_flash_attn_func
    from .zigzag import zigzag_split

    q, k, v, do = (zigzag_split(t, rank, world) for t in _full_inputs(c, "cuda"))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    return lambda: torch.autograd.grad(ring_flash_attn_func(q, k, v, causal=True, backend="triton"), (q, k, v), do)


def _step_context_parallel(backend):
    """PyTorch's own context parallelism: SDPA on [B, H, T, D] buffers that context_parallel shards
    along T (its load balancer reorders a causal sequence head-and-tail, like the zig-zag)."""
    def step(c, rank, world):
        import torch.nn.functional as F
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        from torch.nn.attention import SDPBackend, sdpa_kernel

        pinned = {"cuDNN": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
        mesh = init_device_mesh("cuda", (world,))
        q, k, v, do = (t.transpose(1, 2).contiguous() for t in _full_inputs(c, "cuda"))
        ctx = context_parallel(mesh, buffers=[q, k, v, do], buffer_seq_dims=[2, 2, 2, 2])
        ctx.__enter__()  # shards the buffers in place; left open for the timing loop

        def run():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(pinned):
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
            return torch.autograd.grad(o, (qq, kk, vv), do)
        return run
    return step


STEPS = {"book": _step_book, "book: ring": _step_ring,
         "PyTorch context_parallel (cuDNN)": _step_context_parallel("cuDNN"),
         "PyTorch context_parallel (flash)": _step_context_parallel("flash")}


def time_rank(rank: int, world: int, todo, warmup: int = 3, reps: int = 10):
    """On every rank: time each case (all ranks in step, a barrier before and after each repetition);
    returns a list of row dicts on rank 0 (ms: the median over reps of the slowest rank's time)."""
    import statistics

    import torch.distributed as dist

    rows = []
    for c in todo:
        if c["world"] != world and not (c["world"] == 1 and rank == 0):
            continue
        note, ms = "", None
        try:
            fn = STEPS[c["provider"]](c, rank, world)
            if fn is None:
                raise NotImplementedError("n/a")
            for _ in range(warmup):
                fn()
            times = []
            for _ in range(reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if c["world"] == world:
                    dist.barrier()
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                t = torch.tensor([start.elapsed_time(end)], device="cuda")
                if c["world"] == world:
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                times.append(t.item())
            ms = statistics.median(times)
        except torch.cuda.OutOfMemoryError:
            note = "out of memory"
        except NotImplementedError:
            note = "n/a"
        except Exception as e:  # a peer that fails must not sink the sweep
            note = f"error: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        torch.cuda.empty_cache()
        if rank == 0:
            rows.append({"family": "ring", "op": "fwd+bwd", **c, "dtype": DTYPE, "ms": ms,
                         "tflops": flops(c) / ms / 1e9 if ms else None, "note": note})
        if world > 1:
            dist.barrier()  # the world-1 rows run on rank 0 while the others wait here
    return rows


def run_sweep(world: int = 2, todo=None):
    """Spawn `world` ranks (NCCL), time every case, return rank 0's rows as a DataFrame."""
    import pandas as pd

    from .launcher import spawn

    return pd.DataFrame(spawn(time_rank, world, todo or cases(world), backend="nccl")[0])


__all__ = ["RING_T", "SHAPE", "PROVIDERS", "cases", "flops", "comm_bytes", "model_ms", "time_rank", "run_sweep"]
