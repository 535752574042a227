"""Shared argument checks of the public interfaces."""

import pytest
import torch

from cann_ops_tilelang.engram._contract import check_hc_hidden
from cann_ops_tilelang.validation import (
    batch_rows,
    check_bool,
    check_last_dim_contiguous,
    check_out,
    check_positive_float,
    check_tensor,
    may_overlap,
)


def test_check_tensor_types_and_dims():
    with pytest.raises(TypeError, match='x must be a torch.Tensor, got list'):
        check_tensor('x', [1], dtype=torch.float32)
    with pytest.raises(TypeError, match='x must have dtype torch.bfloat16'):
        check_tensor('x', torch.zeros(2), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match='x must have 3 dimensions'):
        check_tensor('x', torch.zeros(2), dtype=torch.float32, ndim=3)


def test_last_dim_contiguity():
    base = torch.zeros(4, 8)
    check_last_dim_contiguous('k', base[:, :4])  # outer stride free
    with pytest.raises(ValueError, match='contiguous last dimension'):
        check_last_dim_contiguous('k', base.t())


def test_scalars():
    assert check_bool('flag', True) is True
    with pytest.raises(TypeError, match='flag must be a bool'):
        check_bool('flag', 1)
    assert check_positive_float('eps', 1) == 1.0
    for bad in (0.0, -1e-6, float('nan'), float('inf')):
        with pytest.raises(ValueError, match='eps must be a finite number > 0'):
            check_positive_float('eps', bad)
    with pytest.raises(TypeError, match='eps must be a float'):
        check_positive_float('eps', '1e-6')


def test_overlap_detection():
    buf = torch.zeros(16)
    assert may_overlap(buf[:8], buf[4:12])
    assert not may_overlap(buf[:8], buf[8:])
    assert not may_overlap(buf[::2], buf[1::2])  # interleaved, apart
    assert may_overlap(buf[::2], buf[2::4])  # interleaved, sharing every other element
    assert not may_overlap(buf, torch.zeros(16))
    matrix = torch.zeros(6, 10)
    assert not may_overlap(matrix[:, :4], matrix[:, 4:])
    assert may_overlap(matrix[:, :5], matrix[:, 4:])
    assert may_overlap(matrix[:, :4], matrix.t()[:4])  # the same columns, transposed
    assert not may_overlap(matrix[:, :4], matrix.t()[4:])
    # bytes, not elements: bf16 columns 0..3 against the fp32 view of columns 4..7
    bf16 = torch.zeros(6, 8, dtype=torch.bfloat16)
    assert not may_overlap(bf16[:, :4], bf16.view(torch.float32)[:, 2:])
    assert may_overlap(bf16[:, :5], bf16.view(torch.float32)[:, 2:])


def test_overlap_of_fused_qkv_views():
    """The query, key and value heads of one fused projection, (tokens, heads, head_dim) views of its rows."""
    tokens, head_dim, q_heads, kv_heads = 7, 64, 8, 2
    qkv = torch.zeros(tokens, (q_heads + 2 * kv_heads) * head_dim, dtype=torch.bfloat16)
    q, k, v = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))
    assert not may_overlap(q, k)
    assert not may_overlap(k, v)
    assert not may_overlap(q[..., :32], k[..., 32:])  # partial rotary parts
    assert may_overlap(q, qkv[:, q_heads * head_dim - 1 :])
    assert may_overlap(k, qkv.view(-1)[q_heads * head_dim + 5 :: 3])


def test_batch_rows():
    x = torch.zeros(2, 3, 8)
    rows = batch_rows('op', 'x', x, (2, 3))
    assert rows.shape == (6, 8)
    assert rows.data_ptr() == x.data_ptr()
    assert batch_rows('op', 'sf', torch.zeros(2, 3, 1, 4), (2, 3)).shape == (6, 1, 4)
    assert batch_rows('op', 'out', None, (2, 3)) is None
    assert batch_rows('op', 'out', [1], (2, 3)) == [1]  # the unbatched call's checks name it
    with pytest.raises(
        ValueError, match=r'op: out must have the batch and tokens of x, \(2, 3\), got shape \(3, 2, 8\)'
    ):
        batch_rows('op', 'out', torch.zeros(3, 2, 8), (2, 3))
    with pytest.raises(ValueError, match='op: rstd must have the batch and tokens of x'):
        batch_rows('op', 'rstd', torch.zeros(2, 3), (2, 3))
    with pytest.raises(ValueError, match=r'op: the batches of residual must be one batch of rows apart .* got '
                       r'strides \(8, 16, 1\) for shape \(2, 3, 8\)'):  # fmt: skip
        batch_rows('op', 'residual', torch.zeros(3, 2, 8).transpose(0, 1), (2, 3))


def _bytes_of(t: torch.Tensor) -> set[int]:
    """Every byte address of t (small tensors), the exact answer may_overlap approximates from above."""
    size, start = t.element_size(), t.data_ptr()
    offsets = {0}
    for n, stride in zip(t.shape, t.stride(), strict=True):
        offsets = {o + i * stride * size for o in offsets for i in range(n)}
    return {start + o + b for o in offsets for b in range(size)} if t.numel() else set()


