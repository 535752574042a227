"""The operator mechanism: what every public operator needs, written once, and declared to by each operator.

An operator's `<op>.py` declares, in one `Operator(...)`:

- its arguments in the public signature's order, each with its contract: `tensor(name, dtype, dims, ...)`
  (dtype or dtypes, shape symbols such as 'T, hc + 1, H', layout, alignment, optional, written in place),
  `quant(name, dtype, dims, sf_dtype=...)` for a quantised tensor, the tuple (data, sf); `out(...)` for an
  optional output buffer, or `outs(name, *parts)` for a tuple of them, whose shapes and dtypes `results` gives;
  `scalar(name, kind)`; the out argument comes after every tensor, and only scalars may follow it (keyword-only
  ones of the public signature, such as per_token_cast's `seed`: the forms take them before the buffers);
- `limits` (a function raising ValueError on sizes the kernels do not take: its parameters name shape symbols),
  `extra` (plain-code checks the table cannot say: its parameters name arguments, symbols, `memory`);
  `results` ((shape, dtype) of each output buffer, or (shape, dtype, strides) for a buffer of another layout
  than the contiguous one: its parameters name arguments; the out= check, the fake kernels and the eager path's
  allocation, `Operator.new_outputs`, read it);
- `choice` (the keyword arguments of `choose_config` besides backend and num_cores: its parameters name
  arguments, `backend`, `device`), `choose_config` and `get_kernel` from `<op>_kernel.py`.

From that declaration the mechanism makes, as generated code (as dataclasses does: no per-call
interpretation of the table, so the host time is what hand-written code costs):

- `check(<args>, *, memory=True)`: the typed errors (validation.py) in one order for every operator: tensor
  types, dtypes and ranks; shape symbols and `limits`; shapes; layouts; alignment; scalars; `extra`; `out=`;
  overlaps of written tensors; the device. Returns the backend. memory=False is the same check on fake
  tensors while torch traces (alignment and overlap wait for the real tensors, see validation.may_overlap).
- `plan(<args>)`: check, then the launcher of `choice` (one launcher cache per operator).
- `fast_ok(<args>)`: what the fast path checks in Python before it trusts a launcher whose compiled entry
  checks every tensor argument (`Launcher.checks_arguments`): plain tensor types, a CUDA device, the first
  tensor's rank, the scalars, alignment, written tensors apart from the others, no `out=`, no optional written
  tensor unless it is declared `fast_when_given`. It returns the first tensor's shape (for the operator's key), or
  None where the full path must decide.
- with `@OP.public(eager, returns=..., fake=...)` on the public function's stub (signature and math
  docstring): the public function (traced calls take the torch.library ops, the others `eager`), its
  torch.library forms (functional, and `<name>_out` with `out=`; mutated arguments from `written`; a quantised
  tensor is two tensors of the forms, a tuple of buffers one written tensor each), and
  `config(...)`, the configuration any call launches (what the tests ask for).

The eager path stays in the operator's file, in plain code: the fast path's key, the allocation of outputs, the
launch and special cases such as empty inputs. The fast path's table is `Operator.fast`, launched through
`Operator.launch`, which has `Operator.check` explain a launch the entry rejects.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from collections.abc import Callable

import torch

from cann_ops_tilelang import config, validation
from cann_ops_tilelang.config import get_num_cores
from cann_ops_tilelang.kernel_target import Launcher
from cann_ops_tilelang.validation import ALIGN_BYTES, PLAIN_TENSOR_TYPES

NAMESPACE = 'cann_ops_tilelang'
# Every declared operator by its public name (the tests walk it: forms, signatures, configurations).
OPERATORS: dict[str, Operator] = {}
_WRITTEN = re.compile(r'Tensor\(\w!\)\??\s+(\w+)')
# scalar kind -> its check (validation.py; None: the operator's `extra` checks it) and its schema type
_SCALAR_CHECKS = {
    'float': 'check_finite_float',
    'positive': 'check_positive_float',
    'bool': 'check_bool',
    'int': 'check_int',
    'str': 'check_str',
    'ints': 'check_ints',
    'any': None,
}
_SCHEMA_TYPES = {'float': 'float', 'positive': 'float', 'bool': 'bool', 'int': 'int', 'str': 'str', 'ints': 'int[]'}
_FAST_TESTS = {
    'bool': 'type({0}) is bool',
    'int': 'type({0}) is int',
    'str': 'type({0}) is str',
    'ints': 'type({0}) is tuple and all(type(v) is int for v in {0})',
}


def new_output(like: torch.Tensor, layout: tuple) -> torch.Tensor:
    """An uninitialised tensor on `like`'s device of one `results` item: (shape, dtype), contiguous, or (shape,
    dtype, strides) over a buffer of max(size * stride) elements, the whole padded buffer of which a padded or
    permuted layout is a view (torch.empty((K, T_pad))[:, :T].T has strides (1, T_pad) and K * T_pad elements
    behind it), so a reader of the padding (a TMA box) stays inside the allocation. Sizes may be symbolic (fake
    tensors while torch traces)."""
    shape, dtype = layout[0], layout[1]
    strides = layout[2] if len(layout) > 2 else None
    if strides is None:
        # The sizes as separate arguments where there are any: torch's argument parser checks a size tuple item by
        # item and takes varargs sizes as they are (about 0.5 us less per tensor on a CPU host, measured; the
        # parsing comes before any device's allocator).
        return like.new_empty(*shape, dtype=dtype) if shape else like.new_empty((), dtype=dtype)
    extent = 0
    for size, stride in zip(shape, strides, strict=True):
        extent = torch.sym_max(extent, size * stride)
    return like.new_empty(extent, dtype=dtype).as_strided(shape, strides)


def _strides_of(layout: tuple):
    """The strides of a `results` item, None for a contiguous one (the generated out= checks)."""
    return layout[2] if len(layout) > 2 else None


def traced(tensor) -> bool:
    """Whether a call whose first tensor argument is `tensor` must go through its torch.library op.

    True under torch.compile (Dynamo folds is_compiling() to True, so the other tests, which it could not
    trace, are never reached), for tensor subclasses other than nn.Parameter (FakeTensor, functional
    tensors) and while a dispatch mode is active (make_fx, FakeTensorMode, opcheck's schema check). A
    non-tensor first argument takes the eager route, whose validation raises the TypeError; a quantised tensor
    (data, sf) is judged by its data.
    """
    if type(tensor) is not _Tensor and isinstance(tensor, tuple) and tensor:
        tensor = tensor[0]
    return _is_compiling() or (
        isinstance(tensor, _Tensor) and (type(tensor) not in PLAIN_TENSOR_TYPES or _dispatch_modes() > 0)
    )


# traced's functions and type bound once (Dynamo knows is_compiling by identity, however it is reached): every public
# call runs traced, and these module-attribute lookups were a third of its cost.
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack


@dataclasses.dataclass(frozen=True)
class Arg:
    """One public argument and its contract (made by `tensor`, `out` and `scalar`)."""

    name: str
    kind: str  # 'tensor', 'quant', 'out', or a scalar kind: 'float' (finite), 'positive' (finite, > 0), 'bool', ...
    dtype: torch.dtype | tuple[torch.dtype, ...] | None = None
    dims: tuple[str, ...] | None = None  # shape symbols or expressions of them; None: any shape
    like: str | None = None  # the shape of that argument
    layout: str | None = None  # 'contiguous', or 'rows': last dimension contiguous, outer strides free
    aligned: bool | str = False  # True: 16-byte aligned, else ValueError; 'copied': the eager path copies it
    optional: bool = False  # None allowed (image_token_mask)
    written: str | None = None  # 'updated' or 'written' in place: the schema's (a!)
    parts: tuple[str, ...] | None = None  # a tuple argument's items: a quantised tensor's or out's ('data', 'sf')
    label: str | None = None  # the name in messages where it is not `name` (an item of a tuple: 'x[0]')
    sf_dtype: torch.dtype | tuple[torch.dtype, ...] | None = None  # a quantised tensor's scale dtype(s)
    fast_when_given: bool = False  # an optional written tensor the fast path takes when given (see `tensor`)

    @property
    def shown(self) -> str:
        return self.label or self.name


def tensor(
    name, dtype, dims=None, *, like=None, layout='contiguous', aligned=False, optional=False, written=None,
    fast_when_given=False,
):  # fmt: skip
    """A tensor argument: `dims` as 'T, hc + 1, H' (a symbol not seen before is bound from this tensor).

    fast_when_given (an optional written tensor): the fast path takes a call that gives it, when it is contiguous
    (layout 'rows': whatever its outer strides, the entry checks the last) and apart from every other tensor given
    (fast_ok checks both, by spans); the operator's fast-path key must then say
    whether it is given. Without it a call that gives the tensor takes the full path."""
    if fast_when_given and not (optional and written):
        raise ValueError(f'{name}: fast_when_given is for optional tensors written in place')
    return Arg(name, 'tensor', dtype, _dims(dims), like, layout, aligned, optional, written,
               fast_when_given=fast_when_given)  # fmt: skip


def out(name, dtype=None, dims=None, *, like=None, aligned=False):
    """The optional output buffer (the public signature's last argument): contiguous, apart from every input;
    dtype None: that of `like`; neither dims nor like: the shape and dtype the operator's `results` gives (and its
    strides instead of contiguity where `results` gives strides)."""
    return Arg(name, 'out', dtype, _dims(dims), like, 'contiguous', aligned, optional=True)


def outs(name, *parts):
    """The optional output buffers (the public signature's last argument), a tuple such as (data, sf): each
    contiguous, apart from every input and from the others, of the shape and dtype the operator's `results`
    gives (of its strides, where it gives strides, instead of contiguous)."""
    return Arg(name, 'out', layout='contiguous', optional=True, parts=parts)


def quant(name, dtype, dims=None, *, sf_dtype, plain=False, parts=('data', 'sf'), sf_layout='rows'):
    """A quantised tensor, the tuple (data, sf): data of `dtype` and `dims`, contiguous; sf of `sf_dtype` (or
    dtypes), its last dimension contiguous (sf_layout 'rows'; None: any strides, which the operator's `extra`
    checks, e.g. column-major scales), its shape the operator's `extra` checks (it depends on options).
    plain: a tensor alone is accepted too, as data with sf None (`extra` checks which dtypes go with which)."""
    return Arg(name, 'quant', dtype, _dims(dims), layout=sf_layout, optional=plain, parts=parts, sf_dtype=sf_dtype)


def scalar(name, kind, *, optional=False):
    """A Python value: kind 'float' (finite; ints converted), 'positive' (finite and > 0), 'bool', 'int', 'str',
    'ints' (a tuple of ints), or 'any' (checked by the operator's `extra`; no torch.library form carries it).
    optional: None allowed."""
    if kind not in _SCALAR_CHECKS:
        raise ValueError(f'scalar kind must be one of {sorted(_SCALAR_CHECKS)}, got {kind!r}')
    return Arg(name, kind, optional=optional)


def _items(a: Arg) -> list[Arg]:
    """The tensor arguments the check sees for a declared tensor or quantised tensor (its data and sf, named
    `<name>_<part>` in the generated code and `<name>[i]` in messages)."""
    if a.kind != 'quant':
        return [a]
    data, sf = (f'{a.name}_{p}' for p in a.parts)
    return [
        Arg(data, 'tensor', a.dtype, a.dims, layout='contiguous', label=f'{a.name}[0]' if not a.optional else a.name),
        Arg(sf, 'tensor', a.sf_dtype, layout=a.layout, optional=a.optional, label=f'{a.name}[1]'),
    ]


def _dims(dims: str | None) -> tuple[str, ...] | None:
    return None if dims is None else tuple(d.strip() for d in dims.split(','))


class Launchers:
    """The launchers of one kernel (`choose_config`, `get_kernel`), made once per key: every operator's (an
    Operator is one) and those of the plain-code calls the mechanism does not declare (randn,
    batched_transpose_weight_sf, the fused kernel of mhc_multilayer_recompute). Making one queries no device and
    compiles nothing."""

    def __init__(self, choose_config: Callable, get_kernel: Callable) -> None:
        self._choose_config = choose_config
        self._get_kernel = get_kernel
        self._launchers: dict[tuple, Launcher] = {}

    def launcher(self, backend: str | None, device: torch.device, **choice) -> Launcher:
        """The launcher of the configuration `choose_config(backend=, num_cores=, **choice)` on `device`: chosen
        (one core-count query) and made on the first call with these values, looked up after. The core count is
        the device's, fixed for a process; the kernel compiles on the launcher's first launch. backend None: the
        device's, from require_accelerator when the launcher is made (the device guard, RuntimeError, of a call
        that has no tensor to check before)."""
        key = (device, backend, *choice.items())
        launcher = self._launchers.get(key)
        if launcher is None:
            if backend is None:
                backend = config.require_accelerator(torch.empty(0, device=device))
            cfg = self._choose_config(backend=backend, num_cores=get_num_cores(device), **choice)
            launcher = self._launchers[key] = Launcher(self._get_kernel, cfg, device)
        return launcher


class Operator(Launchers):
    """One public operator's shared machinery, made from its declaration (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *args: Arg,
        choose_config: Callable,
        get_kernel: Callable,
        choice: Callable | None = None,
        limits: Callable | None = None,
        extra: Callable | None = None,
        shape_from: str | None = None,
        results: Callable | None = None,
        label: str | None = None,
    ) -> None:
        if name in OPERATORS:
            raise ValueError(f'operator {name!r} is declared twice')
        self.name = name
        # The name its errors give: another operator's, for a form that a public function routes to (`quantised`).
        self.label = label or name
        self.args = args
        self._results = results
        self._arg_names = [a.name for a in args]
        self._results_params = [] if results is None else list(inspect.signature(results).parameters)
        # the position of the out argument (None: none), the last one or followed by scalars only
        self.out_index = next((i for i, a in enumerate(args) if a.kind == 'out'), None)
        super().__init__(choose_config, get_kernel)
        self.fast: dict = {}
        # torch.library op name -> its OpOverload, in the order the forms were defined
        self.forms: dict[str, torch._ops.OpOverload] = {}
        self._signature: inspect.Signature | None = None
        if args:
            _generate(self, choice, limits, extra, shape_from, results)
        OPERATORS[name] = self

    def remember(self, key, launcher: Launcher, value=None) -> None:
        """Let the fast path find `launcher` (or `value`, an entry that carries it) by `key`, where its entry
        checks every tensor argument (Launcher.checks_arguments; known once it has launched)."""
        if launcher.checks_arguments:
            self.fast[key] = launcher if value is None else value

    def prepare(self, key, args: tuple) -> tuple[Launcher, bool]:
        """(launcher, fast) of a call with the public arguments `args`: the fast path's launcher remembered under
        `key` (None: the call may not take the fast path), else the checked plan's. For eager paths that follow
        the common shape: prepare, allocate, `finish`."""
        launcher = self.fast.get(key) if key is not None else None
        if launcher is not None:
            return launcher, True
        return self.plan(*args), False

    def finish(self, launcher: Launcher, fast: bool, key, launch_args: tuple, args: tuple, *, empty: bool) -> None:
        """Launch what `prepare` gave: the fast path's checked launch, or the planned launch, remembered under
        `key` for the next call. An empty input launches nothing (a grid of no blocks is a launch error); on the
        fast path it gets the full checks, which its launch would otherwise have made."""
        if empty:
            if fast:
                self.check(*args)
        elif fast:
            self.launch(launcher, launch_args, args)
        else:
            launcher.launch(*launch_args)
            if key is not None:
                self.remember(key, launcher)

    def launch(self, launcher: Launcher, args: tuple, check_args: tuple) -> None:
        """The fast path's launch, which left the layout checks to a launcher whose entry checks its arguments:
        when the entry rejects them, `self.check(*check_args)` raises the contract's typed error naming the
        argument; if it finds nothing wrong, the entry's own error stands. The entry checks before it launches
        anything, so a rejected call has no effect. (The check's arguments come apart from `args` so that a call
        builds no closure, which would also turn the caller's locals into cells; as one tuple, not spread: in
        CPython 3.11 the call of a function of *varargs with spread arguments measured about 0.4 us more.)"""
        try:
            launcher.launch(*args)
            return
        except Exception as exc:  # re-raised below unless the contract names the fault
            error = exc
        self.check(*check_args)
        raise error

    def public(
        self, eager: Callable, *, returns: str = '()', result=None, fake: Callable | None = None, traced=None,
        batched: Callable | None = None, quantised: Callable | None = None,
    ):  # fmt: skip
        """Decorator of the public function's stub, whose signature (the declared arguments, in order) and docstring
        it keeps; the body is not run. The public function calls `eager` with every argument, positionally, or,
        while torch traces, after the memory-free check, `traced` (default: the torch.library forms made here
        from the declaration, whose
        functional form returns `returns`, a schema type, and whose `<name>_out` form takes `out=`). `fake` makes
        the functional form's outputs from the public arguments (after the memory-free check); `result`, a
        NamedTuple type, wraps a tuple that the forms return, or, for `returns='()'`, the written tensors.
        `batched(function, *args)`, where given, takes a call whose first tensor has one dimension more than
        declared (a batch of token rows, as the peer's 3-D calls): it calls `function`, the public function, on
        views of the rows and gives the results their batch dimension back (see `batch_rows`). `quantised`, where
        given, takes a call whose first argument is a quantised tensor, a tuple (data, sf), in place of a tensor (the
        peer's pre-quantised inputs): another operator's public function of the same signature."""

        def declare(stub: Callable) -> Callable:
            self._signature = inspect.signature(stub)
            names = list(self._signature.parameters)
            if self.args and names != [a.name for a in self.args]:
                raise ValueError(f'{self.name}: the declared arguments {[a.name for a in self.args]} are not {names}')
            rank = None
            if batched is not None:
                dims = self.args[0].dims if self.args else None
                if dims is None:
                    raise ValueError(f'{self.name}: batched needs the first argument declared with its dims')
                rank = len(dims) + 1
            call = self._define_forms(eager, returns, result, fake) if traced is None else self._checked(traced)
            function = _public_function(stub, names, eager, call, batched, rank, quantised)
            function.operator = self
            return function

        return declare

    def config(self, *args, **kwargs):
        """The kernel configuration the public function launches for these arguments (checked alike, no launch)."""
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return self.plan(**bound.arguments).cfg

    def define(self, form: str, schema: str, kernel: Callable, fake: Callable) -> torch._ops.OpOverload:
        """Register `cann_ops_tilelang::<form>` with `schema` ('(Tensor x, Tensor(a!) out) -> ()'): `kernel` runs it
        on real tensors (the operator's eager path; what it returns is dropped where the schema returns nothing),
        `fake` while torch traces. Returns its OpOverload."""
        written = tuple(_WRITTEN.findall(schema))
        # The eager path returns the buffer it wrote; an op whose schema returns nothing must return None.
        if schema.replace(' ', '').endswith('->()'):
            eager = kernel

            def kernel(*args) -> None:
                eager(*args)

        custom = torch.library.custom_op(f'{NAMESPACE}::{form}', kernel, mutates_args=written, schema=schema)
        custom.register_fake(fake)
        overload = custom._opoverload
        if not written:
            # As in eager, where the kernels write tensors autograd never sees, no output of a functional op
            # requires grad even when an input (a weight parameter) does, so AOTAutograd traces no backward
            # through it. torch takes autograd formulas for functional ops only: a form that writes an input
            # keeps torch's default, whose outputs require grad where an input does and raise on backward.
            torch.library.register_autograd(overload, _no_backward, setup_context=_mark_non_differentiable)
        self.forms[form] = overload
        return overload

    def _checked(self, traced: Callable) -> Callable:
        """An operator's own traced call (the forms it defined with `define`), after the memory-free check."""

        def call(*args):
            self.check(*args, memory=False)
            return traced(*args)

        return call

    def _define_forms(self, eager: Callable, returns: str, result, fake: Callable | None) -> Callable:
        """The functional form (and `<name>_out` with an `out` argument) from the declaration; returns the traced
        call: the memory-free check, then the form the arguments take. A quantised tensor (data, sf) is two tensor
        arguments of the forms, a tuple of output buffers one written tensor each; the functional form of an
        operator with such buffers returns their tuple."""
        at = self.out_index
        out_arg = self.args[at] if at is not None else None
        inputs = [a for a in self.args if a is not out_arg]
        opaque = [a.name for a in inputs if a.kind == 'any']
        if opaque:
            raise ValueError(f'{self.name}: no torch.library form can carry {opaque} (kind "any"): pass `traced`')
        letters = iter('abcdefgh')
        params = []
        for a in inputs:
            if a.kind in ('tensor', 'quant'):
                params += [
                    # torch's schema grammar: the alias annotation before the '?' of an optional tensor
                    f'Tensor{f"({next(letters)}!)" if t.written else ""}{"?" if t.optional else ""} {t.name}'
                    for t in _items(a)
                ]
            else:
                params.append(f'{_SCHEMA_TYPES[a.kind]}{"?" if a.optional else ""} {a.name}')
        parts = out_arg.parts if out_arg else None
        if parts:
            returns = f'({", ".join(["Tensor"] * len(parts))})'
        floats = {i for i, a in enumerate(inputs) if a.kind in ('float', 'positive')}
        pairs = {i for i, a in enumerate(inputs) if a.kind == 'quant'}
        written = [i for i, a in enumerate(inputs) if a.written]

        def flat(args) -> list:
            """The public inputs as the forms' arguments."""
            values = []
            for i, value in enumerate(args):
                if i in pairs:
                    values += (value, None) if isinstance(value, torch.Tensor) else value
                else:
                    values.append(float(value) if i in floats and value is not None else value)  # ints accepted
            return values

        def public(values) -> list:
            """The forms' arguments as the public inputs (a pair where the public call has a quantised tensor)."""
            if not pairs:
                return list(values)
            values, args = iter(values), []
            for i in range(len(inputs)):
                if i in pairs:
                    data, sf = next(values), next(values)
                    args.append(data if sf is None else (data, sf))
                else:
                    args.append(next(values))
            return args

        def with_out(args, buffers) -> list:
            """The public arguments of a call: the inputs with the out argument at its place."""
            args = list(args)
            if out_arg:
                args.insert(at, buffers)
            return args

        def fake_outputs(*values):
            args = with_out(public(values), None)
            self.check(*args, memory=False)
            if fake is None and self._results is not None:
                first = next(t for t in values if isinstance(t, torch.Tensor))
                outputs = self.new_outputs(first, *args)
                return outputs if parts else outputs[0]
            return None if fake is None else fake(*args)

        def kernel(*values):
            value = eager(*with_out(public(values), None))
            return tuple(value) if parts else value

        functional = self.define(self.name, f'({", ".join(params)}) -> {returns}', kernel, fake_outputs)
        if out_arg:
            names = [f'{out_arg.name}_{p}' for p in parts] if parts else [out_arg.name]
            buffers = ', '.join(f'Tensor({next(letters)}!) {n}' for n in names)
            count = len(names)

            def into(*values):
                args, buffers = public(values[:-count]), values[-count:]
                return eager(*with_out(args, buffers if parts else buffers[0]))

            def into_fake(*values):
                self.check(*with_out(public(values[:-count]), values[-count:] if parts else values[-1]), memory=False)

            into_out = self.define(f'{self.name}_out', f'({", ".join(params)}, {buffers}) -> ()', into, into_fake)

        def call(*args):
            self.check(*args, memory=False)
            rest = args[:at] + args[at + 1 :] if out_arg else args
            if out_arg and args[at] is not None:
                buffers = args[at]
                into_out(*flat(rest), *(buffers if parts else (buffers,)))
                return result(*buffers) if parts and result is not None else buffers
            value = functional(*flat(rest))
            if returns == '()':
                value = tuple(args[i] for i in written)
                return value[0] if result is None and len(value) == 1 else result(*value)
            return result(*value) if result is not None else value

        return call

    def results(self, *args, **kwargs) -> tuple:
        """((shape, dtype), ...) of the output buffers of a call with these public arguments, from the declaration's
        `results` (the operator's eager path allocates from it, the fake kernels and the out= check read it); an
        item (shape, dtype, strides) is a buffer of those strides."""
        values = dict(zip(self._arg_names, args, strict=False)) | kwargs
        return self._results(**{p: values[p] for p in self._results_params})

    def new_outputs(self, like: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, ...]:
        """New output buffers of a call with these public arguments on `like`'s device, of the layouts `results`
        gives (new_output): what the eager path allocates and the fake kernels return, so both have one layout."""
        return tuple(new_output(like, layout) for layout in self.results(*args, **kwargs))


