"""Train a tiny model of each family with the book's kernels and with the peer's; save the loss curves.

    python3 scripts/train_tiny.py                       # on a GPU: 300 steps each, results/in_a_model_losses.*
    python3 scripts/train_tiny.py --families gla,kda    # just these
    python3 scripts/train_tiny.py --cpu --steps 3       # under the Triton interpreter, tiny sizes (a check)

The models, the task and the sizes are in attention_kernels/compare/tiny.py; the page "In a model" draws
the curves. A peer that is not installed is left out (the book's curve alone), and the results' metadata
names the peers that ran, with their versions.
"""
import argparse
import sys
import time

import pandas as pd
import torch

from attention_kernels import peers
from attention_kernels.compare.tiny import FAMILIES, Setup, kernels, save_losses, train


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated, of " + ", ".join(FAMILIES))
    parser.add_argument("--steps", type=int, default=Setup.steps)
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (the Triton interpreter)")
    args = parser.parse_args(argv)
    families = args.families.split(",")
    unknown = set(families) - set(FAMILIES)
    if unknown:
        parser.error(f"unknown families {sorted(unknown)}: choose from {', '.join(FAMILIES)}")
    if not args.cpu and not torch.cuda.is_available():
        parser.error("no GPU here: pass --cpu for a short check under the interpreter")
    setup = Setup.small(args.steps) if args.cpu else Setup(steps=args.steps)
    device = "cpu" if args.cpu else "cuda"
    rows = []
    with peers.recording() as used:
        for family in families:
            for provider, fns in kernels(family).items():
                start = time.perf_counter()
                losses = train(family, fns, setup, device)
                print(f"{family:9} {provider:10} loss {losses[0]:.3f} -> {losses[-1]:.3f} "
                      f"({time.perf_counter() - start:.1f} s)", flush=True)
                rows += [{"family": family, "provider": provider, "step": i, "loss": v} for i, v in enumerate(losses)]
    save_losses(pd.DataFrame(rows), setup, used)


if __name__ == "__main__":
    sys.exit(main())
