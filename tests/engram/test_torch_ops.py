"""The Engram operators as torch.library ops: registration and mutation annotations, fake kernels (shapes,
dtypes, strides, typed errors), torch.compile / make_fx traces (CPU tier); opcheck, torch.compile against
eager and one CUDA graph of forward + backward + grad_w_reduce (device)."""

from __future__ import annotations

import contextlib
import inspect

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cann_ops_tilelang
from cann_ops_tilelang import config, operator
from cann_ops_tilelang.engram.engram_gate_bwd_kernel import fixed_range_max_tokens
from cann_ops_tilelang.operator import NAMESPACE, OPERATORS, traced
from tests.testing.graphs import GraphRecorder
from tests.testing.lowering import H200_SMS

# Small: the fake tests allocate nothing, the device tests stay quick on the emulator; hc and H (and the hash
# shape below) are those of the operator tests' level-0 values, so the kernels compiled there serve here too.
T, HC, H = 5, 4, 64
EPS = CLAMP = 1e-6
ROWS, HEAD_DIM = 7, 64
H200_PARTIALS = 2 * H200_SMS  # engram_sinkhorn_step on CUDA: two blocks per SM
ops = cann_ops_tilelang

# The arguments each op declares written (its schema's `(a!)` annotations) and nothing else.
MUTATED = {
    'engram_fused_weight': (),
    'engram_fused_weight_out': ('out',),
    'engram_gate_fwd': (),
    'engram_gate_fwd_out': ('out',),
    'engram_gate_fwd_out_nosave': ('out',),
    'engram_gate_fwd_inplace': ('hidden_states',),
    'engram_gate_bwd': (),
    'engram_grad_w_reduce': ('grad_weight_hidden', 'grad_weight_embed'),
    'engram_hash': (),
    'engram_hash_out': ('out',),
    'engram_sinkhorn_momentum_update': ('momentum_buffer',),
    'engram_sinkhorn_step': ('row_scale',),
    'engram_sinkhorn_step_reduce': ('col_sumsq',),
    'engram_sinkhorn_finalize': (),
    'engram_sinkhorn_finalize_out': ('out',),
}


def _op(name: str):
    return getattr(getattr(torch.ops, NAMESPACE), name).default


# ---------------------------------------------------------------- inputs


def _gate_inputs(device, num_tokens: int = T):
    bf16 = torch.bfloat16
    x = torch.randn(num_tokens, HC, H, dtype=bf16, device=device)
    kv = torch.randn(num_tokens, HC + 1, H, dtype=bf16, device=device)
    wh = (1.0 + 0.5 * torch.randn(HC, H, device=device)).to(bf16)
    we = (1.0 + 0.5 * torch.randn(HC, H, device=device)).to(bf16)
    return x, kv, wh, we


def _hash_inputs(device, num_tokens: int = T, layers: int = 2, ngram: int = 3, tables: int = 8):
    ids = torch.randint(0, 50000, (num_tokens, ngram), dtype=torch.int32, device=device)
    multipliers = torch.randint(1, 2**40, (layers, ngram), dtype=torch.int64, device=device)
    vocab_sizes = torch.randint(1000, 100000, (layers, ngram - 1, tables), dtype=torch.int32, device=device)
    offsets = torch.randint(0, 10**6, (layers, (ngram - 1) * tables), dtype=torch.int32, device=device)
    return ids, multipliers, vocab_sizes, offsets


def _sinkhorn_inputs(device):
    matrix = torch.rand(ROWS, HEAD_DIM, device=device) + 0.5
    row_scale = torch.rand(ROWS, device=device) + 0.5
    col_scale = torch.rand(HEAD_DIM, device=device) + 0.5
    return matrix, row_scale, col_scale


def _empty_like_all(*tensors):
    return tuple(torch.empty_like(t) for t in tensors)


@contextlib.contextmanager
def _fake_cuda(monkeypatch):
    """FakeTensorMode on a machine without a GPU: fake `cuda` tensors (meta storage, device cuda:0), and the
    device's SM count (what P of the partial sums is) an H200's instead of a device query."""
    monkeypatch.setattr(config, '_cuda_sm_count', lambda index: H200_SMS)
    with FakeTensorMode():
        yield torch.device('cuda', 0)


def _assert_meta(t: torch.Tensor, shape, dtype) -> None:
    """Exact shape and dtype, contiguous strides (what the eager call returns), on the inputs' device."""
    assert tuple(t.shape) == tuple(shape)
    assert t.dtype == dtype
    assert t.is_contiguous()
    assert t.stride() == torch.empty(shape, device='meta').stride()