def _public_function(
    stub: Callable, names: list[str], eager: Callable, call: Callable, batched: Callable | None = None,
    batched_rank: int | None = None, quantised: Callable | None = None,
) -> Callable:  # fmt: skip
    """The public function with the stub's signature: `traced(first)` picks `call`, else `eager` (generated, so a
    call costs what the hand-written `if traced(x): ...; return _eager(x, ...)` costs); with `batched`, a first
    tensor of `batched_rank` dimensions goes to it first; with `quantised`, a first argument that is a tuple."""
    namespace = {'traced': traced, '_traced_call': call, '_eager': eager, '_batched': batched, '_Tensor': torch.Tensor,
                 '_quantised': quantised}  # fmt: skip
    params, keyword_only, passed = [], False, []
    for i, p in enumerate(inspect.signature(stub).parameters.values()):
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            params.append('*')
            keyword_only = True
        passed.append(f'{p.name}={p.name}' if keyword_only else p.name)
        if p.default is p.empty:
            params.append(p.name)
        else:
            namespace[f'_default{i}'] = p.default
            params.append(f'{p.name}=_default{i}')
    args = ', '.join(names)
    batch = ''
    if batched is not None:
        batch = (
            f'    if isinstance({names[0]}, _Tensor) and {names[0]}.dim() == {batched_rank}:\n'
            f'        return _batched({stub.__name__}, {", ".join(names)})\n'
        )
    if quantised is not None:
        batch += (
            f'    if type({names[0]}) is not _Tensor and isinstance({names[0]}, tuple):\n'
            f'        return _quantised({", ".join(passed)})\n'
        )
    source = (
        f'def {stub.__name__}({", ".join(params)}):\n'
        f'{batch}'
        f'    if traced({names[0]}):\n'
        f'        return _traced_call({args})\n'
        f'    return _eager({args})\n'
    )
    exec(source, namespace)  # generated from the stub's parameter names only
    function = namespace[stub.__name__]
    for attribute in ('__doc__', '__module__', '__qualname__', '__annotations__'):
        setattr(function, attribute, getattr(stub, attribute))
    return function


