"""How a sequence is cut across the ranks of a ring, and which block each rank computes at each step.

Non-causal attention does not care how the keys are ordered, so the plain contiguous split works:
rank r holds tokens [r·T/W, (r+1)·T/W). Causal attention does care: with the contiguous split, rank 0's
queries see only its own keys while rank W-1's see every key, so rank W-1 works W times longer and
the ring waits for it at every step. The zig-zag split cuts the sequence into 2·W chunks of c = T/(2W)
tokens and gives rank r chunks r and 2W-1-r: an early chunk and its mirror, so every rank holds the
same amount of visible (query, key) pairs.

    >>> x = torch.arange(8)[None, :, None, None]           # [B=1, T=8, H=1, D=1]
    >>> zigzag_split(x, rank=0, world=2).flatten()          # chunks 0 and 3 of 4
    tensor([0, 1, 6, 7])
    >>> zigzag_unsplit([zigzag_split(x, r, 2) for r in range(2)]).equal(x)
    True
"""
from __future__ import annotations

import dataclasses

import torch

from ..checks import check_int, check_tensor


def _check_split_args(x, rank, world, dim, parts_per_rank):
    check_tensor("x", x)
    world = check_int("world", world, low=1)
    check_int("rank", rank, low=0, high=world - 1)
    dim = check_int("dim", dim, low=-x.dim(), high=x.dim() - 1) % x.dim()
    n = parts_per_rank * world
    if x.shape[dim] % n:
        raise ValueError(f"x has {x.shape[dim]} tokens along dim {dim}, which must be a multiple of "
                         f"{n} ({parts_per_rank} chunk{'s' if parts_per_rank > 1 else ''} per rank x world {world})")
    return dim


def zigzag_split(x: torch.Tensor, rank: int, world: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s slice of the full tensor `x` in the zig-zag layout: x cut along `dim` into 2·world
    equal chunks, of which the rank holds chunk `rank` followed by chunk 2·world-1-rank.

    x: any tensor, e.g. [B, T, H, D] with dim=1; T must be a multiple of 2·world. Returns a new
    contiguous tensor of T / world tokens along `dim` (same dtype and device as x).

    >>> q_local = zigzag_split(q, rank, world)            # q: [B, T, H, D] -> [B, T/world, H, D]
    """
    dim = _check_split_args(x, rank, world, dim, 2)
    chunks = x.chunk(2 * world, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=dim).contiguous()


def zigzag_unsplit(slices, dim: int = 1) -> torch.Tensor:
    """The inverse of `zigzag_split`: the full tensor from the list of every rank's slice, in rank order.

    slices: a list of W tensors of equal shape, each with an even size along `dim`.

    >>> full = zigzag_unsplit([zigzag_split(x, r, 4) for r in range(4)])   # equals x
    """
    if not isinstance(slices, (list, tuple)) or not slices:
        raise TypeError("slices must be a non-empty list of tensors, one per rank")
    world = len(slices)
    for i, s in enumerate(slices):
        check_tensor(f"slices[{i}]", s, ndim=slices[0].dim(), dtypes=(slices[0].dtype,), shape=tuple(slices[0].shape))
    dim = check_int("dim", dim, low=-slices[0].dim(), high=slices[0].dim() - 1) % slices[0].dim()
    if slices[0].shape[dim] % 2:
        raise ValueError(f"each slice must hold two equal chunks along dim {dim}, got {slices[0].shape[dim]} tokens")
    halves = [s.chunk(2, dim=dim) for s in slices]
    chunks = [halves[r][0] for r in range(world)] + [halves[r][1] for r in reversed(range(world))]
    return torch.cat(chunks, dim=dim)


def contiguous_split(x: torch.Tensor, rank: int, world: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s slice in the contiguous layout (tokens [rank·T/world, (rank+1)·T/world)), the layout
    `ring_flash_attn_func` expects when causal=False. T must be a multiple of world."""
    dim = _check_split_args(x, rank, world, dim, 1)
    return x.chunk(world, dim=dim)[rank].contiguous()


def contiguous_unsplit(slices, dim: int = 1) -> torch.Tensor:
    """The inverse of `contiguous_split`: concatenate the ranks' slices in rank order."""
    if not isinstance(slices, (list, tuple)) or not slices:
        raise TypeError("slices must be a non-empty list of tensors, one per rank")
    return torch.cat(list(slices), dim=dim)


def gather_sequence(local: torch.Tensor, causal: bool, group=None, dim: int = 1) -> torch.Tensor:
    """All-gather every rank's slice and put the sequence back in order: the zig-zag layout when
    causal, the contiguous one otherwise. Every rank of `group` (default: the world) gets the full
    tensor. A collective: every rank must call it.

    >>> o_full = gather_sequence(o_local, causal=True)    # [B, T/world, H, D] -> [B, T, H, D]
    """
    import torch.distributed as dist

    local = local.contiguous()
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local, group=group)
    return zigzag_unsplit(parts, dim) if causal else contiguous_unsplit(parts, dim)


