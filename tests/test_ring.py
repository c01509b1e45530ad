"""Ring attention (attention_kernels.ring): the zig-zag split and its schedule, the log-sum-exp merge, the ring
simulated on one process, and the real ring on 2 and 3 ranks (gloo + the Triton interpreter here, NCCL on
2 GPUs) against fp64 softmax attention on the gathered tensors, forward and backward; plus every refusal.

The multi-rank runs spawn their processes once per module (a fixture per world size) and every test reads
its case's errors from there. Tolerances as in test_flash_attn: the input dtype's, three times for gradients.
"""
import pytest
import torch

from attention_kernels.common import DEVICE, rel_err, tolerance
from attention_kernels.flash_attn import attention_ref
from attention_kernels.ring import (contiguous_split, contiguous_unsplit, merge_partials, ring_attention_simulated,
                          ring_flash_attn_func, ring_plan, zigzag_split, zigzag_unsplit)
from attention_kernels.ring.diagram import work_per_rank, zigzag_schedule
from attention_kernels.ring.launcher import GLA_CASES, SMALL_CASES, Case, check_gla_rank, ring_check, spawn
from attention_kernels.ring.linear import gla_context_parallel, scan_states
from attention_kernels.ring.reference import block_attention_ref, merge_into
from attention_kernels.ring.zigzag import chunk_pairs


def skip_without_ranks(world):
    """The spawned ranks run on GPUs (NCCL) wherever CUDA is present, one GPU each; on a machine with fewer
    GPUs than ranks the run cannot happen (two ranks may not share one GPU under NCCL), so skip there. On
    a CPU they run under gloo and the interpreter."""
    if torch.cuda.is_available() and torch.cuda.device_count() < world:
        pytest.skip(f"{world} ranks on GPUs need {world} GPUs; this machine has {torch.cuda.device_count()}")


def _tols(dtype_name):
    fwd = tolerance(getattr(torch, dtype_name), tf32_dots=True)
    return {"o": fwd, "dq": 3 * fwd, "dk": 3 * fwd, "dv": 3 * fwd}


def _assert_errors(row):
    assert not row["nan"], f"{row['case']}: NaN in the ring's output or gradients"
    assert row["same_without_grad"], f"{row['case']}: the no-grad forward differs from the autograd one"
    for name, tol in _tols(row["dtype"]).items():
        assert row[name] <= tol, f"{row['case']} {name}: relative error {row[name]:.2e} > {tol:.0e}"