def _injected(function: Callable, available: dict[str, str], what: str, op: str) -> str:
    """'p=<expression>, ...' for each parameter of `function` (a declared hook), from `available`."""
    parts = []
    for p in inspect.signature(function).parameters:
        if p not in available:
            raise ValueError(f'{op}: {what} takes {p!r}, which is not one of {sorted(available)}')
        parts.append(f'{p}={available[p]}')
    return ', '.join(parts)


def _generate(op: Operator, choice, limits, extra, shape_from, results) -> None:
    """op.check, op.plan and op.fast_ok from op.args (see the module docstring)."""
    args = op.args
    names = [a.name for a in args]
    tensors = [t for a in args if a.kind in ('tensor', 'quant') for t in _items(a)]
    outputs = [a for a in args if a.kind == 'out']
    if len(outputs) > 1 or (outputs and any(a.kind in ('tensor', 'quant') for a in args[op.out_index :])):
        raise ValueError(f'{op.name}: one out argument at most, after every tensor (only scalars may follow it)')
    if outputs and results is None and (outputs[0].parts or (outputs[0].dims is None and outputs[0].like is None)):
        raise ValueError(f'{op.name}: output buffers without dims need `results`, their shapes and dtypes')
    first = tensors[0].name
    namespace = {
        '_op': op,
        '_name': op.label,
        '_limits': limits,
        '_extra': extra,
        '_choice': choice,
        '_results': results,
        '_strides_of': _strides_of,
        'torch': torch,
        '_PLAIN': PLAIN_TENSOR_TYPES,
        '_INF': math.inf,
        '_config': config,  # its require_accelerator looked up per call (tests fake a device there)
        **{f: getattr(validation, f) for f in dir(validation) if f.startswith(('check_', 'may_overlap', 'span_'))},
    }
    params = ', '.join(names)
    body = []

    def guarded(a: Arg, statement: str) -> str:
        if not a.optional:
            return statement
        if statement.startswith('if '):
            return f'if {a.name} is not None and {statement[3:]}'
        return f'if {a.name} is not None: {statement}'

    # quantised tensors' items; types, dtypes and ranks
    for a in args:
        if a.kind == 'quant':
            items = ', '.join(t.name for t in _items(a))
            if a.optional:  # a tensor alone is the data, without sf
                body.append(f'if isinstance({a.name}, torch.Tensor): {items} = {a.name}, None')
                body.append(f'else: {items} = check_parts({a.name!r}, {a.name}, {a.parts!r})')
            else:
                body.append(f'{items} = check_parts({a.name!r}, {a.name}, {a.parts!r})')
    for a in tensors:
        namespace[f'_dtype_{a.name}'] = a.dtype
        ndim = None if a.dims is None else len(a.dims)
        body.append(guarded(a, f'check_tensor({a.shown!r}, {a.name}, dtype=_dtype_{a.name}, ndim={ndim})'))
    # shape symbols, bound from shape_from first, then from the tensors in order; the limits on them
    symbols, bound_whole = {}, set()
    for a in sorted(tensors, key=lambda a: a.name != shape_from):
        if a.optional or a.dims is None:
            continue
        fresh = [(i, d) for i, d in enumerate(a.dims) if d.isidentifier() and d not in symbols]
        for i, d in fresh:
            symbols[d] = d
            body.append(f'{d} = {a.name}.shape[{i}]')
        if len(fresh) == len(a.dims):
            bound_whole.add(a.name)
    if limits is not None:
        body.append(f'_limits({_injected(limits, symbols | {"name": "_name"}, "limits", op.name)})')

    def shape_of(a: Arg) -> str | None:
        if a.dims is not None:
            return f'({", ".join(a.dims)},)'
        return None if a.like is None else f'{a.like}.shape'

    for a in tensors:
        shape = shape_of(a)
        if shape is not None and a.name not in bound_whole:
            body.append(guarded(a, f'if {a.name}.shape != {shape}: check_shape({a.shown!r}, {a.name}, {shape})'))
    # layouts, alignment, scalars
    for a in tensors:
        if a.layout == 'contiguous':
            body.append(guarded(a, f'if not {a.name}.is_contiguous(): check_contiguous({a.shown!r}, {a.name})'))
        elif a.layout == 'rows':
            body.append(guarded(a, f'check_last_dim_contiguous({a.shown!r}, {a.name})'))
    # (Addresses are read once; a check function runs only to raise. Fake tensors, memory=False, have none.)
    spans = [a for a in tensors if (a.aligned is True or any(t.written for t in tensors)) and not a.optional]
    if spans:
        body.append('if memory:')
        body += [f'    {a.name}_at = {a.name}.data_ptr()' for a in spans]
    for a in tensors:
        if a.aligned is True:
            test = f'{a.name}_at % {ALIGN_BYTES}' if a in spans else f'{a.name}.data_ptr() % {ALIGN_BYTES}'
            body.append(guarded(a, f'if memory and {test}: check_aligned({a.shown!r}, {a.name})'))
    for a in args:
        if _SCALAR_CHECKS.get(a.kind):
            body.append(guarded(a, f'{a.name} = {_SCALAR_CHECKS[a.kind]}({a.name!r}, {a.name})'))
    available = (
        {n: n for n in names} | {t.name: t.name for t in tensors} | symbols | {'memory': 'memory', 'name': '_name'}
    )
    if extra is not None:
        body.append(f'_extra({_injected(extra, available, "extra", op.name)})')
    # out=, then the tensors written in place apart from the others
    inputs = '{' + ', '.join(f'{a.shown!r}: {a.name}' for a in tensors)
    for a in outputs:
        body.append(f'if {a.name} is not None:')
        if a.parts:  # a tuple of buffers, each of the shape and dtype `results` gives, apart from the ones before
            items = [f'{a.name}_{p}' for p in a.parts]
            body.append(f'    {", ".join(items)} = check_parts({a.name!r}, {a.name}, {a.parts!r})')
            body.append(f'    _layout = _results({_injected(results, {n: n for n in names}, "results", op.name)})')
            for i, item in enumerate(items):
                body.append(
                    f'    check_out({f"{a.name}[{i}]"!r}, {item}, shape=_layout[{i}][0], dtype=_layout[{i}][1], '
                    f'device={first}.device, inputs={inputs}}}, memory=memory, strides=_strides_of(_layout[{i}]))'
                )
                inputs += f', {f"{a.name}[{i}]"!r}: {item}'
            continue
        namespace[f'_dtype_{a.name}'] = a.dtype
        dtype = f'_dtype_{a.name}' if a.dtype is not None else f'{a.like}.dtype'
        shape = shape_of(a)
        strides = ''
        if shape is None:  # neither dims nor like: the layout `results` gives
            body.append(f'    _layout, = _results({_injected(results, {n: n for n in names}, "results", op.name)})')
            shape, dtype, strides = '_layout[0]', '_layout[1]', ', strides=_strides_of(_layout)'
        body.append(
            f'    check_out({a.name!r}, {a.name}, shape={shape}, dtype={dtype}, device={first}.device, '
            f'inputs={inputs}}}, memory=memory{strides})'
        )
        if a.aligned is True:
            body.append(f'    check_aligned({a.name!r}, {a.name}, memory=memory)')
    written = [a for a in tensors if a.written]
    for w in written:
        for o in tensors:
            if o is w or (o.written and tensors.index(o) < tensors.index(w)):
                continue
            if o.written:
                message = f'{{_name}}: {w.shown} and {o.shown} must not overlap'
            else:
                message = f'{{_name}}: {w.shown} ({w.written} in place) must not alias the input {o.shown}'
            if o in spans and w in spans and w.layout == o.layout == 'contiguous':  # checked contiguous: one span each
                w_at, o_at = f'{w.name}_at', f'{o.name}_at'
                meet = f'{w_at} < {o_at} + {o.name}.nbytes and {o_at} < {w_at} + {w.name}.nbytes'
                test = f'({meet} and {w.name}.device == {o.name}.device if memory else {w.name} is {o.name})'
            else:
                test = ''.join(f'{t.name} is not None and ' for t in (w, o) if t.optional)
                test += f'may_overlap({w.name}, {o.name}, memory=memory)'
            body.append(f'if {test}: raise ValueError(f{message!r})')
    devices = [f'*(() if {a.name} is None else ({a.name},))' if a.optional else a.name for a in tensors]
    devices += [
        f'*(() if {a.name} is None else {a.name})' if a.parts else f'*(() if {a.name} is None else ({a.name},))'
        for a in outputs
    ]
    body.append(f'backend = _config.require_accelerator({", ".join(devices)})')

    source = f'def check({params}, *, memory=True):\n' + ''.join(f'    {line}\n' for line in body)
    source += '    return backend\n'
    device = {'backend': 'backend', 'device': f'{first}.device'}
    choose = ''
    if choice is not None:
        choose = f', **_choice({_injected(choice, {n: n for n in names} | device, "choice", op.name)})'
    source += f'def plan({params}):\n    backend = _op.check({params})\n'
    if args[0].kind == 'quant':
        source += f'    {first} = {args[0].name} if isinstance({args[0].name}, torch.Tensor) else {args[0].name}[0]\n'
    source += f'    return _op.launcher(backend, {first}.device{choose})\n'
    source += _fast_ok_source(args, tensors, outputs, written, params, limits)
    exec(source, namespace)  # generated from the declaration's names only
    op.check, op.plan, op.fast_ok = namespace['check'], namespace['plan'], namespace['fast_ok']
    op.source = source  # what the declaration generated (for readers and tests)