# ---------------------------------------------------------------------------------- the schedule
@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """What rank `rank` computes at ring step `step`: its queries against the K/V slice of rank `src`.

    queries: "all" (both local chunks) or "back" (the second local chunk only).
    keys: "all" (both chunks of src's slice) or "front" (src's first chunk only).
    causal: whether the block needs the causal mask (only the diagonal block, at step 0).
    """
    rank: int
    step: int
    src: int
    queries: str
    keys: str
    causal: bool


def ring_plan(rank: int, step: int, world: int, causal: bool) -> BlockPlan:
    """The block rank `rank` computes at step `step` (0 <= step < world) of the ring.

    At step s the rank holds the K/V slice of rank src = (rank - s) mod world: the slices travel
    one rank forward per step, so after world - 1 steps every rank has seen every slice.

    Non-causal (contiguous layout): every query sees every key, so each step is a full block.

    Causal (zig-zag layout): rank r holds query chunks r and 2W-1-r; the K/V slice of rank s holds
    key chunks s and 2W-1-s. Query chunk i sees key chunk j fully when j < i, causally when j = i,
    not at all when j > i. Three cases follow, and each costs the same (half a full block) except
    the diagonal:
      * src = rank (step 0): the local block [r, 2W-1-r] x [r, 2W-1-r]. Chunk r sees chunk r causally
        and not 2W-1-r; chunk 2W-1-r sees chunk r fully and itself causally. That is exactly the
        ordinary causal mask on the concatenated 2c x 2c block, so one causal call does it.
      * src < rank: key chunk src precedes both query chunks (src < r < 2W-1-r), and key chunk
        2W-1-src follows both (2W-1-src > 2W-1-r > r). So all the local queries see the first half
        of src's keys fully and the second half not at all: queries "all", keys "front".
      * src > rank: query chunk r precedes both key chunks (r < src and r < W <= 2W-1-src), so it sees
        nothing; query chunk 2W-1-r follows both (2W-1-r >= W > src and 2W-1-r > 2W-1-src), so it sees
        all of them: queries "back", keys "all".
    """
    src = (rank - step) % world
    if not causal:
        return BlockPlan(rank, step, src, "all", "all", False)
    if step == 0:
        return BlockPlan(rank, step, src, "all", "all", True)
    if src < rank:
        return BlockPlan(rank, step, src, "all", "front", False)
    return BlockPlan(rank, step, src, "back", "all", False)


def chunk_pairs(plan: BlockPlan, world: int) -> list[tuple[int, int, str]]:
    """The (query chunk, key chunk, kind) pairs of the global 2W x 2W chunk grid that a causal plan
    covers, kind "full" or "diagonal"; pairs the plan touches but the mask hides are left out. For
    the figure and the tests: every visible pair must be covered exactly once across ranks and steps."""
    q_chunks = [plan.rank, 2 * world - 1 - plan.rank]
    k_chunks = [plan.src, 2 * world - 1 - plan.src]
    qs = q_chunks if plan.queries == "all" else q_chunks[1:]
    ks = k_chunks if plan.keys == "all" else k_chunks[:1]
    pairs = []
    for i in qs:
        for j in ks:
            if j < i:
                pairs.append((i, j, "full"))
            elif j == i:
                pairs.append((i, j, "diagonal"))
    return pairs


__all__ = ["zigzag_split", "zigzag_unsplit", "contiguous_split", "contiguous_unsplit", "gather_sequence",
           "BlockPlan", "ring_plan", "chunk_pairs"]
