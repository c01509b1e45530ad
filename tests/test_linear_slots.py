"""The serving step of GLA, Lightning and KDA (attention_kernels/linear/slots.py): a pool of states read at each batch
row's slot (ssm_state_indices) and the final state written back in place (inplace_final_state), as fla's
fused_recurrent_kda_fwd takes them.

Each serving call is checked against the plain out-of-place call on the gathered states, which the family's
own tests check against the reference written from the formula: the same kernel on the same numbers, so the
outputs and the written rows must agree bitwise, and every row the call does not name must be untouched.
CPU interpreter, fp32; K and V not powers of two.
"""
from __future__ import annotations

import pytest
import torch

from attention_kernels.common import DEVICE
from attention_kernels.gla import fused_recurrent_gla
from attention_kernels.gla import interface as gla_interface
from attention_kernels.kda import fused_recurrent_kda
from attention_kernels.kda import interface as kda_interface
from attention_kernels.lightning import fused_recurrent_lightning
from attention_kernels.lightning import interface as lightning_interface

H, K, V, SLOTS = 2, 20, 24, 6


class _Gen:
    """One seeded generator per input set, so that each family's gates are drawn the same way."""
    def get(self):
        return self.g

    def reset(self, seed):
        self.g = torch.Generator(device=DEVICE).manual_seed(seed)


_GEN = _Gen()


def _inputs(B, T, seed=0):
    _GEN.reset(seed)
    g = _GEN.get()
    q = torch.randn(B, T, H, K, device=DEVICE, generator=g)
    k = torch.randn(B, T, H, K, device=DEVICE, generator=g)
    v = torch.randn(B, T, H, V, device=DEVICE, generator=g)
    return q, k, v


def _call(family, q, k, v):
    """The family's public function on (q, k, v) with its gates drawn once: call(**options) -> (o, final)."""
    g = _GEN.get()
    if family == "gla":
        gk = torch.nn.functional.logsigmoid(torch.randn(q.shape, device=DEVICE, generator=g))
        return lambda **kw: fused_recurrent_gla(q, k, v, gk, **kw)
    if family == "lightning":
        slopes = torch.rand(H, device=DEVICE, generator=g)
        return lambda **kw: fused_recurrent_lightning(q, k, v, slopes, **kw)
    gate = torch.nn.functional.logsigmoid(torch.randn(q.shape, device=DEVICE, generator=g))
    beta = torch.rand(q.shape[:3], device=DEVICE, generator=g)
    return lambda **kw: fused_recurrent_kda(q, k, v, gate, beta, use_qk_l2norm_in_kernel=True, **kw)


def _pool(seed=1):
    return torch.randn(SLOTS, H, K, V, device=DEVICE, generator=torch.Generator(device=DEVICE).manual_seed(seed))


FAMILIES = ["gla", "lightning", "kda"]


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_fused_recurrent_slots_read_their_rows(family, T):
    """ssm_state_indices without in place: the rows named are read, the pool is left bitwise as it was, and
    a slot read by two rows is allowed."""
    slots = torch.tensor([4, 0, 4], device=DEVICE)
    call = _call(family, *_inputs(3, T))
    pool = _pool()
    before = pool.clone()
    o_ref, ht_ref = call(initial_state=pool[slots].clone(), output_final_state=True)
    o, ht = call(initial_state=pool, output_final_state=True, ssm_state_indices=slots)
    assert torch.equal(o, o_ref) and torch.equal(ht, ht_ref)
    assert torch.equal(pool, before)
    o, ht = call(initial_state=pool, ssm_state_indices=slots.to(torch.int32))
    assert torch.equal(o, o_ref) and ht is None


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_fused_recurrent_inplace_equals_out_of_place(family, T):
    """inplace_final_state without slots: o as the out-of-place call's, the final state written into
    initial_state itself (returned as the final state), bitwise."""
    call = _call(family, *_inputs(2, T))
    h0 = _pool()[:2].clone()
    o_ref, ht_ref = call(initial_state=h0.clone(), output_final_state=True)
    o, ht = call(initial_state=h0, inplace_final_state=True)
    assert ht is h0
    assert torch.equal(o, o_ref) and torch.equal(h0, ht_ref)


@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_fused_recurrent_inplace_slots_write_only_their_rows(family, T):
    """Both options: each named slot ends in its row's final state, every other slot is untouched bitwise,
    and the call on the pool (read and written, the same memory) equals the out-of-place one."""
    slots = torch.tensor([5, 1, 2], device=DEVICE)
    call = _call(family, *_inputs(3, T))
    pool = _pool()
    before = pool.clone()
    o_ref, ht_ref = call(initial_state=before[slots].clone(), output_final_state=True)
    o, ht = call(initial_state=pool, inplace_final_state=True, ssm_state_indices=slots, output_final_state=True)
    assert ht is pool and torch.equal(o, o_ref)
    assert torch.equal(pool[slots], ht_ref)
    others = [i for i in range(SLOTS) if i not in slots.tolist()]
    assert torch.equal(pool[others], before[others])
    # a second step continues from the written slots
    o2_ref, _ = call(initial_state=ht_ref.clone(), output_final_state=True)
    o2, _ = call(initial_state=pool, inplace_final_state=True, ssm_state_indices=slots)
    assert torch.equal(o2, o2_ref)