def _fast_ok_source(args, tensors, outputs, written, params, limits=None) -> str:
    """fast_ok: the fast path's Python checks (see the module docstring). It returns the first tensor's shape
    where the fast path may go on (the operator's key reads it), None otherwise. `limits` is called too where it
    reads the first tensor's first dimension and the first tensor's shape gives all its symbols (a size past
    them: None, and the full path raises): operators key their fast path by the other sizes, not by the token
    count."""
    first = tensors[0]
    tests = [f'{a.name} is None' for a in outputs]
    # An optional tensor written in place, when given, takes the full path (its overlap checks), unless it is
    # declared fast_when_given: then the lines after the main test check it.
    tests += [f'{a.name} is None' for a in written if a.optional and not a.fast_when_given]
    tests += [
        f'({a.name} is None or type({a.name}) in _PLAIN)' if a.optional else f'type({a.name}) in _PLAIN'
        for a in tensors
    ]
    tests.append(f'{first.name}.is_cuda')
    if first.dims is not None:
        tests.append(f'{first.name}.dim() == {len(first.dims)}')
    for a in args:
        if a.kind in _FAST_TESTS:
            test = _FAST_TESTS[a.kind].format(a.name)
            tests.append(f'({a.name} is None or {test})' if a.optional else test)
        elif a.kind in ('float', 'positive'):
            low = '0.0' if a.kind == 'positive' else '-_INF'
            test = f'type({a.name}) is float and {low} < {a.name} < _INF'
            tests.append(f'({a.name} is None or {test})' if a.optional else test)
    lines = [f'def fast_ok({params}):']
    for a in args:  # a quantised tensor: a pair, unpacked into its items
        if a.kind == 'quant':
            items = ', '.join(t.name for t in _items(a))
            test = f'if not isinstance({a.name}, tuple) or len({a.name}) != 2:'
            if a.optional:  # a plain tensor is the data alone
                lines += [f'    if type({a.name}) in _PLAIN:', f'        {items} = {a.name}, None', '    else:']
                lines += [f'        {test}', '            return None', f'        {items} = {a.name}']
            else:
                lines += [f'    {test}', '        return None', f'    {items} = {a.name}']
    lines += [f'    if not ({" and ".join(tests)}):', '        return None']
    lines.append(f'    shape = {first.name}.shape')
    symbols = [d for d in first.dims or () if d.isidentifier()]
    whole = bool(symbols) and len(symbols) == len(first.dims)
    limit_params = list(inspect.signature(limits).parameters) if limits is not None else []
    # Only limits that read the first dimension (the token count, dynamic: keys leave it out) are called here.
    checks_limits = (
        limits is not None and whole and symbols[0] in limit_params and set(limit_params) <= set(symbols) | {'name'}
    )
    if whole and (written or checks_limits):
        lines.append(f'    {", ".join(symbols)}, = shape')
    if checks_limits:
        values = ['_name' if p == 'name' else p for p in limit_params]
        # positionally where the parameters allow it (a keyword call costs more)
        positional = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in inspect.signature(limits).parameters.values())
        call = ', '.join(values if positional else (f'{p}={v}' for p, v in zip(limit_params, values, strict=True)))
        lines += ['    try:', f'        _limits({call})', '    except ValueError:', '        return None']
    # addresses: of the aligned tensors, and with a written tensor, of every tensor it must stay apart from
    used = [a for a in tensors if a.aligned or (written and not a.optional)]
    addresses = [f'{a.name}_at = {a.name}.data_ptr()' for a in used]
    if written:
        addresses += [f'{a.name}_end = {a.name}_at + {_end_bytes(a, set(symbols) if whole else set())}' for a in used]
    faults = []
    aligned = [a.name for a in used if a.aligned]
    if aligned:
        faults.append(f'({" | ".join(f"{n}_at" for n in aligned)}) % {ALIGN_BYTES}')
    for w in written:
        for o in tensors:
            if o is w or w.optional or (o.written and (o.optional or tensors.index(o) < tensors.index(w))):
                continue  # an optional written tensor: None on the fast path, or checked when given (below)
            if o.optional:  # an optional input: apart from the written tensor when given
                faults.append(
                    f'({o.name} is not None and {o.name}.data_ptr() < {w.name}_end and '
                    f'{w.name}_at < {o.name}.data_ptr() + {_end_bytes(o)})'
                )
            else:
                faults.append(f'({w.name}_at < {o.name}_end and {o.name}_at < {w.name}_end)')
    # The addresses are read where a test needs them: first where the lines below test them for every call, else
    # only in the block of each fast_when_given tensor that a call gives (a call that gives none reads none).
    if faults:
        lines += [f'    {line}' for line in addresses]
        lines += [f'    if {" or ".join(faults)}:', '        return None']
        addresses = []
    lines += _fast_given_lines(tensors, written, used, addresses)
    lines.append('    return shape')
    return '\n'.join(lines) + '\n'