# ---------------------------------------------------------------- CPU tier: registration


def test_every_public_operator_has_its_ops():
    # Importing the package must register them: torch.compile cannot trace a public operator without its op.
    missing = [name for name in cann_ops_tilelang.__all__ if not hasattr(getattr(torch.ops, NAMESPACE), name)]
    assert not missing, f'public operators without their op {NAMESPACE}::<name>: {missing}'
    for name in cann_ops_tilelang.__all__:
        assert _op(name)._schema.name == f'{NAMESPACE}::{name}'
    # Every public function is an Operator's, and Engram's forms are MUTATED's (checked below and after).
    for name in cann_ops_tilelang.__all__:
        assert getattr(cann_ops_tilelang, name).operator is OPERATORS[name]
    engram = cann_ops_tilelang.engram
    functions = [name for name in engram.__all__ if inspect.isfunction(getattr(engram, name))]
    names = [form for name in functions for form in OPERATORS[name].forms]
    assert sorted(names) == sorted(MUTATED)
    for name in names:
        assert _op(name)._schema.name == f'{NAMESPACE}::{name}'


@pytest.mark.parametrize('name', sorted(MUTATED))
def test_schema_declares_exactly_what_the_op_writes(name):
    schema = _op(name)._schema
    written = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    assert written == MUTATED[name]
    # No output aliases an input (torch.library forbids it; the Python calls return the written inputs).
    assert all(r.alias_info is None for r in schema.returns)


def test_traced_routes_only_traced_calls():
    x = torch.zeros(2)
    assert not traced(x)
    assert not traced(torch.nn.Parameter(x))  # weights: the eager route
    assert not traced(None)  # non-tensors: the eager route raises the TypeError
    with FakeTensorMode() as mode:
        assert traced(torch.zeros(2))
        assert traced(x)  # a real tensor while a dispatch mode is active
    assert traced(mode.from_tensor(x))


# ---------------------------------------------------------------- CPU tier: fake kernels


def test_fake_fused_weight_and_gate(monkeypatch):
    with _fake_cuda(monkeypatch) as cuda:
        x, kv, wh, we = _gate_inputs(cuda)
        w = ops.engram_fused_weight(wh, we)
        _assert_meta(w, (HC, H), torch.float32)
        assert w.device == cuda
        out = torch.empty(HC, H, device=cuda)
        assert ops.engram_fused_weight(wh, we, out=out) is out

        fwd = ops.engram_gate_fwd(x, kv, w, EPS, CLAMP)
        _assert_meta(fwd.output, (T, HC, H), torch.bfloat16)
        for saved in fwd[1:]:
            _assert_meta(saved, (T, HC), torch.float32)
        nosave = ops.engram_gate_fwd(x, kv, w, EPS, CLAMP, False)
        _assert_meta(nosave.output, (T, HC, H), torch.bfloat16)
        assert nosave[1:] == (None, None, None, None)
        out = torch.empty_like(x)
        with_out = ops.engram_gate_fwd(x, kv, w, EPS, CLAMP, out=out)
        assert with_out.output is out
        _assert_meta(with_out.rstd_k, (T, HC), torch.float32)
        assert ops.engram_gate_fwd(x, kv, w, EPS, CLAMP, False, out=out)[1:] == (None,) * 4
        assert ops.engram_gate_fwd(x, kv, w, EPS, CLAMP, False, None, True).output is x
        mask = torch.zeros(T, dtype=torch.bool, device=cuda)
        _assert_meta(ops.engram_gate_fwd(x, kv, w, EPS, CLAMP, True, mask).dot, (T, HC), torch.float32)

        bwd = ops.engram_gate_bwd(torch.empty_like(x), x, kv, w, *fwd[1:], CLAMP)
        _assert_meta(bwd.grad_hidden_states, (T, HC, H), torch.bfloat16)
        _assert_meta(bwd.grad_kv, (T, HC + 1, H), torch.bfloat16)
        _assert_meta(bwd.grad_w_partial, (H200_SMS, HC, H), torch.float32)  # P = the device's SMs
        empty = _gate_inputs(cuda, num_tokens=0)
        assert (
            bwd.grad_w_partial.shape
            == ops.engram_gate_bwd(
                empty[0], empty[0], empty[1], w, *[torch.empty(0, HC, device=cuda)] * 4, CLAMP
            ).grad_w_partial.shape
        )

        gwh, gwe = torch.empty(HC, H, device=cuda), torch.empty(HC, H, device=cuda)
        result = ops.engram_grad_w_reduce(bwd.grad_w_partial, wh, we, gwh, gwe)
        assert result.grad_weight_hidden is gwh
        assert result.grad_weight_embed is gwe