# ------------------------------------------------------------------ the split and the schedule
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("dim", [1, -1])
def test_zigzag_round_trip(world, dim):
    x = torch.randn(2, 2 * world * 3, 3, 2 * world * 2)
    parts = [zigzag_split(x, r, world, dim=dim) for r in range(world)]
    assert all(p.shape[dim] == x.shape[dim] // world and p.is_contiguous() for p in parts)
    assert zigzag_unsplit(parts, dim=dim).equal(x)
    assert contiguous_unsplit([contiguous_split(x, r, world, dim=dim) for r in range(world)], dim=dim).equal(x)


def test_zigzag_split_holds_chunk_r_and_its_mirror():
    x = torch.arange(8)[None, :, None, None]
    assert zigzag_split(x, 0, 2).flatten().tolist() == [0, 1, 6, 7]
    assert zigzag_split(x, 1, 2).flatten().tolist() == [2, 3, 4, 5]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_plan_covers_every_visible_chunk_pair_once(world):
    seen = {}
    for rank in range(world):
        for step in range(world):
            for i, j, kind in chunk_pairs(ring_plan(rank, step, world, causal=True), world):
                seen[(i, j)] = seen.get((i, j), []) + [kind]
    want = {(i, j) for i in range(2 * world) for j in range(i + 1)}
    assert set(seen) == want
    assert all(kinds == ["diagonal" if i == j else "full"] for (i, j), kinds in seen.items())


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_zigzag_balances_the_work(world):
    """Every rank computes the same number of (query, key) chunk pairs (the diagonal counts half)."""
    work = [sum(1.0 if kind == "full" else 0.5 for step in range(world)
                for *_, kind in chunk_pairs(ring_plan(rank, step, world, True), world)) for rank in range(world)]
    assert len(set(work)) == 1 and work[0] == 2 * world  # (2W)² / 2 pairs in all, shared by W ranks


def test_plan_without_causal_is_full_blocks():
    assert all(ring_plan(r, s, 4, False).queries == ring_plan(r, s, 4, False).keys == "all"
               for r in range(4) for s in range(4))


# ------------------------------------------------------------------ the merge and the simulated ring
def test_merge_partials_is_exact():
    q = torch.randn(2, 9, 4, 16, dtype=torch.float64)
    k, v = torch.randn(2, 20, 2, 16, dtype=torch.float64), torch.randn(2, 20, 2, 16, dtype=torch.float64)
    o_a, lse_a = block_attention_ref(q, k[:, :7], v[:, :7])
    o_b, lse_b = block_attention_ref(q, k[:, 7:], v[:, 7:])
    o, lse = merge_partials(o_a, lse_a, o_b, lse_b)
    o_all, lse_all = block_attention_ref(q, k, v)
    assert rel_err(o, o_all) < 1e-13 and rel_err(lse, lse_all) < 1e-13
    start = torch.full_like(lse_a, float("-inf"))  # "no key yet" merges to the other partial
    assert merge_partials(torch.zeros_like(o_a), start, o_a, lse_a)[0].equal(o_a)


def test_merge_into_is_merge_partials_in_place():
    o_a, o_b = torch.randn(2, 2, 6, 3, 8).unbind(0)
    lse_a, lse_b = torch.randn(2, 2, 3, 6).unbind(0)
    want_o, want_lse = merge_partials(o_a, lse_a, o_b, lse_b)
    o, lse = o_a.clone(), lse_a.clone()
    merge_into(o[:, 2:], lse[..., 2:], o_b[:, 2:], lse_b[..., 2:])  # views: only the back rows change
    assert torch.allclose(o[:, 2:], want_o[:, 2:]) and torch.allclose(lse[..., 2:], want_lse[..., 2:])
    assert o[:, :2].equal(o_a[:, :2]) and lse[..., :2].equal(lse_a[..., :2])


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_simulated_ring_is_attention(world, causal):
    T = 2 * world * 5
    q = torch.randn(2, T, 4, 8, dtype=torch.float64)
    k, v = torch.randn(2, T, 2, 8, dtype=torch.float64), torch.randn(2, T, 2, 8, dtype=torch.float64)
    o, _ = ring_attention_simulated(q, k, v, causal=causal, world=world)
    assert rel_err(o, attention_ref(q, k, v, causal=causal)) < 1e-13


# ------------------------------------------------------------------ the ring on several ranks
WORLD3_CASES = (Case(1, 78, 2, 1, 32, causal=True, dtype="float32", seed=3),   # MQA, chunks of 13
                Case(1, 78, 4, 2, 64, causal=False, dtype="float16", seed=4))
GROUP1_CASES = (Case(1, 26, 2, 2, 32, causal=True, dtype="float32", seed=5),)


@pytest.fixture(scope="module")
def world2():
    skip_without_ranks(2)
    return {row["case"]: row for row in ring_check(2, SMALL_CASES)}


@pytest.fixture(scope="module")
def world3():
    skip_without_ranks(3)
    return {row["case"]: row for row in ring_check(3, WORLD3_CASES)}


@pytest.mark.parametrize("case", SMALL_CASES, ids=lambda c: c.name)
def test_ring_two_ranks(world2, case):
    _assert_errors(world2[case.name])


@pytest.mark.parametrize("case", WORLD3_CASES, ids=lambda c: c.name)
def test_ring_three_ranks(world3, case):
    _assert_errors(world3[case.name])


def test_ring_on_a_group_of_one_rank():
    """Two processes, the ring on a group holding rank 0 only: no exchange, one causal block."""
    skip_without_ranks(2)
    rows = ring_check(2, GROUP1_CASES, group_ranks=(0,))
    assert [r["case"] for r in rows] == [GROUP1_CASES[0].name]
    _assert_errors(rows[0])


GLA_WORLD3_CASES = (Case(1, 3 * 50, 2, 2, 32, causal=True, dtype="float32", seed=6),)


@pytest.mark.parametrize("world, cases", [(2, GLA_CASES), (3, GLA_WORLD3_CASES)], ids=["world2", "world3"])
def test_gla_state_crosses_ranks(world, cases):
    """Linear attention across ranks: each rank's zero-start chunk_gla, fixed by the scanned state."""
    skip_without_ranks(world)
    for row in spawn(check_gla_rank, world, cases)[0]:
        tol = tolerance(getattr(torch, row["dtype"]))
        assert row["o"] <= tol and row["state"] <= tol, row


def test_scan_states_is_the_recurrence():
    L = [torch.randn(1, 2, 4, 3, dtype=torch.float64) for _ in range(3)]
    d = [-torch.rand(1, 2, 4, dtype=torch.float64) for _ in range(3)]
    h0 = torch.randn(1, 2, 4, 3, dtype=torch.float64)
    entering, final = scan_states(L, d, h0)
    assert entering[0].equal(h0)
    assert torch.allclose(entering[2], d[1].exp()[..., None] * (d[0].exp()[..., None] * h0 + L[0]) + L[1])
    assert torch.allclose(final, d[2].exp()[..., None] * entering[2] + L[2])


def test_gla_context_parallel_refuses_before_communicating():
    q = torch.randn(1, 8, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="gk"):
        gla_context_parallel(q, q, q, q[:, :4])
    with pytest.raises(ValueError, match="not initialized"):
        gla_context_parallel(q, q, q, -q.abs())


def test_diagram_draws_the_plan():
    assert work_per_rank(4, "zigzag") == [8.0] * 4 and work_per_rank(4, "contiguous") == [2.0, 6.0, 10.0, 14.0]
    fig = zigzag_schedule(world=2)
    assert len(fig.axes) == 2


GPU_CASES = (Case(1, 4004, 8, 2, 128, causal=True, dtype="bfloat16"),    # chunks of 1001 tokens
             Case(2, 3002, 8, 8, 64, causal=False, dtype="float16", seed=1),
             Case(1, 1028, 4, 1, 128, causal=True, dtype="float32", seed=2),
             Case(1, 8192, 16, 4, 128, causal=True, dtype="bfloat16", seed=3))  # the fp32 reference: 4 GB of scores


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="ring attention over NCCL needs 2 GPUs")
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_gpu_ring_two_ranks_nccl(case):
    rows = ring_check(2, (case,), backend="nccl")
    _assert_errors(rows[0])


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="GLA across ranks over NCCL needs 2 GPUs")
def test_gpu_gla_state_crosses_ranks_nccl():
    cases = (Case(1, 2 * 1000, 4, 4, 128, causal=True, dtype="bfloat16"),
             Case(2, 2 * 777, 2, 2, 64, causal=True, dtype="float32", seed=1))
    for row in spawn(check_gla_rank, 2, cases, backend="nccl")[0]:
        tol = tolerance(getattr(torch, row["dtype"]))
        assert row["o"] <= tol and row["state"] <= tol, row