def _fast_given_lines(tensors, written, used, addresses=()) -> list[str]:
    """fast_ok's lines for the fast_when_given tensors that a call gives: contiguous (a 'rows' tensor: any outer
    strides, its span measured), and apart from every other tensor given (spans from data_ptr and _end_bytes).
    `addresses`: the lines that read the spans of `used`, where no line before read them."""
    lines = []
    for w in (a for a in written if a.fast_when_given):
        lines.append(f'    if {w.name} is not None:')
        if w.layout == 'contiguous':
            lines += [f'        if not {w.name}.is_contiguous():', '            return None']
        lines += [f'        {line}' for line in addresses]
        lines += [
            f'        {w.name}_at = {w.name}.data_ptr()',
            f'        {w.name}_end = {w.name}_at + {_end_bytes(w)}',
        ]
        meets = []
        for o in tensors:
            if o is w:
                continue
            if o in used:
                meets.append(f'({w.name}_at < {o.name}_end and {o.name}_at < {w.name}_end)')
            elif o.optional:
                meets.append(
                    f'({o.name} is not None and {o.name}.data_ptr() < {w.name}_end and '
                    f'{w.name}_at < {o.name}.data_ptr() + {_end_bytes(o)})'
                )
        if meets:
            lines += [f'        if {" or ".join(meets)}:', '            return None']
    return lines


