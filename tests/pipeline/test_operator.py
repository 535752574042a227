"""The operator mechanism: the checked launch of the fast path, and what a declaration generates (the contract's
typed errors in the mechanism's order, the fast path's checks, the public function and its torch.library forms)."""

from __future__ import annotations

import inspect
import uuid
from typing import NamedTuple

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from cann_ops_tilelang import config, operator
from tests.testing.fast_path import fast_ok_on_cpu


@pytest.fixture(autouse=True)
def _no_registration(monkeypatch):
    monkeypatch.setattr(operator, 'OPERATORS', {})  # the operators made here stay out of the package's registry


def _declared(check) -> operator.Operator:
    """An operator whose contract is `check` (no kernel: the launchers below stand in for compiled entries)."""
    declared = operator.Operator('test_op', choose_config=None, get_kernel=None)
    declared.check = check
    return declared


class _Rejecting:
    """A launcher whose entry refuses its arguments, as TileLang's generated host code does."""

    def __init__(self, error: Exception):
        self.error = error
        self.calls = 0

    def launch(self, *args):
        self.calls += 1
        raise self.error


def test_a_rejected_fast_launch_gets_the_contracts_typed_error():
    entry_error = RuntimeError('kernel k input x dtype mismatch, expected bfloat16')

    def explain(name, dtype):
        raise TypeError(f'{name} must have dtype torch.bfloat16, got {dtype}')

    launcher = _Rejecting(entry_error)
    with pytest.raises(TypeError, match='x must have dtype torch.bfloat16, got torch.float32') as info:
        _declared(explain).launch(launcher, (1, 2), ('x', 'torch.float32'))
    assert info.value.__context__ is None, 'the typed error does not chain the entry error'
    assert launcher.calls == 1


def test_a_rejection_the_contract_does_not_explain_keeps_the_entrys_error():
    entry_error = RuntimeError('CUDA error: out of memory')
    with pytest.raises(RuntimeError, match='out of memory') as info:
        _declared(lambda: None).launch(_Rejecting(entry_error), (), ())
    assert info.value is entry_error


def test_an_accepted_launch_runs_no_explanation():
    launched = []

    class Accepting:
        def launch(self, *args):
            launched.append(args)

    _declared(lambda: pytest.fail('explained an accepted launch')).launch(Accepting(), (1, 2), ())
    assert launched == [(1, 2)]


def test_an_empty_input_launches_nothing_and_the_fast_path_gets_the_full_checks():
    """A grid of no blocks is a launch error: a fast path remembered from an earlier call must not launch an
    empty input; the checks its launch would have made run instead."""
    checked = []
    declared = _declared(lambda *args: checked.append(args))
    launcher = _Rejecting(RuntimeError('grid dimension must be positive'))
    declared.finish(launcher, True, 'key', ('launch',), ('x',), empty=True)
    assert (launcher.calls, checked) == (0, [('x',)])
    declared.finish(launcher, False, 'key', ('launch',), ('x',), empty=True)
    assert (launcher.calls, checked, declared.fast) == (0, [('x',)], {})


# ---------------------------------------------------------------- what a declaration generates


def _limits(name, T, n):  # the declaration's shape symbols
    if n > 4:
        raise ValueError(f'{name}: n must be at most 4, got {n}')


def _toy(*extra_args, name='toy', **hooks) -> operator.Operator:
    """y (T, n) fp32 updated in place from x (T, n + 1) bf16 and w (n,) fp32, eps > 0, an optional (T,) mask."""
    return operator.Operator(
        name,
        operator.tensor('x', torch.bfloat16, 'T, n + 1', layout='rows'),
        operator.tensor('w', torch.float32, 'n', aligned=True),
        operator.tensor('y', torch.float32, 'T, n', written='updated'),
        operator.scalar('eps', 'positive'),
        operator.tensor('mask', torch.bool, 'T', optional=True),
        *extra_args,
        limits=_limits,
        choose_config=None,
        get_kernel=None,
        **hooks,
    )


def _toy_args(T=3, n=2):
    return [torch.zeros(T, n + 1, dtype=torch.bfloat16), torch.zeros(n), torch.zeros(T, n), 1e-6, None]


