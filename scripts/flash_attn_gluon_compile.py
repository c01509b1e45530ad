"""Compile the Gluon FlashAttention forward for sm_90a without a GPU and print what ptxas reports.

    python scripts/flash_attn_gluon_compile.py                  # D 64 / 128 x causal or not, bf16: compile, print, check
    python scripts/flash_attn_gluon_compile.py --only 128 causal # one configuration (what the CPU test runs)
    python scripts/flash_attn_gluon_compile.py --only 128 causal overlapped   # its variant with the next scores
                                                                            # issued before the softmax
    python scripts/flash_attn_gluon_compile.py --only 128 causal pingpong     # the warpgroups taking turns
    python scripts/flash_attn_gluon_compile.py --keep DIR        # also write each variant's .ttgir / .ptx / ptxas log

A word `--only` does not take (a misspelled loop, say) ends the script with a message (`parse_args`).

Per variant (loop: in order, overlapped, ping-pong): Triton's shared-memory figure, ptxas's registers / spills /
performance notes, and instruction counts from the PTX (wgmma, TMA copies, mbarrier ops, setmaxnreg), through
`mla_gluon_compile.py`'s readers. Exits 1 if a compilation fails, ptxas spills or serializes the wgmma pipeline,
shared memory exceeds 227 KB, or the PTX lacks wgmma or TMA copies; the ping-pong loop must also hold its
hand-over (3 mbarrier waits and 3 arrives a warpgroup besides its own K and V ones, `TURN_OPS`). Needs no
CUDA device: the target is given explicitly.
Note: ptxas's "Used N registers" is the launch bound (maxnreg); the partitions then move to setmaxnreg's values.
"""
import os

os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported (attention_kernels/__init__ would pick the interpreter)

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton
from triton.experimental.gluon._runtime import GluonASTSource

from attention_kernels.flash_attn import gluon_forward as gf
from mla_gluon_compile import PTXAS, TARGET, report

SIG = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16", "lse_ptr": "*fp32",
       "scale_log2": "fp32", "T": "i32", "S": "i32", "HQ": "i32", "HKV": "i32"}


SCHEDULES = {"in-order": gf.IN_ORDER.value, "overlapped": gf.OVERLAPPED.value, "pingpong": gf.PINGPONG.value}
# The ping-pong loop's turn barrier sites per warpgroup in the PTX: waited on and handed over in round 0, in the
# unmasked rounds' loop and in the last round. Its other extra sites, next to the in-order loop's, are one K and
# one V wait and release a warpgroup (round 0 and the last round): without the turns it would have 2 of each.
TURN_OPS = 3


def build(D: int, causal: bool, schedule: str):
    bn, stages = gf.FWD_TILES[D]
    consts = {"D": D, "BN": bn, "STAGES": stages, "CAUSAL": causal, "SCHEDULE": SCHEDULES[schedule],
              "CONSUMER_REGS": gf.WS_CONSUMER_REGS,
              "PRODUCER_REGS": gf.WS_PRODUCER_REGS, "num_warps": 4}
    return compile_warp_specialized(gf.attn_fwd_ws_kernel, SIG, ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr"),
                                    consts, gf.WS_MAXNREG)


def compile_warp_specialized(fn, sig, pointers, consts, maxnreg: int):
    """Compile Gluon kernel fn for sm_90a as its launcher runs it: sig the non-constexpr arguments' types,
    pointers those 16-byte aligned, consts the constexprs (num_warps 4), maxnreg the launch bound. An argument
    neither names ends the script: a kernel that grew one needs its script told."""
    missing = set(fn.arg_names) - set(sig) - set(consts)
    if missing:
        raise SystemExit(f"the kernel has arguments this script does not know: {sorted(missing)}")
    sig = dict(sig, **{k: "constexpr" for k in consts})
    div16 = [["tt.divisibility", 16]]   # what the launcher sees: pointers 16-byte aligned (ints not specialized)
    attrs = {(fn.arg_names.index(a), ): div16 for a in pointers}
    return triton.compile(GluonASTSource(fn, sig, consts, attrs), target=TARGET,
                          options={"num_warps": 4, "maxnreg": maxnreg})


