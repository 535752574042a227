"""The eager fast path of mhc_expand_fwd/_bwd and mhc_pre_apply_mix_fwd/_bwd keeps the contract (device tier,
CUDA only: the fast path trusts a compiled entry that checks its arguments, which the Ascend adapters and the
emulator do not have).

After a launch has warmed an operator's fast path, every tensor argument is spoiled in turn (dtype, a shape, the
layout): the call must fail with the exception type and message of the full check.
"""

import pytest
import torch

from cann_ops_tilelang.mhc import mhc_expand_bwd, mhc_expand_fwd, mhc_pre_apply_mix_bwd, mhc_pre_apply_mix_fwd

from .expand_apply_cases import bf16, mix

NUM_TOKENS, MHC, HIDDEN = 33, 4, 256


def _args(name: str, device) -> tuple[torch.Tensor, ...]:
    streams = (NUM_TOKENS, MHC, HIDDEN)
    return {
        'mhc_expand_fwd': lambda: (bf16(NUM_TOKENS, HIDDEN, device=device), bf16(*streams, device=device)),
        'mhc_expand_bwd': lambda: (bf16(*streams, device=device), bf16(NUM_TOKENS, HIDDEN, device=device)),
        'mhc_pre_apply_mix_fwd': lambda: (
            bf16(*streams, device=device),
            mix(NUM_TOKENS, MHC, device),
            bf16(NUM_TOKENS, HIDDEN, device=device),
        ),
        'mhc_pre_apply_mix_bwd': lambda: (
            bf16(NUM_TOKENS, HIDDEN, device=device),
            bf16(*streams, device=device),
            mix(NUM_TOKENS, MHC, device),
            bf16(*streams, device=device),
        ),
    }[name]()


def _spoiled(t: torch.Tensor):
    """(what, tensor) variants of t that the contract refuses."""
    other = torch.float32 if t.dtype == torch.bfloat16 else torch.bfloat16
    yield 'dtype', t.to(other)
    yield 'tokens', t[1:].clone()
    yield 'last-dim', torch.zeros((*t.shape[:-1], t.shape[-1] + 64), dtype=t.dtype, device=t.device)
    wide = torch.zeros((*t.shape, 2), dtype=t.dtype, device=t.device)
    yield 'strided', wide[..., 0]


@pytest.mark.npu
@pytest.mark.cuda_only
@pytest.mark.parametrize('call', [mhc_expand_fwd, mhc_expand_bwd, mhc_pre_apply_mix_fwd, mhc_pre_apply_mix_bwd])
def test_fast_path_keeps_the_contract(call, device):
    op = call.operator
    args = _args(op.name, device)
    call(*args)
    call(*args)
    assert op.fast, f'{op.name}: no fast-path launcher after a full-path launch'
    for i in range(len(args)):
        for what, bad in _spoiled(args[i]):
            spoiled = (*args[:i], bad, *args[i + 1 :])
            # Whatever the full check raises, its type and message are what the fast path must give.
            with pytest.raises(Exception) as full:
                op.check(*spoiled)
            with pytest.raises(type(full.value)) as fast:
                call(*spoiled)
            assert str(fast.value) == str(full.value), (op.name, i, what)