@pytest.mark.parametrize(
    ('position', 'value', 'error', 'match'),
    [
        (0, [1.0], TypeError, 'x must be a torch.Tensor, got list'),
        (1, torch.zeros(2, dtype=torch.float64), TypeError, 'w must have dtype torch.float32, got torch.float64'),
        (2, torch.zeros(3, 2, 1), ValueError, r'y must have 2 dimensions, got shape \(3, 2, 1\)'),
        (1, torch.zeros(5), ValueError, 'toy: n must be at most 4, got 5'),  # limits, on n bound from w
        (2, torch.zeros(3, 3), ValueError, r'y must have shape \(3, 2\), got \(3, 3\)'),
        (0, torch.zeros(3, 4, dtype=torch.bfloat16), ValueError, r'x must have shape \(3, 3\), got \(3, 4\)'),
        (2, torch.zeros(2, 3).t(), ValueError, 'y must be contiguous'),
        (0, torch.zeros(3, 6, dtype=torch.bfloat16)[:, ::2], ValueError, 'x must have a contiguous last dimension'),
        (1, torch.zeros(3)[1:], ValueError, 'w must start at a 16-byte aligned address'),
        (3, 0.0, ValueError, 'eps must be a finite number > 0, got 0.0'),
        (3, '1', TypeError, 'eps must be a float, got str'),
        (4, torch.zeros(3, dtype=torch.int8), TypeError, 'mask must have dtype torch.bool'),
        (4, torch.zeros(4, dtype=torch.bool), ValueError, r'mask must have shape \(3,\), got \(4,\)'),
    ],
)
def test_the_generated_check_raises_the_typed_error_naming_the_argument(position, value, error, match):
    args = _toy_args()
    args[position] = value
    with pytest.raises(error, match=match):
        _toy().check(*args)


def test_the_generated_check_keeps_written_tensors_apart_and_ends_with_the_device():
    declared = _toy()
    x, w, y, eps, _ = _toy_args()
    with pytest.raises(ValueError, match=r'toy: y \(updated in place\) must not alias the input w'):
        declared.check(x, y[0], y, eps, None)
    with pytest.raises(ValueError, match=r'y \(updated in place\) must not alias the input mask'):
        declared.check(x, w, y, eps, y.view(-1).view(torch.bool)[:3])
    # Fake tensors while torch traces (memory=False): alignment and overlap wait for the real tensors (the check
    # gets as far as the device).
    with pytest.raises(RuntimeError, match='no kernels'):
        declared.check(x, y.view(-1)[1:3], y, 1, None, memory=False)  # w misaligned, inside y
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        declared.check(x, w, y, 1, torch.zeros(3, dtype=torch.bool))


def test_hooks_take_the_names_they_ask_for():
    seen = {}
    declared = _toy(extra=lambda name, y, T, memory: seen.update(name=name, y=y, T=T, memory=memory))
    args = _toy_args(T=5)
    with pytest.raises(RuntimeError, match='no kernels'):
        declared.check(*args)
    assert seen == {'name': 'toy', 'y': args[2], 'T': 5, 'memory': True}
    with pytest.raises(ValueError, match=r"toy2: extra takes 'z', which is not one of"):
        _toy(name='toy2', extra=lambda z: None)
    with pytest.raises(ValueError, match=r"toy3: choice takes 'T'"):  # choice takes arguments, backend, device
        _toy(name='toy3', choice=lambda T: {})


def test_the_fast_path_checks_refuse_what_the_entry_cannot_check():
    declared = _toy()
    assert declared.fast_ok(*_toy_args()[:4], None) is None  # CPU tensors: no compiled entry to trust
    for clause in ('type(x) in _PLAIN', 'x.is_cuda', 'x.dim() == 2', '0.0 < eps < _INF', '(mask is None or'):
        assert clause in declared.source
    assert 'w_at) % 16' in declared.source  # alignment; y apart from x and w:
    assert '(y_at < x_end and x_at < y_end)' in declared.source
    assert 'y_end = y_at + 4 * (T) * (n)' not in declared.source  # x's dims are not all symbols: y.nbytes
    assert 'y_end = y_at + y.nbytes' in declared.source
    # Where the first tensor's dims are all symbols, the bytes come from the declared shapes (no property call).
    sized = operator.Operator(
        'sized',
        operator.tensor('a', torch.bfloat16, 'T, n'),
        operator.tensor('b', torch.float32, 'n', written='written'),
        choose_config=None,
        get_kernel=None,
    )
    assert 'a_end = a_at + 2 * (T) * (n)' in sized.source
    assert 'b_end = b_at + 4 * (n)' in sized.source


