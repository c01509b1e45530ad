"""Run a function on W ranks of this machine (one process each, torch.multiprocessing's spawn), and the
correctness check of ring attention that the tests, the chapter and scripts/ring_launch.py share.

    >>> errors = ring_check(world=2, cases=SMALL_CASES)    # gloo + the interpreter here, NCCL on GPUs
    >>> max(e["o"] for e in errors)                        # relative errors against fp64 attention
"""
from __future__ import annotations

import dataclasses
import os
import socket

import torch


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, fn, world, backend, port, queue, args):
    os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
    import torch.distributed as dist

    import attention_kernels  # noqa: F401  (the interpreter switch, before Triton is imported)

    if backend == "nccl":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    # No try/finally: a rank that raises must exit at once (spawn then stops the others), not wait in a
    # barrier that ranks blocked on its messages would never reach.
    queue.put((rank, fn(rank, world, *args)))  # small results only: the parent reads them after the join
    dist.barrier()
    dist.destroy_process_group()


def spawn(fn, world: int, *args, backend: str | None = None):
    """Run fn(rank, world, *args) on `world` new processes joined in one process group (gloo on a CPU,
    NCCL with one GPU per rank on a CUDA machine). fn must be importable (a module-level function).
    Returns the list of fn's results in rank order; an exception in any rank is raised here."""
    import torch.multiprocessing as mp

    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl" and torch.cuda.device_count() < world:
        raise ValueError(f"world {world} needs {world} GPUs for NCCL, this machine has {torch.cuda.device_count()}")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(_rank_main, args=(fn, world, backend, free_port(), queue, args), nprocs=world,
                       join=True, start_method="spawn")
    results = dict(queue.get() for _ in range(world))
    return [results[r] for r in range(world)]


# ---------------------------------------------------------------------------------- the check
@dataclasses.dataclass(frozen=True)
class Case:
    """One correctness case: the full sequence is [B, T, Hq, D] (k, v with Hkv heads)."""
    B: int
    T: int
    HQ: int
    HKV: int
    D: int
    causal: bool
    dtype: str = "float32"
    seed: int = 0

    @property
    def name(self) -> str:
        kind = "causal" if self.causal else "full"
        return f"B{self.B}-T{self.T}-H{self.HQ}x{self.HKV}-D{self.D}-{kind}-{self.dtype}"


def small_cases(world: int = 2):
    """Cases small enough for the interpreter: local slices of 26 tokens (two zig-zag chunks of 13, no
    multiple of any tile), MHA and GQA, causal and not, fp32 and fp16."""
    T = 2 * world * 13
    return (Case(1, T, 2, 2, 32, causal=True, dtype="float32"),
            Case(2, T, 4, 2, 32, causal=False, dtype="float32", seed=1),
            Case(1, T, 4, 2, 32, causal=True, dtype="float16", seed=2))


SMALL_CASES = small_cases(2)