def test_fake_hash_and_sinkhorn(monkeypatch):
    with _fake_cuda(monkeypatch) as cuda:
        ids, multipliers, vocab_sizes, offsets = _hash_inputs(cuda)
        rows = ops.engram_hash(ids, multipliers, vocab_sizes, offsets)
        _assert_meta(rows, (2, T, 16), torch.int32)
        mask = torch.zeros(T, dtype=torch.bool, device=cuda)
        _assert_meta(ops.engram_hash(ids, multipliers, vocab_sizes, offsets, mask), (2, T, 16), torch.int32)
        out = torch.empty(2, T, 16, dtype=torch.int32, device=cuda)
        assert ops.engram_hash(ids, multipliers, vocab_sizes, offsets, out=out) is out

        for grad_dtype in (torch.bfloat16, torch.float32):
            grad = torch.empty(1000, dtype=grad_dtype, device=cuda)
            buffer = torch.empty(1000, dtype=torch.bfloat16, device=cuda)
            _assert_meta(ops.engram_sinkhorn_momentum_update(grad, buffer, 0.9), (1000,), torch.float32)

        matrix, row_scale, col_scale = _sinkhorn_inputs(cuda)
        row_norm, partial = ops.engram_sinkhorn_step(matrix, row_scale, col_scale, EPS)
        _assert_meta(row_norm, (ROWS,), torch.float32)
        _assert_meta(partial, (H200_PARTIALS, HEAD_DIM), torch.float32)
        col_sumsq = torch.empty(HEAD_DIM, device=cuda)
        assert ops.engram_sinkhorn_step_reduce(partial, col_sumsq) is col_sumsq
        _assert_meta(
            ops.engram_sinkhorn_finalize(matrix, row_scale, col_scale, EPS, 1.0), (ROWS, HEAD_DIM), torch.float32
        )
        out = torch.empty(ROWS, HEAD_DIM, device=cuda)
        assert ops.engram_sinkhorn_finalize(matrix, row_scale, col_scale, EPS, 1.0, out) is out


def test_fake_calls_raise_the_typed_errors(monkeypatch):
    """The contract's errors while torch traces: from the Python call and from the ops themselves."""
    with _fake_cuda(monkeypatch) as cuda:
        x, kv, wh, we = _gate_inputs(cuda)
        w = torch.empty(HC, H, device=cuda)
        with pytest.raises(TypeError, match='weight_hidden must have dtype torch.bfloat16'):
            ops.engram_fused_weight(wh.float(), we)
        with pytest.raises(ValueError, match=rf'weight_embed must have shape \({HC}, {H}\)'):
            _op('engram_fused_weight')(wh, torch.empty(HC, 2 * H, dtype=torch.bfloat16, device=cuda))
        with pytest.raises(ValueError, match='hidden size must be a positive multiple of 64'):
            ops.engram_fused_weight(*[torch.empty(HC, 100, dtype=torch.bfloat16, device=cuda)] * 2)
        with pytest.raises(ValueError, match='inplace=True overwrites hidden_states'):
            ops.engram_gate_fwd(x, kv, w, EPS, CLAMP, True, None, True)
        with pytest.raises(ValueError, match='out must not alias the input hidden_states'):
            ops.engram_gate_fwd(x, kv, w, EPS, CLAMP, out=x)  # the same tensor: seen without memory
        with pytest.raises(ValueError, match='eps must be a finite number > 0'):
            _op('engram_gate_fwd')(x, kv, w, -1.0, CLAMP, True, None)
        with pytest.raises(RuntimeError, match='one device'):
            ops.engram_gate_fwd(x, kv, torch.empty(HC, H, device='cpu'), EPS, CLAMP)
        with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
            ops.engram_fused_weight(*[torch.empty(HC, H, dtype=torch.bfloat16)] * 2)
        gwh = torch.empty(HC, H, device=cuda)
        with pytest.raises(ValueError, match='grad_weight_hidden and grad_weight_embed must not overlap'):
            ops.engram_grad_w_reduce(torch.empty(3, HC, H, device=cuda), wh, we, gwh, gwh)
        matrix, row_scale, _ = _sinkhorn_inputs(cuda)
        with pytest.raises(ValueError, match='head_dim must be a positive multiple of 64'):
            ops.engram_sinkhorn_step(torch.empty(ROWS, 100, device=cuda), row_scale, torch.empty(100, device=cuda), EPS)
        with pytest.raises(ValueError, match='momentum_buffer .* must not alias the input grad'):
            ops.engram_sinkhorn_momentum_update(matrix, matrix, 0.9)
        with pytest.raises(TypeError, match='ngram_token_ids must have dtype torch.int32'):
            ops.engram_hash(*_empty_like_all(torch.empty(T, 3, device=cuda)), *_hash_inputs(cuda)[1:])


