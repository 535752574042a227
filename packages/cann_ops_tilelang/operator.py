"""The operator mechanism: what every public operator needs, written once, and declared to by each operator.

An operator's `<op>.py` makes one `Operator` and declares to it:

- `check`: its contract, `check(<the public arguments>, *, memory=True)`, raising the typed errors
  (validation.py) and returning what the operator needs from valid arguments (at least the backend);
  memory=False is the same check on fake tensors while torch traces (alignment and overlap wait for the
  real tensors, see validation.may_overlap).
- `choose_config` and `get_kernel` from `<op>_kernel.py`: `Operator.launcher` chooses a configuration
  once per (device, backend, choice) and keeps its `kernel_target.Launcher` (one cache per operator).
- `plan`, through `@OP.public(plan)` on the public function: the launcher a call with these public
  arguments uses, after its checks. `Operator.config` (what the tests ask for) binds any call's arguments
  to the public signature and returns that launcher's configuration: no per-operator query function.
- its torch.library ops, `Operator.define(form, schema, kernel, fake)`: one per calling form whose
  aliasing torch must know statically (functional, `out=`, in place); mutated arguments come from the
  schema's `(a!)` annotations, functional forms get the no-backward autograd formula.

What stays in the operator's file, in plain code: the eager path (the fast path's key and what it checks
before trusting a launcher's entry, the allocation of outputs, special cases such as empty inputs), the
traced path (which form a call takes) and the fake kernels. The fast path's table is `Operator.fast`:
launchers whose compiled entry checks every tensor argument itself (`Launcher.checks_arguments`), found
by a key the operator computes without the full checks, and launched with `Operator.launch`, which has
`Operator.check` explain a launch the entry rejects.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import torch

from cann_ops_tilelang.config import get_num_cores
from cann_ops_tilelang.kernel_target import Launcher
from cann_ops_tilelang.validation import PLAIN_TENSOR_TYPES

NAMESPACE = 'cann_ops_tilelang'
# Every declared operator by its public name (the tests walk it: forms, signatures, configurations).
OPERATORS: dict[str, Operator] = {}
_WRITTEN = re.compile(r'Tensor\(\w!\)\??\s+(\w+)')


def traced(tensor) -> bool:
    """Whether a call whose first tensor argument is `tensor` must go through its torch.library op.

    True under torch.compile (Dynamo folds is_compiling() to True, so the other tests, which it could not
    trace, are never reached), for tensor subclasses other than nn.Parameter (FakeTensor, functional
    tensors) and while a dispatch mode is active (make_fx, FakeTensorMode, opcheck's schema check). A
    non-tensor first argument takes the eager route, whose validation raises the TypeError.
    """
    return torch.compiler.is_compiling() or (
        isinstance(tensor, torch.Tensor)
        and (type(tensor) not in PLAIN_TENSOR_TYPES or torch._C._len_torch_dispatch_stack() > 0)
    )


class Operator:
    """One public operator's shared machinery: launcher cache, fast-path table, torch.library forms, config query."""

    def __init__(self, name: str, check: Callable, choose_config: Callable, get_kernel: Callable) -> None:
        if name in OPERATORS:
            raise ValueError(f'operator {name!r} is declared twice')
        self.name = name
        self.check = check
        self._choose_config = choose_config
        self._get_kernel = get_kernel
        self._launchers: dict[tuple, Launcher] = {}
        self.fast: dict = {}
        # torch.library op name -> its OpOverload, in the order the forms were defined
        self.forms: dict[str, torch._ops.OpOverload] = {}
        self._plan: Callable | None = None
        self._signature: inspect.Signature | None = None
        OPERATORS[name] = self

    def launcher(self, backend: str, device: torch.device, **choice) -> Launcher:
        """The launcher of the configuration `choose_config(backend=, num_cores=, **choice)` on `device`: chosen
        (one core-count query) and made on the first call with these values, looked up after. The core count is
        the device's, fixed for a process; the kernel compiles on the launcher's first launch."""
        key = (device, backend, *choice.items())
        launcher = self._launchers.get(key)
        if launcher is None:
            cfg = self._choose_config(backend=backend, num_cores=get_num_cores(device), **choice)
            launcher = self._launchers[key] = Launcher(self._get_kernel, cfg, device)
        return launcher

    def remember(self, key, launcher: Launcher, value=None) -> None:
        """Let the fast path find `launcher` (or `value`, an entry that carries it) by `key`, where its entry
        checks every tensor argument (Launcher.checks_arguments; known once it has launched)."""
        if launcher.checks_arguments:
            self.fast[key] = launcher if value is None else value

    def launch(self, launcher: Launcher, args: tuple, *check_args) -> None:
        """The fast path's launch, which left the layout checks to a launcher whose entry checks its arguments:
        when the entry rejects them, `self.check(*check_args)` raises the contract's typed error naming the
        argument; if it finds nothing wrong, the entry's own error stands. The entry checks before it launches
        anything, so a rejected call has no effect. (The check's arguments come apart from `args` so that a call
        builds no closure, which would also turn the caller's locals into cells.)"""
        try:
            launcher.launch(*args)
            return
        except Exception as exc:  # re-raised below unless the contract names the fault
            error = exc
        self.check(*check_args)
        raise error

    def public(self, plan: Callable[..., Launcher]) -> Callable[[Callable], Callable]:
        """Decorator of the public function: `plan(**its bound arguments)` returns the launcher a call uses (after
        the checks); the function gets an `operator` attribute (this object)."""

        def declare(function: Callable) -> Callable:
            self._plan, self._signature = plan, inspect.signature(function)
            function.operator = self
            return function

        return declare

    def config(self, *args, **kwargs):
        """The kernel configuration the public function launches for these arguments (checked alike, no launch)."""
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return self._plan(**bound.arguments).cfg

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