def test_public_function_forms_and_config(monkeypatch):
    """@OP.public keeps the stub's signature and docstring, calls the eager path positionally, registers the forms
    from the declaration (written tensors and out= in the schemas) and answers config() through plan."""
    name = f'toy_{uuid.uuid4().hex[:8]}'
    calls = []
    declared = operator.Operator(
        name,
        operator.tensor('x', torch.float32, 'n'),
        operator.tensor('y', torch.float32, 'n', written='written'),
        operator.scalar('scale', 'float'),
        operator.out('out', like='x'),
        choice=lambda x, backend: {'n': x.shape[0], 'backend_seen': backend},
        choose_config=lambda **choice: choice,
        get_kernel=None,
    )

    def eager(x, y, scale, out):
        calls.append((x, y, scale, out))
        return x if out is None else out

    @declared.public(eager, returns='Tensor', fake=lambda x, y, scale, out: torch.empty_like(x))
    def toy(x: torch.Tensor, y: torch.Tensor, scale: float = 2.0, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """Toy docstring."""

    assert toy.__doc__ == 'Toy docstring.'
    assert toy.operator is declared
    stub_signature = (
        "(x: 'torch.Tensor', y: 'torch.Tensor', scale: 'float' = 2.0, *, out: 'torch.Tensor | None' = None)"
    )
    assert str(inspect.signature(toy)) == f"{stub_signature} -> 'torch.Tensor'"
    x, y = torch.zeros(4), torch.zeros(4)
    assert toy(x, y) is x
    assert calls == [(x, y, 2.0, None)]
    schemas = {form: str(overload._schema) for form, overload in declared.forms.items()}
    assert schemas == {
        name: f'cann_ops_tilelang::{name}(Tensor x, Tensor(a!) y, float scale) -> Tensor',
        f'{name}_out': f'cann_ops_tilelang::{name}_out(Tensor x, Tensor(a!) y, float scale, Tensor(b!) out) -> ()',
    }
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: 7)
    assert toy.operator.config(x, y, 3) == {'backend': 'cuda', 'num_cores': 7, 'n': 4, 'backend_seen': 'cuda'}
    with pytest.raises(ValueError, match='the declared arguments'):
        declared.public(eager)(lambda x, y, out=None: None)


def test_a_keyword_only_scalar_may_follow_out(monkeypatch):
    """A scalar after the out argument (per_token_cast's keyword-only seed): the forms take it before the buffers,
    the eager path gets every argument in the declared order (out at its place), a quantised first argument is
    routed with it by keyword; a tensor after out is refused."""
    name = f'toy_{uuid.uuid4().hex[:8]}'
    declared = operator.Operator(
        name, operator.tensor('x', torch.float32, 'n'), operator.out('out', like='x'),
        operator.scalar('seed', 'int', optional=True), choose_config=None, get_kernel=None,
    )  # fmt: skip
    calls, routed = [], []

    def eager(x, out, seed):
        calls.append((out is None, seed))
        return torch.empty_like(x) if out is None else out

    def quantised(x, out=None, *, seed=None):
        routed.append(seed)
        return x[0]

    def fake(x, out, seed):
        assert (out, seed) == (None, 7)
        return torch.empty_like(x)

    @declared.public(eager, returns='Tensor', fake=fake, quantised=quantised)
    def toy(x: torch.Tensor, out: torch.Tensor | None = None, *, seed: int | None = None) -> torch.Tensor:
        """Toy docstring."""

    assert declared.out_index == 1
    schemas = [str(overload._schema) for overload in declared.forms.values()]
    assert schemas == [
        f'cann_ops_tilelang::{name}(Tensor x, int? seed) -> Tensor',
        f'cann_ops_tilelang::{name}_out(Tensor x, int? seed, Tensor(a!) out) -> ()',
    ]
    x, buffer = torch.zeros(4), torch.zeros(4)
    toy(x, seed=3)
    assert toy(x, buffer, seed=4) is buffer
    declared.forms[name](x, 5)
    declared.forms[f'{name}_out'](x, 6, buffer)
    assert calls == [(True, 3), (False, 4), (True, 5), (False, 6)]
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    with FakeTensorMode():
        made = toy(torch.empty(4), seed=7)  # traced: the functional form, its fake with out at its place
        assert (made.shape, made.dtype) == ((4,), torch.float32)
    assert toy((x, x), seed=8) is x
    assert routed == [8]
    with pytest.raises(ValueError, match='one out argument at most, after every tensor'):
        operator.Operator(
            f'{name}_bad', operator.tensor('x', torch.float32, 'n'), operator.out('out', like='x'),
            operator.tensor('y', torch.float32, 'n'), choose_config=None, get_kernel=None,
        )  # fmt: skip


