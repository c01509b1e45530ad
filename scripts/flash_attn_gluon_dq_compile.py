"""Compile the Gluon FlashAttention backward's dQ kernel (`gluon_dq.py`) for sm_90a without a GPU and print what
ptxas reports.

    python scripts/flash_attn_gluon_dq_compile.py                   # D 64 / 128 x causal or not, bf16
    python scripts/flash_attn_gluon_dq_compile.py --only 128 causal # one configuration (what the CPU test runs)
    python scripts/flash_attn_gluon_dq_compile.py --keep DIR        # also write each variant's .ttgir / .ptx / log

Per variant: Triton's shared-memory figure, ptxas's registers / spills / performance notes, and instruction counts
from the PTX (wgmma, TMA copies, mbarrier ops, setmaxnreg), through `mla_gluon_compile.py`'s readers and the
forward's script's driver (`compile_variants`, `parse_args`). Exits 1 if a compilation fails, ptxas spills or
serializes the wgmma pipeline, shared memory exceeds 227 KB, the PTX lacks wgmma or TMA copies, or a tile's
update lost its one partial wait (`wgmma.wait_group 1`: S waited on with dP still running, once in the masked
and once in the unmasked update of each warpgroup). Needs no CUDA device: the target is given explicitly.
Note: ptxas's "Used N registers" is the launch bound (maxnreg); the partitions then move to setmaxnreg's values.
"""
import os

os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported (attention_kernels would pick the interpreter)

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from attention_kernels.flash_attn import gluon_dq as gq
from flash_attn_gluon_compile import compile_variants, compile_warp_specialized, parse_args
from mla_gluon_compile import report

SIG = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16", "do_ptr": "*bf16", "dq_ptr": "*bf16",
       "lse_ptr": "*fp32", "delta_ptr": "*fp32", "scale_log2": "fp32", "sm_scale": "fp32", "T": "i32", "S": "i32",
       "HQ": "i32", "HKV": "i32"}
POINTERS = ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "do_ptr", "dq_ptr", "lse_ptr", "delta_ptr")
SCHEDULES = {"in-order": 0}   # one loop (parse_args wants the names it takes)


def build(D: int, causal: bool):
    bn, stages = gq.DQ_TILES[D]
    consts = {"D": D, "BN": bn, "STAGES": stages, "CAUSAL": causal, "CONSUMER_REGS": gq.WS_CONSUMER_REGS,
              "PRODUCER_REGS": gq.WS_PRODUCER_REGS, "num_warps": 4}
    return compile_warp_specialized(gq.attn_bwd_dq_ws_kernel, SIG, POINTERS, consts, gq.WS_MAXNREG)


def check(D: int, causal: bool, schedule: str, keep: Path | None) -> tuple[list, dict]:
    tag = f"fa_bwd_dq_ws_d{D}_{'causal' if causal else 'full'}"
    print(f"\n=== {tag} (BN, STAGES = {gq.DQ_TILES[D]}) ===")
    compiled = build(D, causal)
    problems, counts = report(compiled, tag, keep)
    if not counts["wgmma"] or not counts["tma_load"]:
        problems.append(f"{tag}: no wgmma or no TMA copy in the PTX")
    # each tile's update issues 3 products in 3 commit groups (S, dP, dQ) and waits on S with dP running
    partial = len(re.findall(r"wgmma\.wait_group\.sync\.aligned\s+1;", compiled.asm["ptx"]))
    print(f"ptx   : wgmma.wait_group 1 at {partial} of {counts['wgmma_wait']} waits, "
          f"{counts['wgmma_commit']} commit groups")
    if partial != counts["wgmma_commit"] // 3:
        problems.append(f"{tag}: {partial} waits with one product running, expected {counts['wgmma_commit'] // 3}")
    return problems, counts


def main(argv):
    keep, only = parse_args(argv, SCHEDULES)
    variants = [(D, causal, "in-order") for D in (64, 128) for causal in (False, True)]
    if only is not None:
        variants = [only]
    return compile_variants(variants, check, keep)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