def test_memory_checks_run_on_real_tensors_only(monkeypatch):
    """Alignment and overlap between distinct views need memory: eager calls check them (the contract tests),
    traced calls leave them to the op's real kernel, which runs the eager checks on the real tensors."""
    checked = []
    declared = ops.engram_fused_weight.operator
    real_check = declared.check

    def spy(*args, memory=True):
        checked.append(memory)
        return real_check(*args, memory=memory)

    monkeypatch.setattr(declared, 'check', spy)
    with _fake_cuda(monkeypatch) as cuda:
        wh = torch.empty(HC, H, dtype=torch.bfloat16, device=cuda)
        ops.engram_fused_weight(wh, wh)
    assert checked
    assert not any(checked)  # the Python call and the fake kernel, both without memory
    checked.clear()
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors"):
        ops.engram_fused_weight(*[torch.empty(HC, H, dtype=torch.bfloat16)] * 2)
    assert checked == [True]


# ---------------------------------------------------------------- CPU tier: traces


def _training_step(x, kv, wh, we, gwh, gwe, grad_out):
    """Forward, backward and the weight-gradient reduction, as a model's step calls them."""
    w = ops.engram_fused_weight(wh, we)
    fwd = ops.engram_gate_fwd(x, kv, w, EPS, CLAMP)
    bwd = ops.engram_gate_bwd(grad_out, x, kv, w, fwd.dot, fwd.gate_score, fwd.rstd_x, fwd.rstd_k, CLAMP)
    ops.engram_grad_w_reduce(bwd.grad_w_partial, wh, we, gwh, gwe)
    return fwd.output * 2, bwd.grad_hidden_states, bwd.grad_kv


def _sinkhorn_chain(grad, momentum, row_scale, col_scale, col_sumsq, out):
    matrix = ops.engram_sinkhorn_momentum_update(grad, momentum, 0.9).view(ROWS, HEAD_DIM)
    _, partial = ops.engram_sinkhorn_step(matrix, row_scale, col_scale, EPS)
    ops.engram_sinkhorn_step_reduce(partial, col_sumsq)
    return ops.engram_sinkhorn_finalize(matrix, row_scale, col_scale, EPS, 2.0, out)


def _hash_and_inplace(ids, multipliers, vocab_sizes, offsets, x, kv, w, mask):
    rows = ops.engram_hash(ids, multipliers, vocab_sizes, offsets, mask)
    ops.engram_gate_fwd(x, kv, w, EPS, CLAMP, False, mask, True)
    return rows + 1


class _GraphRecorder(GraphRecorder):
    """The shared recorder, whose targets are every graph's, without the overload suffix."""

    def targets(self) -> set[str]:
        # Dynamo records the op packets (`cann_ops_tilelang.engram_gate_fwd`), AOTAutograd the overloads.
        return {
            str(n.target).removesuffix('.default')
            for gm in self.graphs
            for n in gm.graph.nodes
            if n.op == 'call_function'
        }


def _step_inputs(device, num_tokens: int = T):
    x, kv, wh, we = _gate_inputs(device, num_tokens)
    return x, kv, wh, we, torch.zeros(HC, H, device=device), torch.zeros(HC, H, device=device), torch.randn_like(x)


def _sinkhorn_chain_inputs(device):
    numel = ROWS * HEAD_DIM
    grad = torch.randn(numel, device=device)
    momentum = torch.randn(numel, dtype=torch.bfloat16, device=device)
    _, row_scale, col_scale = _sinkhorn_inputs(device)
    return (
        grad,
        momentum,
        row_scale,
        col_scale,
        torch.empty(HEAD_DIM, device=device),
        torch.empty(ROWS, HEAD_DIM, device=device),
    )