def _end_bytes(a: Arg, symbols: frozenset[str] | set[str] = frozenset()) -> str:
    """fast_ok's expression of a tensor's bytes from its first: of its declared shape where the first tensor's
    symbols give it (no property call; a tensor of another shape is the entry's to refuse, before any launch), else
    nbytes; a 'rows' tensor's span (span_bytes), which its gaps between rows make more than nbytes."""
    if a.layout != 'contiguous':
        return f'span_bytes({a.name})'
    return _declared_bytes(a, set(symbols)) or f'{a.name}.nbytes'


def _declared_bytes(a: Arg, symbols: set[str]) -> str | None:
    """'itemsize * (d0) * (d1)...' of a tensor of one dtype whose dims use only `symbols`, else None."""
    if a.dims is None or not isinstance(a.dtype, torch.dtype):
        return None
    names = set(re.findall(r'[A-Za-z_]\w*', ' '.join(a.dims)))
    if not names <= symbols:
        return None
    return ' * '.join([str(a.dtype.itemsize), *(f'({d})' for d in a.dims)])


def _mark_non_differentiable(ctx, inputs, output) -> None:
    outputs = output if isinstance(output, (tuple, list)) else (output,)
    tensors = [t for t in outputs if isinstance(t, torch.Tensor)]
    if tensors:
        ctx.mark_non_differentiable(*tensors)


def _no_backward(ctx, *grads):
    raise RuntimeError(
        'the cann_ops_tilelang operators are not differentiated by autograd: their gradients are explicit '
        'operators (e.g. engram_gate_bwd, engram_grad_w_reduce)'
    )