# ------------------------------------------------------------------ refusals (before any communication)
def _qkv(T=8, HQ=2, HKV=2, D=32, dtype=torch.float32):
    mk = lambda H: torch.randn(1, T, H, D, dtype=dtype, device=DEVICE)  # noqa: E731
    return mk(HQ), mk(HKV), mk(HKV)


BAD = {
    "q-not-a-tensor": (lambda q, k, v: (q.tolist(), k, v), {}, TypeError, "q must be a torch.Tensor"),
    "q-float64": (lambda q, k, v: (q.double(), k.double(), v.double()), {}, TypeError, "q has dtype float64"),
    "k-dtype-differs": (lambda q, k, v: (q, k.half(), v), {}, TypeError, "share one dtype"),
    "k-3-dims": (lambda q, k, v: (q, k[0], v), {}, ValueError, "k must have 4 dims"),
    "v-shape-differs": (lambda q, k, v: (q, k, v[:, :4]), {}, ValueError, "v must have shape"),
    "k-fewer-tokens": (lambda q, k, v: (q, k[:, :4], v[:, :4]), {}, ValueError, "same tokens as q"),
    "heads-not-a-multiple": (lambda q, k, v: (q, *_qkv(HQ=2, HKV=3)[1:]), {}, ValueError, "multiple of"),
    "head-dim-48": (lambda q, k, v: _qkv(D=48), {}, ValueError, "head dim D"),
    "causal-odd-length": (lambda q, k, v: _qkv(T=7), {"causal": True}, ValueError, "local length must be even"),
    "causal-not-bool": (lambda q, k, v: (q, k, v), {"causal": 1}, TypeError, "causal must be a bool"),
    "scale-negative": (lambda q, k, v: (q, k, v), {"softmax_scale": -1.0}, ValueError, "softmax_scale"),
    "group-not-a-group": (lambda q, k, v: (q, k, v), {"group": "world"}, TypeError, "group must be"),
    "slice-past-int32": (lambda q, k, v: tuple(torch.zeros(1, 1, 1, 32, device=DEVICE).expand(1, 2 ** 26, 1, 32)
                                               for _ in "qkv"), {}, ValueError, "int32"),
    "not-initialized": (lambda q, k, v: (q, k, v), {}, ValueError, "not initialized"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_refuses(name):
    make, kwargs, exc, words = BAD[name]
    with pytest.raises(exc, match=words):
        ring_flash_attn_func(*make(*_qkv()), **kwargs)


def test_refuses_bf16_under_the_interpreter():
    if torch.cuda.is_available():
        pytest.skip("bf16 is refused only under the interpreter")
    with pytest.raises(TypeError, match="bfloat16"):
        ring_flash_attn_func(*_qkv(dtype=torch.bfloat16))


@pytest.mark.parametrize("T, rank, world, exc", [(10, 0, 2, ValueError), (8, 2, 2, ValueError),
                                                  (8, 0, 0, ValueError), (8, 0.5, 2, TypeError)],
                         ids=["T10-world2", "rank-too-large", "world0", "rank-float"])
def test_split_refuses(T, rank, world, exc):
    with pytest.raises(exc):
        zigzag_split(torch.zeros(1, T, 1, 1), rank, world)


def test_unsplit_refuses():
    with pytest.raises(TypeError, match="slices"):
        zigzag_unsplit([])
    with pytest.raises(ValueError, match="slices\\[1\\]"):
        zigzag_unsplit([torch.zeros(1, 4), torch.zeros(1, 6)])
    with pytest.raises(ValueError, match="two equal chunks"):
        zigzag_unsplit([torch.zeros(1, 3), torch.zeros(1, 3)])