def _hash_inplace_inputs(device):
    x, kv, _, _ = _gate_inputs(device)
    w = torch.rand(HC, H, device=device) + 0.5
    return (*_hash_inputs(device), x, kv, w, torch.zeros(T, dtype=torch.bool, device=device))


@pytest.mark.parametrize(
    ('fn', 'make_inputs', 'expected'),
    [
        (
            _training_step,
            _step_inputs,
            ('engram_fused_weight', 'engram_gate_fwd', 'engram_gate_bwd', 'engram_grad_w_reduce'),
        ),
        (
            _sinkhorn_chain,
            _sinkhorn_chain_inputs,
            (
                'engram_sinkhorn_momentum_update',
                'engram_sinkhorn_step',
                'engram_sinkhorn_step_reduce',
                'engram_sinkhorn_finalize_out',
            ),
        ),
        (_hash_and_inplace, _hash_inplace_inputs, ('engram_hash', 'engram_gate_fwd_inplace')),
    ],
    ids=['gate', 'sinkhorn', 'hash_inplace'],
)
def test_compile_fullgraph_with_fake_cuda_tensors(monkeypatch, fn, make_inputs, expected):
    """Dynamo traces every operator into one graph (fullgraph=True: a graph break would raise) on fake CUDA
    tensors. The 'eager' backend runs the graph as traced: AOTAutograd and Inductor would need a CUDA build
    of torch for fake CUDA tensors, so functionalization is checked on the emulator below."""
    torch._dynamo.reset()
    recorder = _GraphRecorder()
    with _fake_cuda(monkeypatch) as cuda:
        inputs = make_inputs(cuda)
        results = torch.compile(fn, fullgraph=True, backend=recorder)(*inputs)
        eager = fn(*inputs)  # the same calls through the ops, not compiled: the same metadata
    assert len(recorder.graphs) == 1
    assert {f'{NAMESPACE}.{name}' for name in expected} <= recorder.targets(), recorder.targets()
    for got, want in zip(results, eager, strict=True):
        assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride())


def test_compile_errors_under_tracing(monkeypatch):
    """A contract violation found while Dynamo traces: without fullgraph Dynamo falls back to running the
    call, which raises the typed error; with fullgraph=True torch itself turns every exception raised in
    traced code into torch._dynamo.exc.Unsupported, which names the original."""
    torch._dynamo.reset()
    with _fake_cuda(monkeypatch) as cuda:
        wh = torch.empty(HC, H, dtype=torch.bfloat16, device=cuda)
        we = torch.empty(HC, 2 * H, dtype=torch.bfloat16, device=cuda)
        with pytest.raises(ValueError, match='weight_embed must have shape'):
            torch.compile(ops.engram_fused_weight, backend='eager')(wh, we)
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported, match='ValueError.*weight_embed must have shape'):
            torch.compile(ops.engram_fused_weight, backend='eager', fullgraph=True)(wh, we)


@pytest.fixture
def emulated_cpu(monkeypatch):
    """CPU tensors as the Ascend C emulator's: the ops' fake kernels need no device at all there (64 emulated
    cores), so AOTAutograd, functionalization and make_fx run on a CPU build of torch. Nothing is launched
    (fake tensors only)."""
    pytest.importorskip('cann_ops_ascend_emu')
    monkeypatch.setenv(config.ASCEND_EMULATOR_ENV, '1')
    return torch.device('cpu')


def test_compile_functionalizes_the_mutations(emulated_cpu):
    """AOTAutograd (the 'aot_eager' backend: Inductor's front half; Inductor's own code cannot run on fake
    tensors) functionalizes the in-place ops (auto_functionalized) and traces every op in one graph."""
    # Imported here, not at the top: it pulls in torch._dynamo (about 1 s), which every xdist worker would pay at
    # collection; torch._dynamo itself does not import it.
    from torch._dynamo.backends.common import aot_autograd

    record = GraphRecorder()
    backend = aot_autograd(fw_compiler=record)
    with FakeTensorMode():
        inputs = _step_inputs(emulated_cpu)
        out, grad_x, grad_kv = torch.compile(_training_step, fullgraph=True, backend=backend)(*inputs)
        assert (out.shape, grad_x.shape, grad_kv.shape) == ((T, HC, H), (T, HC, H), (T, HC + 1, H))
        chain = _sinkhorn_chain_inputs(emulated_cpu)
        assert torch.compile(_sinkhorn_chain, fullgraph=True, backend=backend)(*chain).shape == (ROWS, HEAD_DIM)
    assert len(record.graphs) == 2
    code = record.graphs[0].code + record.graphs[1].code
    for name in ('engram_grad_w_reduce', 'engram_sinkhorn_momentum_update', 'engram_sinkhorn_step'):
        assert f'{NAMESPACE}.{name}.default' in code  # mutating ops, functionalized
    # grad_w_reduce in the first graph; momentum, step, step_reduce and finalize's out= in the second
    assert all('auto_functionalized' in gm.code for gm in record.graphs)


