"""Spawn ring attention on W ranks of this machine: the correctness check, or the benchmark sweep.

    python scripts/ring_launch.py                      # check, 2 ranks (gloo + interpreter here, NCCL on GPUs)
    python scripts/ring_launch.py --world 3 --backend gloo
    python scripts/ring_launch.py --bench --world 2    # on 2 GPUs: time the sweep, write results/ring_fwdbwd.*
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import attention_kernels  # noqa: E402,F401  (the interpreter switch, before Triton is imported)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="number of ranks (one GPU each with NCCL)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default=None, help="default: nccl on GPUs, else gloo")
    parser.add_argument("--bench", action="store_true", help="time the benchmark sweep instead (NCCL, GPUs)")
    args = parser.parse_args()
    if args.bench:
        from attention_kernels import bench
        from attention_kernels.ring.benchmark import run_sweep

        df = run_sweep(args.world)
        print(df.to_string(index=False))
        bench.save(df, "ring_fwdbwd", {**bench.metadata(), "world": args.world})
        return
    from attention_kernels.ring.launcher import check_gla_rank, gla_cases, ring_check, small_cases, spawn

    for row in ring_check(args.world, small_cases(args.world), backend=args.backend):
        print(f"ring  {row['case']:<36} " + "  ".join(f"{n} {row[n]:.1e}" for n in ("o", "dq", "dk", "dv")))
    for row in spawn(check_gla_rank, args.world, gla_cases(args.world), backend=args.backend)[0]:
        print(f"gla   {row['case']:<36} o {row['o']:.1e}  state {row['state']:.1e}")


if __name__ == "__main__":
    main()