def check_rank(rank: int, world: int, cases, group_ranks=None):
    """Run on every rank: for each case, the same random full q, k, v on every rank, this rank's slice
    through ring_flash_attn_func (forward and backward), the slices gathered back, and on rank 0 the
    relative errors of o, dq, dk, dv against fp64 softmax attention on the full tensors.
    group_ranks: run the ring on dist.new_group(group_ranks) (ranks outside it return []).
    Returns a list of dicts (case, dtype, o, dq, dk, dv, nan, same_without_grad) on rank 0, [] elsewhere."""
    import torch.distributed as dist

    from ..common import rel_err
    from ..flash_attn.reference import attention_ref
    from .interface import ring_flash_attn_func
    from .zigzag import contiguous_split, gather_sequence, zigzag_split

    group = None
    if group_ranks is not None:
        group = dist.new_group(list(group_ranks))
        if rank not in group_ranks:
            return []
        rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    out = []
    for case in cases:
        dtype = getattr(torch, case.dtype)
        g = torch.Generator().manual_seed(case.seed)
        q = torch.randn(case.B, case.T, case.HQ, case.D, generator=g, dtype=torch.float64)
        k = torch.randn(case.B, case.T, case.HKV, case.D, generator=g, dtype=torch.float64)
        v = torch.randn(case.B, case.T, case.HKV, case.D, generator=g, dtype=torch.float64)
        do = torch.randn(case.B, case.T, case.HQ, case.D, generator=g, dtype=torch.float64)
        q, k, v, do = (t.to(dtype).to(device) for t in (q, k, v, do))  # round to the input dtype first
        split = zigzag_split if case.causal else contiguous_split
        q_l, k_l, v_l = (split(t, rank, world).requires_grad_() for t in (q, k, v))
        o_l = ring_flash_attn_func(q_l, k_l, v_l, causal=case.causal, group=group)
        o_l.backward(split(do, rank, world))
        with torch.no_grad():  # the inference path (no autograd) runs the same forward
            same_without_grad = bool(torch.equal(ring_flash_attn_func(q_l, k_l, v_l, causal=case.causal, group=group),
                                                 o_l))
        got = {name: gather_sequence(t, case.causal, group) for name, t in
               (("o", o_l.detach()), ("dq", q_l.grad), ("dk", k_l.grad), ("dv", v_l.grad))}
        if rank != 0:
            continue
        ref_dtype = torch.float64 if device == "cpu" else torch.float32
        q_r, k_r, v_r = (t.to(ref_dtype).requires_grad_() for t in (q, k, v))
        o_r = attention_ref(q_r, k_r, v_r, causal=case.causal, compute_dtype=ref_dtype)
        o_r.backward(do.to(ref_dtype))
        ref = {"o": o_r.detach(), "dq": q_r.grad, "dk": k_r.grad, "dv": v_r.grad}
        out.append({"case": case.name, "dtype": case.dtype,
                    **{n: rel_err(got[n], ref[n]) for n in ref},
                    "nan": any(bool(torch.isnan(t).any()) for t in got.values()),
                    "same_without_grad": same_without_grad})
    return out


def ring_check(world: int = 2, cases=SMALL_CASES, backend: str | None = None, group_ranks=None):
    """Spawn `world` ranks, run `check_rank` on them, return rank 0's list of error dicts."""
    return spawn(check_rank, world, tuple(cases), group_ranks, backend=backend)[0]




# ---------------------------------------------------------------------------------- GLA across ranks
def gla_cases(world: int = 2):
    """GLA cases for the interpreter: 70 and 40 tokens a rank (a 64-token chunk and a part; less than one)."""
    return (Case(1, world * 70, 2, 2, 32, causal=True, dtype="float32"),
            Case(2, world * 40, 2, 2, 16, causal=True, dtype="float16", seed=1))


GLA_CASES = gla_cases(2)


def check_gla_rank(rank: int, world: int, cases):
    """Run on every rank: GLA over the contiguous split with `gla_context_parallel` (from a random initial
    state), gathered, against the fp64 loop `naive_recurrent_gla` on the full sequence. Returns rank 0's
    list of dicts (case, dtype, o and final-state relative errors); HKV is unused (GLA has one head count)."""
    from ..common import rel_err
    from ..gla.reference import naive_recurrent_gla
    from .linear import gla_context_parallel
    from .zigzag import contiguous_split, gather_sequence

    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    out = []
    for case in cases:
        dtype = getattr(torch, case.dtype)
        g = torch.Generator().manual_seed(case.seed)
        q, k, v = (torch.randn(case.B, case.T, case.HQ, case.D, generator=g).to(dtype).to(device) for _ in range(3))
        gk = torch.nn.functional.logsigmoid(torch.randn(case.B, case.T, case.HQ, case.D, generator=g)).to(device) / 8
        h0 = torch.randn(case.B, case.HQ, case.D, case.D, generator=g).to(device)
        parts = [contiguous_split(t, rank, world) for t in (q, k, v, gk)]
        o, S = gla_context_parallel(*parts, initial_state=h0, output_final_state=True)
        o = gather_sequence(o, causal=False)
        if rank == 0:
            o_ref, S_ref = naive_recurrent_gla(*(t.double() for t in (q, k, v, gk)), initial_state=h0.double(),
                                               output_final_state=True)
            out.append({"case": case.name, "dtype": case.dtype, "o": rel_err(o, o_ref), "state": rel_err(S, S_ref)})
    return out


__all__ = ["spawn", "free_port", "Case", "small_cases", "gla_cases", "SMALL_CASES", "GLA_CASES", "check_rank",
           "ring_check", "check_gla_rank"]