def test_functional_ops_outputs_never_require_grad(emulated_cpu):
    """Weights arrive as parameters that require grad: as in eager, the outputs do not (the gradients are
    explicit operators), so AOTAutograd traces the ops without a backward."""
    forms = [(form, overload) for op in OPERATORS.values() for form, overload in op.forms.items()]
    assert {form for form, overload in forms if not overload._schema.is_mutable} >= {
        'engram_fused_weight',
        'engram_gate_fwd',
        'engram_gate_bwd',
        'engram_hash',
        'engram_sinkhorn_finalize',
    }
    torch._dynamo.reset()
    with FakeTensorMode():
        wh, we = (torch.nn.Parameter(t) for t in _gate_inputs(emulated_cpu)[2:])
        assert not ops.engram_fused_weight(wh, we).requires_grad
        compiled = torch.compile(lambda a, b: ops.engram_fused_weight(a, b) * 2, fullgraph=True, backend='aot_eager')
        assert not compiled(wh, we).requires_grad


def test_make_fx_records_the_ops(emulated_cpu):
    """make_fx (torch.export's non-strict tracer) sees one op per operator call, mutations included."""
    gm = torch.fx.experimental.proxy_tensor.make_fx(_training_step, tracing_mode='fake')(*_step_inputs(emulated_cpu))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == 'call_function']
    for name in ('engram_fused_weight', 'engram_gate_fwd', 'engram_gate_bwd', 'engram_grad_w_reduce'):
        assert f'{NAMESPACE}.{name}.default' in targets
    gm = torch.fx.experimental.proxy_tensor.make_fx(_sinkhorn_chain, tracing_mode='fake')(
        *_sinkhorn_chain_inputs(emulated_cpu)
    )
    partials = [n for n in gm.graph.nodes if str(n.target) == f'{NAMESPACE}.engram_sinkhorn_step.default']
    assert partials[0].meta['val'][1].shape == (64, HEAD_DIM)  # P = the emulated chip's 64 vector cores


# ---------------------------------------------------------------- device tier


def _opcheck_args(name: str, device) -> tuple:
    """Real arguments of op `name` (small shapes, every tensor on `device`)."""
    x, kv, wh, we = _gate_inputs(device)
    w = ops.engram_fused_weight(wh, we)
    fwd = ops.engram_gate_fwd(x, kv, w, EPS, CLAMP)
    mask = torch.zeros(T, dtype=torch.bool, device=device)
    mask[1] = True
    hash_args = _hash_inputs(device)
    matrix, row_scale, col_scale = _sinkhorn_inputs(device)
    _, partial = ops.engram_sinkhorn_step(matrix, row_scale.clone(), col_scale, EPS)
    cases = {
        'engram_fused_weight': (wh, we),
        'engram_fused_weight_out': (wh, we, torch.empty(HC, H, device=device)),
        'engram_gate_fwd': (x, kv, w, EPS, CLAMP, True, mask),
        'engram_gate_fwd_out': (x, kv, w, EPS, CLAMP, None, torch.empty_like(x)),
        'engram_gate_fwd_out_nosave': (x, kv, w, EPS, CLAMP, mask, torch.empty_like(x)),
        'engram_gate_fwd_inplace': (x.clone(), kv, w, EPS, CLAMP, None),
        'engram_gate_bwd': (torch.randn_like(x), x, kv, w, *fwd[1:], CLAMP, mask),
        'engram_grad_w_reduce': (
            torch.randn(3, HC, H, device=device),
            wh,
            we,
            torch.randn(HC, H, device=device),
            torch.randn(HC, H, device=device),
        ),
        'engram_hash': (*hash_args, mask),
        'engram_hash_out': (*hash_args, None, torch.empty(2, T, 16, dtype=torch.int32, device=device)),
        'engram_sinkhorn_momentum_update': (
            torch.randn(1000, device=device),
            torch.randn(1000, dtype=torch.bfloat16, device=device),
            0.9,
            True,
        ),
        'engram_sinkhorn_step': (matrix, row_scale, col_scale, EPS),
        'engram_sinkhorn_step_reduce': (partial, torch.empty(HEAD_DIM, device=device)),
        'engram_sinkhorn_finalize': (matrix, row_scale, col_scale, EPS, 2.0),
        'engram_sinkhorn_finalize_out': (matrix, row_scale, col_scale, EPS, 2.0, torch.empty_like(matrix)),
    }
    return cases[name]