def check(D: int, causal: bool, schedule: str, keep: Path | None) -> tuple[list, dict]:
    tag = f"fa_fwd_ws_d{D}_{'causal' if causal else 'full'}{'' if schedule == 'in-order' else '_' + schedule}"
    print(f"\n=== {tag} (BN, STAGES = {gf.FWD_TILES[D]}) ===")
    # neither variant is the default yet: their spills are reported, and they are timed on the GPU first
    why = {"overlapped": "at D = 128 only in the hidden-NaN path (its SASS), which finite V never takes",
           "pingpong": "at D = 128 only in the masked tiles' softmax and hidden-NaN check, which take the other "
                       "loops' code (its SASS: one register, 8 loads and 8 predicated stores a masked tile); "
                       "the ping-pong loop itself has none"}.get(schedule)
    problems, counts = report(build(D, causal, schedule), tag, keep, spills_allowed=why)
    if not counts["wgmma"] or not counts["tma_load"]:
        problems.append(f"{tag}: no wgmma or no TMA copy in the PTX")
    return problems, counts


def check_handover(counts: dict) -> list:
    """The ping-pong loop's turn barriers, against the in-order loop compiled with the same D and mask: each of
    the two warpgroups waits on its turn and hands it over at TURN_OPS sites more (in the PTX)."""
    problems = []
    for (D, causal, schedule), got in counts.items():
        base = counts.get((D, causal, "in-order"))
        if schedule != "pingpong" or base is None:
            continue
        for op in ("mbar_wait", "mbar_arrive"):
            extra = got[op] - base[op]
            print(f"D={D} causal={causal}: ping-pong {op} {got[op]} = in-order {base[op]} + {extra}")
            if extra < 2 * TURN_OPS:
                problems.append(f"D={D} causal={causal} pingpong: {extra} {op} more than in order, "
                                f"expected >= {2 * TURN_OPS}")
    return problems


def parse_args(argv, schedules, head_dims=(64, 128)) -> tuple[Path | None, tuple[int, bool, str] | None]:
    """--keep DIR (made if missing) and --only D causal|full [LOOP] as the variant (D, causal, loop), LOOP one of
    `schedules` ("in-order" where left out); each None where not given. A word neither option takes ends the
    script with a message naming it (SystemExit), so that a misspelled loop is not compiled as another. The
    backward's scripts (`flash_attn_gluon_bwd_compile.py`, `flash_attn_gluon_dq_compile.py`) share it."""
    usage = f"usage: [--keep DIR] [--only D causal|full [{'|'.join(schedules)}]]"
    keep, only, rest = None, None, list(argv)
    while rest:
        option = rest.pop(0)
        if option == "--keep" and rest:
            keep = Path(rest.pop(0))
            keep.mkdir(parents=True, exist_ok=True)
        elif option == "--only" and len(rest) >= 2:
            D, mask = rest.pop(0), rest.pop(0)
            schedule = rest.pop(0) if rest and not rest[0].startswith("--") else "in-order"
            if D not in {str(d) for d in head_dims}:
                raise SystemExit(f"--only: head dim must be one of {list(head_dims)}, got {D!r}\n{usage}")
            if mask not in ("causal", "full"):
                raise SystemExit(f"--only: the mask must be causal or full, got {mask!r}\n{usage}")
            if schedule not in schedules:
                raise SystemExit(f"--only: the loop must be one of {list(schedules)}, got {schedule!r}\n{usage}")
            only = (int(D), mask == "causal", schedule)
        else:
            raise SystemExit(f"unknown or incomplete argument {option!r}\n{usage}")
    return keep, only


def compile_variants(variants, check, keep: Path | None, check_all=lambda counts: []) -> int:
    """Compile and check each variant, a tuple (D, causal, ...) of `check`'s leading arguments, which returns
    (problems, PTX counts); then `check_all` on the counts of those that compiled. Prints the verdict, returns the
    exit code: 1 if anything failed. The backward's scripts share it."""
    print(f"triton {triton.__version__}, target {TARGET}, ptxas {PTXAS.name}")
    problems, counts = [], {}
    for variant in variants:
        try:
            p, counts[variant] = check(*variant, keep)
            problems += p
        except Exception:  # noqa: BLE001 - report the failure, then exit non-zero
            traceback.print_exc()
            D, causal, *rest = variant
            problems.append(" ".join([f"D={D} causal={causal}", *rest]) + ": compilation error")
    problems += check_all(counts)
    print("FAIL  : " + "; ".join(problems) if problems else "OK")
    return 1 if problems else 0


def main(argv):
    keep, only = parse_args(argv, SCHEDULES)
    variants = [(D, causal, schedule) for schedule in SCHEDULES for D in (64, 128) for causal in (False, True)]
    if only is not None:
        variants = [only]
        if only[2] == "pingpong":   # with its in-order twin, to count the hand-over's barrier ops
            variants.insert(0, (only[0], only[1], "in-order"))
    return compile_variants(variants, check, keep, check_handover)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