def test_fused_recurrent_inplace_writes_through_a_view():
    """The pool may be a contiguous view of a larger buffer: the write lands in the buffer."""
    call = _call("gla", *_inputs(2, 1))
    buffer = _pool()
    before = buffer.clone()
    view = buffer[2:5]
    _, ht_ref = call(initial_state=view[[2, 0]].clone(), output_final_state=True)
    call(initial_state=view, inplace_final_state=True, ssm_state_indices=torch.tensor([2, 0], device=DEVICE))
    assert torch.equal(buffer[4], ht_ref[0]) and torch.equal(buffer[2], ht_ref[1])
    assert torch.equal(buffer[[0, 1, 3, 5]], before[[0, 1, 3, 5]])


def _refusals(pool, slots):
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)
    return [
        ({"initial_state": pool, "inplace_final_state": True, "ssm_state_indices": torch.tensor([1, 1], device=DEVICE)},
         ValueError, "more than once"),
        ({"initial_state": pool, "ssm_state_indices": torch.tensor([0, SLOTS], device=DEVICE)}, ValueError,
         "must lie in"),
        ({"initial_state": pool, "ssm_state_indices": torch.tensor([-1, 0], device=DEVICE)}, ValueError, "must lie in"),
        ({"initial_state": pool, "ssm_state_indices": slots.float()}, TypeError, "ssm_state_indices"),
        ({"initial_state": pool, "ssm_state_indices": slots[:1]}, ValueError, "ssm_state_indices"),
        ({"initial_state": pool, "ssm_state_indices": slots[None]}, ValueError, "ssm_state_indices"),
        ({"ssm_state_indices": slots}, ValueError, "needs initial_state"),
        ({"inplace_final_state": True}, ValueError, "needs initial_state"),
        ({"initial_state": pool[:2], "inplace_final_state": "yes"}, TypeError, "inplace_final_state"),
        ({"initial_state": pool[:2].transpose(-1, -2).contiguous().transpose(-1, -2), "inplace_final_state": True},
         ValueError, "contiguous"),
        ({"initial_state": pool[:, :1], "ssm_state_indices": slots}, ValueError, "initial_state"),
        ({"initial_state": pool[:2], "inplace_final_state": True, "cu_seqlens": cu}, ValueError, "cu_seqlens"),
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_recurrent_slots_refuse(family):
    slots = torch.tensor([3, 0], device=DEVICE)
    call = _call(family, *_inputs(2, 1))
    pool = _pool()
    before = pool.clone()
    for kwargs, error, match in _refusals(pool, slots):
        with pytest.raises(error, match=match):
            call(**kwargs)
    assert torch.equal(pool, before)
    if family != "lightning":   # Lightning has no state_v_first
        with pytest.raises(ValueError, match="state_v_first"):
            call(initial_state=pool, inplace_final_state=True, ssm_state_indices=slots, state_v_first=True)


OUT_OF_PLACE_OPS = {"gla": gla_interface._fused_recurrent_gla, "lightning": lightning_interface._fused_recurrent_lightning,
                    "kda": kda_interface._fused_recurrent_kda}
INPLACE_OPS = {"gla": gla_interface._fused_recurrent_gla_inplace,
               "lightning": lightning_interface._fused_recurrent_lightning_inplace,
               "kda": kda_interface._fused_recurrent_kda_inplace}


@pytest.mark.parametrize("family", FAMILIES)
def test_fused_recurrent_inplace_compiled_equals_eager(family):
    """torch.compile (aot_eager, fullgraph) through the in-place op (declared as mutating initial_state):
    the same o and the same pool as eager; opcheck passes (schema, fake tensors, mutation) for it and for the
    out-of-place op reading slots."""
    slots = torch.tensor([4, 1], device=DEVICE)
    call = _call(family, *_inputs(2, 1))
    pool_e, pool_c = _pool(), _pool()
    o_e, _ = call(initial_state=pool_e, inplace_final_state=True, ssm_state_indices=slots)
    compiled = torch.compile(lambda pool: call(initial_state=pool, inplace_final_state=True,
                                               ssm_state_indices=slots)[0], fullgraph=True, backend="aot_eager")
    o_c = compiled(pool_c)
    assert torch.equal(o_c, o_e) and torch.equal(pool_c, pool_e)
    assert not torch.equal(pool_e, _pool())
    q, k, v = _inputs(2, 1)
    gates = {"gla": (torch.nn.functional.logsigmoid(torch.randn_like(q)),),
             "lightning": (torch.rand(H, device=DEVICE),),
             "kda": (torch.nn.functional.logsigmoid(torch.randn_like(q)), torch.rand(2, 1, H, device=DEVICE))}[family]
    torch.library.opcheck(INPLACE_OPS[family].op, (q, k, v, *gates, _pool()), {"ssm_state_indices": slots})
    torch.library.opcheck(OUT_OF_PLACE_OPS[family].op, (q, k, v, *gates),
                          {"initial_state": _pool(), "output_final_state": True, "ssm_state_indices": slots})