def test_overlap_is_never_missed():
    """Random strided views of one buffer (repeated and zero strides, other element sizes): whenever they share a
    byte, may_overlap says so; and the period test proves most interleaved disjoint pairs apart."""
    generator = torch.Generator().manual_seed(5)
    buf = torch.zeros(512, dtype=torch.int16)

    def randint(low, high):
        return int(torch.randint(low, high, (1,), generator=generator))

    def view():
        base = buf if randint(0, 2) else buf.view(torch.int32)
        dims = randint(1, 4)
        shape = [randint(1, 5) for _ in range(dims)]
        strides = [randint(0, 9) for _ in range(dims)]
        return base.as_strided(shape, strides, randint(0, 40))

    disjoint_interleaved = proved = 0
    for _ in range(3000):
        a, b = view(), view()
        shared = bool(_bytes_of(a) & _bytes_of(b))
        if shared:
            assert may_overlap(a, b), (a.shape, a.stride(), a.storage_offset(), b.shape, b.stride(), b.storage_offset())
        elif min(_bytes_of(a)) < max(_bytes_of(b)) and min(_bytes_of(b)) < max(_bytes_of(a)):
            disjoint_interleaved += 1  # the spans meet, the bytes do not
            proved += not may_overlap(a, b)
    assert disjoint_interleaved > 100
    assert proved > disjoint_interleaved // 3, (proved, disjoint_interleaved)


def test_check_out():
    x = torch.zeros(2, 4)
    ok = torch.empty(2, 4)
    assert check_out('out', ok, shape=(2, 4), dtype=torch.float32, device=x.device, inputs={'x': x}) is ok
    with pytest.raises(ValueError, match=r'out must have shape \(2, 4\)'):
        check_out('out', torch.empty(4, 2), shape=(2, 4), dtype=torch.float32, device=x.device, inputs={})
    with pytest.raises(TypeError, match='out must have dtype'):
        check_out('out', ok.double(), shape=(2, 4), dtype=torch.float32, device=x.device, inputs={})
    with pytest.raises(ValueError, match='out must be contiguous'):
        check_out('out', torch.empty(4, 2).t(), shape=(2, 4), dtype=torch.float32, device=x.device, inputs={})
    with pytest.raises(ValueError, match='out must not alias the input x'):
        check_out('out', x, shape=(2, 4), dtype=torch.float32, device=x.device, inputs={'x': x})
    with pytest.raises(RuntimeError, match='out must be on meta'):
        check_out('out', ok, shape=(2, 4), dtype=torch.float32, device=torch.device('meta'), inputs={})


def test_check_out_of_given_strides():
    """A buffer of another layout than the contiguous one: its strides where they address anything (a dimension of
    size 1 may have any stride, an empty buffer any strides), instead of contiguity."""
    x = torch.zeros(2, 4)
    padded = torch.empty(3, 8)[:, :5].T  # (5, 3), strides (1, 8): a column-major view of a padded buffer
    args = dict(shape=(5, 3), dtype=torch.float32, device=x.device, inputs={'x': x})
    assert check_out('out', padded, strides=(1, 8), **args) is padded
    with pytest.raises(ValueError, match=r'out must have strides \(1, 8\) for shape \(5, 3\) \(the layout the call '
                       r'returns\), got \(3, 1\)'):  # fmt: skip
        check_out('out', torch.empty(5, 3), strides=(1, 8), **args)
    with pytest.raises(ValueError, match=r'got \(1, 5\)'):
        check_out('out', torch.empty(3, 5).T, strides=(1, 8), **args)
    column = dict(args, shape=(5, 1))
    assert check_out('out', torch.empty(5, 1), strides=(1, 8), **column) is not None  # (1, 1): one column
    row = dict(args, shape=(1, 3))
    assert check_out('out', torch.empty(3, 8)[:, :1].T, strides=(1, 8), **row) is not None
    assert check_out('out', torch.empty(3, 8)[:, :1].T, strides=(7, 8), **row) is not None  # one row: any stride
    with pytest.raises(ValueError, match=r'must have strides \(1, 8\) for shape \(1, 3\) .*, got \(3, 1\)'):
        check_out('out', torch.empty(1, 3), strides=(1, 8), **row)
    empty = dict(args, shape=(0, 3))
    assert check_out('out', torch.empty(0, 3), strides=(1, 0), **empty) is not None
    with pytest.raises(ValueError, match='out must not alias the input x'):
        check_out('out', x.view(-1)[:6].view(3, 2).T, strides=(1, 2), **dict(args, shape=(2, 3)))


@pytest.mark.parametrize(('hc', 'hidden'), [(1, 64), (8, 16384), (3, 192)])
def test_engram_limits_accept(hc, hidden):
    check_hc_hidden('op', hc, hidden)


@pytest.mark.parametrize(
    ('hc', 'hidden', 'message'),
    [(0, 64, 'hc'), (9, 64, 'hc'), (4, 100, 'multiple of 64'), (4, 16448, 'up to 16384'), (4, 0, 'multiple of 64')],
)
def test_engram_limits_refuse(hc, hidden, message):
    with pytest.raises(ValueError, match=message):
        check_hc_hidden('op', hc, hidden)