def test_public_function_hands_a_batched_first_tensor_to_batched():
    """With `batched`, a first tensor of one dimension more than declared goes to it, with the public function to
    call on its rows; other ranks and other types go on as before (the checks name them)."""
    name = f'toy_{uuid.uuid4().hex[:8]}'
    declared = operator.Operator(
        name, operator.tensor('x', torch.float32, 'T, n'), operator.scalar('scale', 'float'), choose_config=None,
        get_kernel=None,
    )  # fmt: skip
    seen, eager_seen = [], []

    def batched(function, x, scale):
        seen.append(tuple(x.shape))
        return function(x.view(-1, x.shape[-1]), scale).view(x.shape)

    def eager(x, scale):
        eager_seen.append(tuple(x.shape) if isinstance(x, torch.Tensor) else type(x))
        return x

    @declared.public(eager, returns='Tensor', batched=batched)
    def toy(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        """Toy docstring."""

    rows = torch.ones(3, 4)
    assert toy(rows) is rows
    assert toy(rows.view(1, 3, 4), 3.0).shape == (1, 3, 4)
    assert seen == [(1, 3, 4)]
    toy([[1.0]])
    toy(torch.ones(1, 1, 3, 4))
    assert eager_seen == [(3, 4), (3, 4), list, (1, 1, 3, 4)]  # the eager path's checks refuse the last two
    with pytest.raises(ValueError, match='batched needs the first argument declared with its dims'):
        operator.Operator(f'{name}_any', operator.tensor('x', torch.float32), choose_config=None,
                          get_kernel=None).public(lambda x: x, batched=batched)(lambda x: None)  # fmt: skip


def test_public_function_hands_a_quantised_first_argument_to_quantised():
    """With `quantised`, a tuple first argument (data, sf) goes to it with every argument; tensors, other types
    and tensor subclasses go on as before. An operator's `label` names it in its errors."""
    name = f'toy_{uuid.uuid4().hex[:8]}'
    declared = operator.Operator(
        name, operator.tensor('x', torch.float32, 'T, n'), operator.scalar('scale', 'float'), choose_config=None,
        get_kernel=None,
    )  # fmt: skip
    routed, eager_seen = [], []

    def quantised(x, scale):
        routed.append((type(x), scale))
        return x[0]

    def eager(x, scale):
        eager_seen.append(type(x))
        return x

    @declared.public(eager, returns='Tensor', quantised=quantised)
    def toy(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        """Toy docstring."""

    rows = torch.ones(3, 4)
    assert toy(rows) is rows
    assert toy((rows, torch.ones(3)), 5.0) is rows
    assert toy([rows]) == [rows]
    assert toy(torch.nn.Parameter(rows)) is not None
    assert routed == [(tuple, 5.0)]
    assert eager_seen == [torch.Tensor, list, torch.nn.Parameter]

    def extra(name, scale):
        if scale > 1:
            raise ValueError(f'{name}: scale must be at most 1, got {scale}')

    for label, shown in ((None, f'{name}_form'), ('the_public_name', 'the_public_name')):
        labelled = operator.Operator(
            f'{name}_form' if label is None else f'{name}_labelled', operator.tensor('x', torch.float32, 'T, n'),
            operator.scalar('scale', 'float'), extra=extra, choose_config=None, get_kernel=None, label=label,
        )  # fmt: skip
        assert labelled.name != 'the_public_name'
        with pytest.raises(ValueError, match=f'^{shown}: scale must be at most 1, got 2.0'):
            labelled.check(rows, 2.0)


def test_an_optional_written_tensor_is_checked_when_given_and_takes_the_full_path(monkeypatch):
    """An optional tensor written in place (moe_topk_gate's scores): `Tensor(a!)?` in the schema, its overlaps
    checked only when it is given, and a call that gives it leaves the fast path to the full check."""
    name = f'toy_{uuid.uuid4().hex[:8]}'
    declared = operator.Operator(
        name,
        operator.tensor('x', torch.float32, 'n'),
        operator.tensor('y', torch.float32, 'n', optional=True, written='written'),
        choose_config=None,
        get_kernel=None,
    )

    @declared.public(lambda x, y: None, returns='()')
    def toy(x: torch.Tensor, y: torch.Tensor | None = None) -> None:
        """Toy docstring."""

    schema = str(declared.forms[name]._schema)
    assert schema == f'cann_ops_tilelang::{name}(Tensor x, Tensor(a!)? y) -> ()'
    x = torch.zeros(8)
    with pytest.raises(ValueError, match=rf'{name}: y \(written in place\) must not alias the input x'):
        declared.check(x, x)
    with pytest.raises(RuntimeError, match='no kernels'):  # apart, or absent: on to the device
        declared.check(x, torch.zeros(8))
    with pytest.raises(RuntimeError, match='no kernels'):
        declared.check(x, None)
    assert 'if not (y is None and type(x) in _PLAIN' in declared.source  # fast_ok: given, the full path decides


def test_an_optional_written_tensor_declared_fast_when_given_takes_the_fast_path_when_apart():
    """fast_when_given (moe_topk_gate's scores): a call that gives the tensor takes the fast path when it is
    contiguous and overlaps no other tensor given; otherwise the full path decides (None)."""
    name = f'toy_{uuid.uuid4().hex[:8]}'
    declared = operator.Operator(
        name,
        operator.tensor('x', torch.float32, 'n'),
        operator.tensor('m', torch.float32, 'n', optional=True),
        operator.tensor('y', torch.float32, optional=True, written='written', fast_when_given=True),
        choose_config=None,
        get_kernel=None,
    )
    fast_ok = fast_ok_on_cpu(declared)
    x, m, buffer = torch.zeros(8), torch.zeros(8), torch.zeros(16)
    assert fast_ok(x, None, None) == (8,)
    assert fast_ok(x, m, buffer[:8]) == (8,)  # apart from x and m
    assert fast_ok(x, None, x) is None  # aliases the input x
    assert fast_ok(x, buffer[4:12], buffer[:8]) is None  # overlaps the optional m
    assert fast_ok(x, None, torch.zeros(4, 2).t()) is None  # not contiguous
    # A call that gives none of them reads no address: the spans are read in the block of the tensor given.
    head = declared.source[declared.source.index('def fast_ok') :].split('    if y is not None:')[0]
    assert 'data_ptr' not in head
    with pytest.raises(ValueError, match='fast_when_given is for optional tensors written in place'):
        operator.tensor('z', torch.float32, optional=True, fast_when_given=True)


def test_the_fast_path_measures_strided_rows_by_their_span():
    """A 'rows' tensor (outer strides free) reaches past nbytes where its rows have gaps: a written tensor there
    overlaps it, and the fast path must leave such a call to the full check (engram's kv, rotary's query)."""
    declared = operator.Operator(
        f'toy_{uuid.uuid4().hex[:8]}',
        operator.tensor('kv', torch.float32, 'T, n', layout='rows'),
        operator.tensor('m', torch.float32, layout='rows', optional=True),
        operator.tensor('y', torch.float32, 'T, n', written='written'),
        choose_config=None,
        get_kernel=None,
    )
    fast_ok = fast_ok_on_cpu(declared)
    buffer = torch.zeros(8, 8)
    kv = buffer[:, :4]  # 8 rows of 4, every other half-row a gap: 32 elements over a span of 60
    assert fast_ok(kv, None, torch.zeros(8, 4)) == (8, 4)
    tail = buffer.view(-1)[32:64].view(8, 4)  # past kv's nbytes, inside its span: rows 4..7 of kv
    assert fast_ok(kv, None, tail) is None
    assert declared.check.__globals__['may_overlap'](kv, tail)  # the full check refuses it
    m = buffer[4:, 4:]  # elements 36..39, 44..47, 52..55, 60..63: nbytes reach 52
    assert fast_ok(kv[:1], m, buffer.view(-1)[56:64].view(2, 4)) is None  # the optional input's span, likewise
    assert fast_ok(kv[:1], m, torch.zeros(2, 4)) == (1, 4)


def test_the_fast_path_keeps_a_written_tensor_apart_from_the_optional_inputs_given():
    """A required written tensor that overlaps an optional input the call gives sends the call to the full path
    (its typed error), as one that overlaps a required input does."""
    declared = operator.Operator(
        f'toy_{uuid.uuid4().hex[:8]}',
        operator.tensor('x', torch.float32, 'n'),
        operator.tensor('m', torch.float32, 'n', optional=True),
        operator.tensor('y', torch.float32, 'n', written='written'),
        choose_config=None,
        get_kernel=None,
    )
    fast_ok = fast_ok_on_cpu(declared)
    x, buffer = torch.zeros(8), torch.zeros(16)
    assert fast_ok(x, None, buffer[:8]) == (8,)
    assert fast_ok(x, buffer[8:], buffer[:8]) == (8,)  # apart
    assert fast_ok(x, buffer[4:12], buffer[:8]) is None  # the optional input overlaps the written tensor
    assert fast_ok(x, None, x) is None  # the required input


def test_the_fast_path_checks_the_limits_the_first_tensor_gives():
    """A size past the declared limits (T * E elements, with T dynamic and so not in the operator's key) sends the
    call down the full path, which raises the limit's ValueError."""
    name = f'toy_{uuid.uuid4().hex[:8]}'

    def limits(name, T, E):
        if T * E > 64:
            raise ValueError(f'{name}: at most 64 elements, got {T} x {E}')

    declared = operator.Operator(
        name, operator.tensor('x', torch.float32, 'T, E'), limits=limits, choose_config=None, get_kernel=None
    )
    fast_ok = fast_ok_on_cpu(declared)
    assert fast_ok(torch.zeros(8, 8)) == (8, 8)
    assert fast_ok(torch.zeros(9, 8)) is None
    with pytest.raises(ValueError, match='at most 64 elements, got 9 x 8'):
        declared.check(torch.zeros(9, 8))


def test_an_optional_float_scalar_is_none_in_the_forms_and_on_the_fast_path():
    """An optional float (moe_swiglu_forward's routed_scaling_factor=None): `float?` in the schema, None passed
    through the forms' arguments (ints still become floats), and the fast path accepts None or a finite float."""
    name = f'toy_{uuid.uuid4().hex[:8]}'
    declared = operator.Operator(
        name,
        operator.tensor('x', torch.float32, 'n'),
        operator.scalar('scale', 'float', optional=True),
        choose_config=None,
        get_kernel=None,
    )
    empty = lambda x, scale: torch.empty_like(x)

    @declared.public(empty, returns='Tensor', fake=empty)
    def toy(x: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """Toy docstring."""

    assert str(declared.forms[name]._schema) == f'cann_ops_tilelang::{name}(Tensor x, float? scale) -> Tensor'
    with FakeTensorMode():
        x = torch.empty(8, device='cuda')  # a fake CUDA tensor: the device check passes, the fake kernel runs
        assert toy(x, None).shape == (8,)
        assert toy(x, 2).shape == (8,)
    assert '(scale is None or type(scale) is float and -_INF < scale < _INF)' in declared.source


class _Pair(NamedTuple):
    """A result type, as QuantTensor is (a tuple subclass)."""

    first: torch.Tensor
    second: torch.Tensor


def _dequant(name: str) -> operator.Operator:
    """A toy dequantisation: q a quantised tensor (data (T, n) int8, sf (T, *) fp32 or int32), a block of ints,
    a tuple (y, z) of output buffers whose layout depends on `wide`."""
    return operator.Operator(
        name,
        operator.quant('q', torch.int8, 'T, n', sf_dtype=(torch.float32, torch.int32)),
        operator.scalar('block', 'ints', optional=True),
        operator.scalar('wide', 'bool'),
        operator.outs('out', 'y', 'z'),
        extra=lambda name, q, T: q[1].shape[0] == T or (_ for _ in ()).throw(ValueError(f'{name}: sf rows')),
        results=lambda q, wide: ((q[0].shape, torch.float32), ((q[0].shape[0], 2 if wide else 1), torch.int32)),
        choose_config=lambda **choice: choice,
        get_kernel=None,
    )


_DATA, _SF = torch.zeros(3, 4, dtype=torch.int8), torch.zeros(3, 1)


@pytest.mark.parametrize(
    ('args', 'error', 'match'),
    [
        (([_DATA], None, False), TypeError, r'q must be a tuple \(data, sf\) of 2 tensors, got list of length 1'),
        ((_DATA, None, False), TypeError, r'q must be a tuple \(data, sf\) of 2 tensors, got Tensor'),
        (((_DATA.float(), _SF), None, False), TypeError, r'q\[0\] must have dtype torch.int8'),
        (((_DATA, _SF.half()), None, False), TypeError, r'q\[1\] must have dtype torch.float32 or torch.int32'),
        (((_DATA.t().contiguous().t(), _SF), None, False), ValueError, r'q\[0\] must be contiguous'),
        (((_DATA, torch.zeros(2, 3).t()), None, False), ValueError, r'q\[1\] must have a contiguous last dimension'),
        (((_DATA, _SF[:2]), None, False), ValueError, 'sf rows'),
        (((_DATA, _SF), (1, 2.0), False), TypeError, r'block must be a tuple of ints, got \(1, 2.0\)'),
        (((_DATA, _SF), 4, False), TypeError, 'block must be a tuple of ints, got 4'),
        (((_DATA, _SF), None, 1), TypeError, 'wide must be a bool'),
    ],
)
def test_a_quantised_input_is_checked_item_by_item(args, error, match):
    with pytest.raises(error, match=match):
        _dequant('dq_rejects').check(*args, None)


def test_tuple_outputs_take_the_layout_results_gives():
    declared = _dequant('dq_outs')
    q = _Pair(torch.zeros(3, 4, dtype=torch.int8), torch.zeros(3, 1))
    y, z = torch.zeros(3, 4), torch.zeros(3, 2, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        declared.check(q, (1, 32), True, (y, z))  # valid: the device decides
    with pytest.raises(TypeError, match=r'out must be a tuple \(y, z\) of 2 tensors, got tuple of length 1'):
        declared.check(q, None, True, (y,))
    with pytest.raises(ValueError, match=r'out\[1\] must have shape \(3, 1\), got \(3, 2\)'):
        declared.check(q, None, False, (y, z))  # the layout follows `wide`
    with pytest.raises(TypeError, match=r'out\[0\] must have dtype torch.float32'):
        declared.check(q, None, True, (y.int(), z))
    with pytest.raises(ValueError, match=r'out\[0\] must not alias the input q\[1\]'):
        declared.check((q[0], y.view(-1)[:3].view(3, 1)), None, True, (y, z))
    with pytest.raises(ValueError, match=r'out\[1\] must not alias the input out\[0\]'):
        declared.check(q, None, True, (y, y.view(torch.int32).view(-1)[:6].view(3, 2)))
    assert declared.fast_ok(q, None, True, None) is None  # CPU tensors
    assert 'if not isinstance(q, tuple) or len(q) != 2:' in declared.source
    assert '(block is None or type(block) is tuple and all(type(v) is int for v in block))' in declared.source
    with pytest.raises(ValueError, match='output buffers without dims need `results`'):
        operator.Operator(
            'dq_no_results',
            operator.tensor('x', torch.float32, 'n'),
            operator.outs('out', 'y', 'z'),
            choose_config=None,
            get_kernel=None,
        )


def test_forms_flatten_quantised_inputs_and_tuple_outputs(monkeypatch):
    name = f'dq_{uuid.uuid4().hex[:8]}'
    declared = _dequant(name)
    calls = []

    def eager(q, block, wide, out):
        calls.append((q, block, wide, out))
        return out if out is not None else tuple(torch.zeros(s, dtype=d) for s, d in declared.results(q, block, wide))

    @declared.public(eager, result=_Pair)
    def dequant(q, block=None, wide=False, *, out=None):
        """Toy."""

    schemas = [str(form._schema) for form in declared.forms.values()]
    assert schemas == [
        f'cann_ops_tilelang::{name}(Tensor q_data, Tensor q_sf, int[]? block, bool wide) -> (Tensor, Tensor)',
        f'cann_ops_tilelang::{name}_out(Tensor q_data, Tensor q_sf, int[]? block, bool wide, Tensor(a!) out_y, '
        'Tensor(b!) out_z) -> ()',
    ]
    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    q = (torch.zeros(3, 4, dtype=torch.int8), torch.zeros(3, 1))
    # The functional form on real tensors: the eager path gets the pair back; its tuple comes back as `result`.
    value = declared.forms[name](*q, [1, 32], True)
    assert [tuple(t.shape) for t in value] == [(3, 4), (3, 2)]
    assert calls[-1][:2] == (q, [1, 32])
    assert calls[-1][3] is None
    y, z = torch.zeros(3, 4), torch.zeros(3, 1, dtype=torch.int32)
    declared.forms[f'{name}_out'](*q, None, False, y, z)
    assert calls[-1][3] == (y, z)
    # While torch traces (fake tensors), the public call takes the forms; the fake outputs follow `results`.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fq = (torch.zeros(5, 4, dtype=torch.int8), torch.zeros(5, 1))
        result = dequant(fq, (1, 4), True)
        assert isinstance(result, _Pair)
        assert [(tuple(t.shape), t.dtype) for t in result] == [((5, 4), torch.float32), ((5, 2), torch.int32)]
        buffers = (torch.zeros(5, 4), torch.zeros(5, 1, dtype=torch.int32))
        assert tuple(dequant(fq, out=buffers)) == buffers
    assert len(calls) == 2  # traced calls never reached the eager path
    with pytest.raises(ValueError, match=r"no torch.library form can carry \['anything'\]"):
        operator.Operator(
            f'{name}_any',
            operator.tensor('x', torch.float32, 'n'),
            operator.scalar('anything', 'any'),
            choose_config=None,
            get_kernel=None,
        ).public(lambda x, anything: x)(lambda x, anything: None)


def _column_major(name: str) -> operator.Operator:
    """A toy operator whose outputs are y (T, n), contiguous, and z (T, 3), column-major in a buffer of T rounded
    up to 4 columns: `results` gives z's strides."""
    return operator.Operator(
        name,
        operator.tensor('x', torch.float32, 'T, n'),
        operator.outs('out', 'y', 'z'),
        results=lambda x: (
            (x.shape, torch.float32),
            ((x.shape[0], 3), torch.float32, (1, -(-x.shape[0] // 4) * 4)),
        ),
        choose_config=lambda **choice: choice,
        get_kernel=None,
    )


def test_new_output_allocates_the_shape_and_dtype_of_a_results_item():
    """new_output passes the sizes as separate arguments (cheaper to parse); a 0-d shape has none to pass."""
    like = torch.zeros(2, dtype=torch.float64)
    for shape in ((), (0,), (3,), (2, 3), torch.Size([4, 1, 2])):
        buffer = operator.new_output(like, (shape, torch.int64))
        assert (tuple(buffer.shape), buffer.dtype, buffer.is_contiguous()) == (tuple(shape), torch.int64, True)
    with FakeTensorMode():  # fake and symbolic sizes too (the fake kernels allocate with it)
        assert operator.new_output(torch.zeros(5), ((5, 2), torch.float32)).shape == (5, 2)


def test_results_strides_lay_out_the_new_outputs_and_check_given_ones():
    declared = _column_major('cm_outs')
    x = torch.zeros(5, 2)
    y, z = declared.new_outputs(x, x, None)
    assert y.is_contiguous()
    assert (tuple(z.shape), z.stride()) == ((5, 3), (1, 8))
    assert z.untyped_storage().nbytes() == 3 * 8 * 4  # the whole padded buffer, as torch.empty(3, 8)[:, :5].T
    empty = declared.new_outputs(x[:0], x[:0], None)[1]
    assert (tuple(empty.shape), empty.stride(), empty.untyped_storage().nbytes()) == ((0, 3), (1, 0), 0)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        declared.check(x, (torch.empty(5, 2), torch.empty(3, 8)[:, :5].T))  # valid: the device decides
    with pytest.raises(ValueError, match=r'out\[1\] must have strides \(1, 8\) for shape \(5, 3\) .*, got \(3, 1\)'):
        declared.check(x, (torch.empty(5, 2), torch.empty(5, 3)))
    with pytest.raises(ValueError, match=r'out\[0\] must be contiguous'):  # y keeps the contiguous layout
        declared.check(x, (torch.empty(2, 5).T, z))
    shared = torch.zeros(24)
    with pytest.raises(ValueError, match=r'out\[1\] must not alias the input x'):
        declared.check(shared[:10].view(5, 2), (torch.empty(5, 2), shared.as_strided((5, 3), (1, 8))))
    single = operator.Operator(
        'cm_out',
        operator.tensor('x', torch.float32, 'T, n'),
        operator.out('out'),
        results=lambda x: (((x.shape[0], 3), torch.float32, (1, x.shape[0])),),
        choose_config=lambda **choice: choice,
        get_kernel=None,
    )
    with pytest.raises(ValueError, match=r'out must have strides \(1, 5\) for shape \(5, 3\)'):
        single.check(x, torch.empty(5, 3))
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        single.check(x, torch.empty(3, 5).T)


def test_fake_outputs_take_the_strides_results_gives(monkeypatch):
    """The functional form's fake kernel returns what the eager path allocates (Operator.new_outputs), strides
    included, also for symbolic sizes (make_fx's symbolic tracing, as torch.compile's dynamic shapes)."""
    name = f'cm_{uuid.uuid4().hex[:8]}'
    declared = _column_major(name)

    def eager(x, out):
        return out if out is not None else declared.new_outputs(x, x, out)

    @declared.public(eager, result=_Pair)
    def column_major(x, *, out=None):
        """Toy."""

    monkeypatch.setattr(config, 'require_accelerator', lambda *tensors: 'cuda')
    with FakeTensorMode():
        for tokens, stride in ((5, 8), (8, 8), (1, 4), (0, 0)):
            y, z = column_major(torch.zeros(tokens, 2))
            assert y.is_contiguous()
            assert (tuple(z.shape), z.stride()) == ((tokens, 3), (1, stride))
    from torch.fx.experimental.proxy_tensor import make_fx

    traced = make_fx(lambda x: column_major(x)[1], tracing_mode='symbolic')(torch.zeros(5, 2))
    assert traced(torch.zeros(6, 2)).stride() == (1, 8)
    assert traced(torch.zeros(9, 2)).stride() == (1, 12)
