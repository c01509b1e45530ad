"""What the linear families' benchmarks count and feed alike: the work and the least traffic of one
decode step and of a chunked prefill, a random fp32 state, and softmax decode over a KV cache (the
yardstick a fixed-size state is measured against). Cases hold B, H, D (K = V = D) and, for prefill
and context sweeps, T; a softmax baseline's case may hold HKV, its KV heads (H when it does not).

    >>> step_bytes = decode_bytes(vectors_per_token=4)     # q, k, v in, o out
    >>> Benchmark("x_decode_graph", cases, providers, decode_flops, step_bytes, module=__name__)

Packed sequences (`packed_cases`, `per_sequence`, `packed`, `padded`): the FlashAttention chapter's length
mix, the same sequences in one packed row or padded into a batch, and their work counted sequence by sequence.
"""
import torch

from ..flash_attn.bench import VARLEN_SEED, VARLEN_TOKENS, cu_seqlens, packed_lengths
from .chunk import CHUNK

DT = torch.bfloat16  # the benchmarks' inputs; the state is fp32


def random_state(c):
    """A random fp32 state [B, H, D, D] on the GPU."""
    return torch.randn(c["B"], c["H"], c["D"], c["D"], device="cuda")


def decode_flops(c):
    """One step: decay + rank-1 update (2·K·V) and the read-out (2·K·V), per (batch, head); K = V = D."""
    return 4 * c["B"] * c["H"] * c["D"] * c["D"]


def decode_bytes(vectors_per_token: int):
    """The least one step moves: the fp32 state read and written, plus `vectors_per_token` bf16
    vectors of D per (batch, head) (q, k, v, o, and a gate where the family has one per channel)."""
    def count(c):
        B, H, D = c["B"], c["H"], c["D"]
        return 2 * B * H * D * D * 4 + B * H * vectors_per_token * D * 2
    return count