@pytest.mark.npu
@pytest.mark.parametrize('name', sorted(MUTATED))
def test_opcheck(device, name):
    """torch.library.opcheck: schema (mutations as declared, no aliased outputs), autograd registration, fake
    kernel against the real one, AOTAutograd with dynamic shapes against eager. The backward runs with fixed
    token ranges (deterministic algorithms), so that its partial sums are the same bits on every run."""
    args = _opcheck_args(name, device)
    with _deterministic_algorithms(name == 'engram_gate_bwd'):
        torch.library.opcheck(_op(name), args)


@contextlib.contextmanager
def _deterministic_algorithms(enabled: bool = True):
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(enabled or previous)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def _assert_same(got, want, *, exact: bool = True) -> None:
    for g, w in zip(got, want, strict=True):
        if g is None or w is None:
            assert g is w
        elif exact:
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def _step_results(fn_inputs):
    """Everything _training_step computes, with the weight gradients it accumulates in place."""
    x, kv, wh, we, gwh, gwe, grad_out = fn_inputs
    w = ops.engram_fused_weight(wh, we)
    fwd = ops.engram_gate_fwd(x, kv, w, EPS, CLAMP)
    bwd = ops.engram_gate_bwd(grad_out, x, kv, w, *fwd[1:], CLAMP)
    ops.engram_grad_w_reduce(bwd.grad_w_partial, wh, we, gwh, gwe)
    return w, fwd, bwd


@pytest.mark.npu
@pytest.mark.parametrize('backend', ['aot_eager', 'inductor'])
def test_compile_matches_eager(device, backend):
    """torch.compile(fullgraph=True) of forward + backward + reduce and of the Sinkhorn chain gives the eager
    results, the in-place updates included (fixed token ranges: the same partial sums every run)."""
    torch._dynamo.reset()
    inputs = _step_inputs(device)
    compiled_inputs = tuple(t.clone() for t in inputs)
    with _deterministic_algorithms():
        want = _training_step(*inputs)
        got = torch.compile(_training_step, fullgraph=True, backend=backend)(*compiled_inputs)
    _assert_same(got, want)
    _assert_same(compiled_inputs[4:6], inputs[4:6])  # grad_weight_hidden / _embed, accumulated in place
    chain = _sinkhorn_chain_inputs(device)
    compiled_chain = tuple(t.clone() for t in chain)
    want = _sinkhorn_chain(*chain)
    got = torch.compile(_sinkhorn_chain, fullgraph=True, backend=backend)(*compiled_chain)
    _assert_same((got, *compiled_chain[1:]), (want, *chain[1:]))  # momentum, row_scale, col_sumsq, out


