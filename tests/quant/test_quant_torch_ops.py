"""The quantisation operators as torch.library ops: every operator has its forms (CPU tier); opcheck of each form
and torch.compile of a quantise / dequantise chain against eager (device tier: an accelerator, or the Ascend
kernels on the emulator). The shapes are those of the level-0 values tests, so no kernel compiles for these alone.
"""

from __future__ import annotations

import pytest
import torch

from cann_ops_tilelang import quant
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS
from tests.quant.cast_ref import scaled_rows


def _op(name: str):
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def test_every_quant_operator_has_its_forms():
    functions = [name for name in quant.__all__ if hasattr(getattr(quant, name), 'operator')]
    # a type, a torch helper, and a call over a list of weights (no form can carry a list of tensors)
    unformed = {'QuantTensor', 'unpack_from_e2m1fn_x2', 'batched_transpose_weight_sf'}
    assert set(quant.__all__) - set(functions) == unformed
    for name in functions:
        assert getattr(quant, name).operator is OPERATORS[name]
        has_out = OPERATORS[name].out_index is not None  # per_token_cast's keyword-only seed follows its out
        assert sorted(OPERATORS[name].forms) == [name, f'{name}_out'][: 1 + has_out]
        assert _op(name)._schema.name == f'{NAMESPACE}::{name}'
    # A quantised input is two tensors of the forms; a tuple of buffers one written tensor each.
    assert str(_op('cast_back')._schema).startswith('cann_ops_tilelang::cast_back(Tensor x_data, Tensor x_sf, ')
    written = [a.name for a in _op('per_block_cast_out')._schema.arguments if a.alias_info and a.alias_info.is_write]
    assert written == ['out_data', 'out_sf']


def _form_args(name: str, device) -> tuple:
    """The arguments of form `name`, as the op takes them (flattened)."""
    x = scaled_rows(37, 1152, 'bfloat16', device)
    token = quant.per_token_cast(x, 'e4m3', 128)
    cm_x = scaled_rows(37, 1088, 'bfloat16', device) if name.endswith('_col_major') else None
    cases = {
        'per_token_cast': (x, 'e4m3', 128, None, False, False, False, False, False, None),
        # column-major UE8M0 scales (strides (1, T_pad)), test_per_token_cast.py's level-0 configuration
        'per_token_cast_col_major': (cm_x, 'e4m3', 64, None, True, True, True, False, False, None),
        'per_block_cast': (x, 'e4m3', [128, 128], False, False, False, False),
        # column-major UE8M0 scales of 2 token blocks, test_per_block_cast.py's level-0 configuration
        'per_block_cast_col_major': (cm_x, 'e4m3', [32, 32], True, True, True, False),
        'per_channel_cast': (scaled_rows(37, 320, 'bfloat16', device), None, 'e4m3', 128, False, None, False),
        'cast_back': (*token, 'bf16', [1, 128], None),
        # those column-major scales read back (test_cast_back.py's level-0 configuration)
        'cast_back_col_major': (
            *(() if cm_x is None else quant.per_token_cast(cm_x, 'e4m3', 64, None, True, True, True)),
            'bf16',
            [1, 64],
            None,
        ),
        # per_block_cast's column-major UE8M0 scales of token blocks read back (test_cast_back.py's level 0)
        'cast_back_blocks_col_major': (
            *(() if cm_x is None else quant.per_block_cast(cm_x, 'e4m3', [32, 32], True, True, True)),
            'bf16',
            [32, 32],
            None,
        ),
        'per_token_cast_back': (*token, 'bf16', 128, None),
    }
    return cases[name]


@pytest.mark.npu
@pytest.mark.parametrize(
    'name',
    [
        'per_token_cast',
        'per_token_cast_col_major',
        'per_block_cast',
        'per_block_cast_col_major',
        'per_channel_cast',
        'cast_back',
        'cast_back_col_major',
        'cast_back_blocks_col_major',
    ],
)
def test_opcheck(device, name):
    """torch.library.opcheck of the functional form: schema, autograd registration, the fake kernel against the
    real one (strides included: per_token_cast's and per_block_cast's column-major scales, both read by cast_back),
    AOTAutograd with
    dynamic shapes against eager."""
    utils = ['test_schema', 'test_autograd_registration', 'test_faketensor', 'test_aot_dispatch_dynamic']
    if name.startswith('cast_back'):
        # Its mutation check compares the fp8 input by allclose, which torch implements for fp8 on no device.
        utils.remove('test_schema')
    op = name.removesuffix('_col_major').removesuffix('_blocks')
    torch.library.opcheck(_op(op), _form_args(name, device), test_utils=utils)


def _round_trip(x):
    data, sf = quant.per_token_cast(x, 'e4m3', 128)
    return quant.cast_back((data, sf), 'bf16', (1, 128)), sf


@pytest.mark.npu
def test_compile_matches_eager(device):
    """torch.compile(fullgraph=True) of a quantise / dequantise chain gives the eager bytes."""
    torch._dynamo.reset()
    x = scaled_rows(37, 1152, 'bfloat16', device)
    want = _round_trip(x)
    got = torch.compile(_round_trip, fullgraph=True, backend='aot_eager')(x)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))