def chunk_flops(c):
    """Matmul work of the chunk algorithm (chunk C = 64, NT = ceil(T / C)
    chunks), per (batch, head):

    per chunk, intra scores Q K^T on the causal triangle:
    C(C+1)/2 pairs x 2K = C(C+1)·K; intra (scores) V on the same triangle:
    C(C+1)·V; inter Q S (queries decayed to the chunk start): 2·C·K·V; the
    state update K^T V (keys decayed to the chunk end): 2·C·K·V.
    Total B·H·NT·(C(C+1)(K+V) + 4·C·K·V), the same count for every provider
    (SDPA's own work is different: read its ms). At K = V = 128 that is 5.3
    MFLOP per chunk and head, 82,176 FLOP a token against 1,024 bytes of four
    bf16 vectors (q, k, v, o): 80 FLOP per byte (64 with a gate per channel,
    1,280 bytes). That is below the H200's ridge of about 160 FLOP/byte (the
    measured matmul ceiling over the copy bandwidth), so the roofline is the
    memory floor (reading the inputs and writing o once); the chunk states
    are extra traffic on top.
    """
    C, K, V = CHUNK, c["D"], c["D"]
    nt = -(-c["T"] // C)
    return c["B"] * c["H"] * nt * (C * (C + 1) * (K + V) + 4 * C * K * V)


def prefill_bytes(vectors_per_token: int):
    """Each bf16 input read and o written once: B·T·H·vectors_per_token·D·2."""
    return lambda c: c["B"] * c["T"] * c["H"] * vectors_per_token * c["D"] * 2


def train_flops(c):
    """A training step's work, forward and backward: 3 · chunk_flops. The backward's matmuls are twice
    the forward's: per chunk, dA = dO V^T and dv's A^T dO on the causal triangle (C(C+1)·V each), dq's and
    dk's dA K and dA^T Q (C(C+1)·K each), and four C x K x V products (dq's dO S^T, dk's V dS'^T, dv's
    K dS', and the reverse state pass's Q^T dO), against the forward's one of each."""
    return 3 * chunk_flops(c)


def train_bytes(inputs_per_token: int):
    """The least a training step moves, in bf16: the forward reads the `inputs_per_token` vectors of D
    (q, k, v and a gate per channel where there is one) and writes o; the backward reads them again with
    dO and writes a gradient for each: (3 · inputs_per_token + 2) vectors per token, head and batch."""
    return lambda c: c["B"] * c["T"] * c["H"] * (3 * inputs_per_token + 2) * c["D"] * 2


def train_step(forward, inputs, trained):
    """A zero-argument callable for the benchmarks: one forward(*inputs) and the backward of its output (the
    first, where it returns a tuple) to the tensors `trained` (which require grad), with a fixed random
    upstream gradient: a layer's training step without the optimizer. torch.autograd.grad accumulates nothing."""
    first = lambda out: out[0] if isinstance(out, tuple) else out   # noqa: E731
    do = torch.randn_like(first(forward(*inputs)))
    return lambda: torch.autograd.grad(first(forward(*inputs)), trained, do)


def kv_heads(c):
    """The softmax baseline's KV heads: the case's "HKV" (grouped-query attention, H // HKV query heads
    sharing each KV head), else H, one per query head. A count that does not divide H is refused."""
    hkv = c.get("HKV", c["H"])
    if hkv < 1 or c["H"] % hkv:
        raise ValueError(f"HKV must divide H = {c['H']}, got HKV = {hkv}")
    return hkv


def softmax_decode_flops(c):
    """One query per query head over a T-long KV cache: 4·B·H·T·D (fewer KV heads do not change the work)."""
    return 4 * c["B"] * c["H"] * c["T"] * c["D"]


def softmax_decode_bytes(c):
    """The bf16 KV cache read once, each of its HKV heads once (`kv_heads`): 2·B·HKV·T·D values."""
    return 2 * c["B"] * kv_heads(c) * c["T"] * c["D"] * 2


def _softmax_inputs(c, T_q, requires_grad=False):
    """q [B, H, T_q, D] and k, v [B, HKV, T, D] in bf16, and whether SDPA must group the query heads."""
    B, H, T, D, hkv = c["B"], c["H"], c["T"], c["D"], kv_heads(c)
    make = lambda heads, length: torch.randn(B, heads, length, D, device="cuda", dtype=DT,   # noqa: E731
                                             requires_grad=requires_grad)
    return make(H, T_q), make(hkv, T), make(hkv, T), hkv != H


def sdpa_decode(c):
    """A provider: SDPA's flash kernel, one query per head against a T-long bf16 KV cache of HKV heads
    ([B, HKV, T, D]; `kv_heads`). With fewer KV heads than query heads SDPA's flash backend takes the
    smaller cache as it is (enable_gqa) and reads it once, as a grouped-query model's decode does."""
    from ..peers import sdpa

    attend = sdpa("flash")
    q, kc, vc, grouped = _softmax_inputs(c, 1)
    return lambda: attend(q, kc, vc, enable_gqa=grouped)


def sdpa_causal_train(c):
    """A provider: SDPA's flash kernel, forward and backward of causal softmax attention (q [B, H, T, D],
    k and v with the case's KV heads, `kv_heads`)."""
    from ..peers import sdpa

    attend = sdpa("flash")
    q, k, v, grouped = _softmax_inputs(c, c["T"], requires_grad=True)
    return train_step(lambda *x: attend(*x, causal=True, enable_gqa=grouped), (q, k, v), (q, k, v))


def sdpa_causal(c):
    """A provider: SDPA's flash kernel, causal softmax attention over the whole prompt (q [B, H, T, D],
    k and v with the case's KV heads, `kv_heads`)."""
    from ..peers import sdpa

    attend = sdpa("flash")
    q, k, v, grouped = _softmax_inputs(c, c["T"])
    return lambda: attend(q, k, v, causal=True, enable_gqa=grouped)


# ---------------------------------------------------------------- packed sequences
def packed_cases(H, D):
    """The packed tables' one case: the FlashAttention chapter's mix, VARLEN_TOKENS tokens of
    `packed_lengths` (seed VARLEN_SEED), with B its number of sequences and T its tokens in all."""
    lengths = packed_lengths(VARLEN_TOKENS, VARLEN_SEED)
    return [{"B": len(lengths), "T": VARLEN_TOKENS, "H": H, "D": D, "seed": VARLEN_SEED}]


def per_sequence(count):
    """A count of a packed case: `count` of each sequence alone (B = 1, T its length), summed over the
    sequences; the tokens a padded batch adds count nothing."""
    return lambda c: sum(count({**c, "B": 1, "T": n}) for n in packed_lengths(c["T"], c["seed"]))


def packed(factory):
    """A provider: factory(case, cu_seqlens) on the case's sequences packed one after another into one
    batch row (the case at B = 1, T its tokens in all), their int32 offsets on the GPU."""
    def provider(c):
        return factory({**c, "B": 1}, cu_seqlens(packed_lengths(c["T"], c["seed"]), "cuda"))
    return provider


def padded(factory):
    """A provider: factory(case) on the same sequences padded to the longest, one dense batch
    [N, T_max, H, D] and no offsets. Padding at each sequence's end leaves its own tokens' outputs as
    they are (the recurrence runs forward in time); the time is what the padded tokens cost, the copies
    into and out of the batch not included."""
    def provider(c):
        lengths = packed_lengths(c["T"], c["seed"])
        return factory({**c, "B": len(lengths), "T": max(lengths)})
    return provider


def offsets(cu_seqlens):
    """The keyword arguments of a packed call: {"cu_seqlens": cu_seqlens}, or none for a dense one."""
    return {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