@pytest.mark.npu
@pytest.mark.cuda_only
def test_cuda_graph_replays_forward_backward_and_reduce(device):
    """fused_weight, the forward, the backward (its token counter zero-filled inside the graph) and
    grad_w_reduce captured in one CUDA graph: each replay gives the eager results for the inputs then in the
    captured buffers. The backward's blocks claim tokens at run time (more than FIXED_RANGE_MAX_TOKENS_PER_BLOCK
    tokens per block), so grad_w_partial's split over slices, and the last bits of the reduced weight
    gradients, may differ from the eager run; its sum may not."""
    static = _step_inputs(device, fixed_range_max_tokens(config.get_num_cores(device)) + 1)
    x, kv, wh, we, gwh, gwe, grad_out = static
    eager = _step_results(tuple(t.clone() for t in static))  # also compiles every kernel before the capture

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
        _step_results(tuple(t.clone() for t in static))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _step_results(static)

    for round_ in range(2):
        if round_:  # new values in the captured inputs
            for t in (x, kv, grad_out):
                t.copy_(torch.randn_like(t))
            eager = _step_results(
                (x.clone(), kv.clone(), wh, we, torch.zeros_like(gwh), torch.zeros_like(gwe), grad_out.clone())
            )
        gwh.zero_()
        gwe.zero_()
        graph.replay()
        torch.cuda.synchronize()
        w, fwd, bwd = captured
        want_w, want_fwd, want_bwd = eager[:3]
        assert torch.equal(w, want_w)
        _assert_same(fwd, want_fwd)
        _assert_same(bwd[:2], want_bwd[:2])
        torch.testing.assert_close(bwd.grad_w_partial.sum(0), want_bwd.grad_w_partial.sum(0), rtol=1e-5, atol=1e-4)
        eager_gwh, eager_gwe = torch.zeros_like(gwh), torch.zeros_like(gwe)
        ops.engram_grad_w_reduce(want_bwd.grad_w_partial, wh, we, eager_gwh, eager_gwe)
        torch.testing.assert_close(gwh, eager_gwh, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(gwe, eager_gwe, rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------- CPU tier: the launch path


class TVMFFIKernelAdapter:  # stands in for TileLang's adapter of that name (its class name is what is checked)
    def __init__(self, executable, result_idx=()):
        self.result_idx = list(result_idx)
        self._ffi_callee_allocated_output_abi = False
        self._executable = executable

    def _get_executable(self):
        return self._executable


class _FakeJITKernel:
    def __init__(self, adapter):
        self.adapter = adapter
        self.calls = []

    def torch_function(self, *args):
        self.calls.append(args)


def test_launcher_compiles_on_first_launch_and_calls_the_tvm_ffi_function(monkeypatch):
    from cann_ops_tilelang import kernel_target

    direct = []
    kernel = _FakeJITKernel(TVMFFIKernelAdapter(lambda *args: direct.append(args)))
    compiled = []

    def get_kernel(cfg):
        compiled.append(cfg)
        return kernel

    guards = []
    monkeypatch.setattr(kernel_target, 'device_guard', lambda device: guards.append(device) or contextlib.nullcontext())
    monkeypatch.setattr(kernel_target, '_cuda_current_device', lambda: 0)
    launcher = kernel_target.Launcher(get_kernel, 'cfg', torch.device('cuda', 0))
    assert compiled == []  # choosing a configuration compiles nothing
    launcher.launch(1, 2)
    launcher.launch(3)
    assert compiled == ['cfg']  # once, under the device guard
    assert direct == [(1, 2), (3,)]  # the TVM-FFI function itself, not JITKernel.__call__
    assert kernel.calls == []
    assert guards == [torch.device('cuda', 0)]  # the current device: no guard per launch

    other = kernel_target.Launcher(get_kernel, 'cfg', torch.device('cuda', 1))
    other.launch(4)
    assert guards[-1] == torch.device('cuda', 1)  # not the current device: switched for the launch
    assert direct[-1] == (4,)


@pytest.mark.parametrize(
    ('device', 'adapter'),
    [
        # NPU streams: TileLang's own call (torch knows 'npu' only with torch_npu: a stand-in device)
        (type('NpuDevice', (), {'type': 'npu', 'index': 0})(), TVMFFIKernelAdapter(lambda *args: None)),
        (torch.device('cuda', 0), TVMFFIKernelAdapter(lambda *args: None, result_idx=[2])),  # allocates outputs
        (torch.device('cuda', 0), object()),  # another execution backend
    ],
    ids=['npu', 'tilelang-allocated-outputs', 'other-adapter'],
)
def test_launcher_keeps_tilelang_s_call_where_it_does_more(monkeypatch, device, adapter):
    from cann_ops_tilelang import kernel_target

    kernel = _FakeJITKernel(adapter)
    monkeypatch.setattr(kernel_target, 'device_guard', lambda device: contextlib.nullcontext())
    monkeypatch.setattr(kernel_target, '_cuda_current_device', lambda: 0)
    kernel_target.Launcher(lambda cfg: kernel, 'cfg', device).launch(7)
    assert kernel.calls == [(7,)]


def test_configurations_are_chosen_once_per_device(monkeypatch):
    """The eager path asks for the core count and builds the configuration on the first call only."""
    declared = ops.engram_fused_weight.operator
    queries = []
    monkeypatch.setattr(declared, '_launchers', {})
    monkeypatch.setattr(declared, 'check', lambda *args, **kwargs: 'cuda')
    monkeypatch.setattr(operator, 'get_num_cores', lambda device: queries.append(device) or H200_SMS)
    wh = torch.zeros(HC, H, dtype=torch.bfloat16)
    cfg = declared.config(wh, wh.clone())
    assert declared.config(wh, wh.clone()) is cfg
    assert queries == [torch.device('cpu')]
