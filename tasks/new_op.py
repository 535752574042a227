"""`invoke new-op <domain>/<operator> [--public]`: scaffold an operator (cann_ops_pipeline.scaffold)."""

from __future__ import annotations

from pathlib import Path

from invoke import Exit, task

from cann_ops_pipeline import scaffold
from cann_ops_pipeline.conventions import USAGE_ERROR

ROOT = Path(__file__).resolve().parents[1]


@task(
    help={
        'name': '<domain>/<operator>, e.g. foo/foo_bar (snake_case, the operator starts with "<domain>_")',
        'public': 'also export it from the root package cann_ops_tilelang (stable operators only)',
        'dry_run': 'check everything and list the files, write nothing',
        'root': 'repository root to write into (default: this repository)',
    }
)
def new_op(c, name, public=False, dry_run=False, root=''):
    """Scaffold a new operator: interface, Ascend + CUDA kernels, reference, tests (a working copy example)."""
    target = Path(root).resolve() if root else ROOT
    try:
        plan = scaffold.plan_operator(target, name, public=public)
    except scaffold.ScaffoldError as error:
        raise Exit(f'new-op: {error}', code=USAGE_ERROR) from None
    if not dry_run:
        try:
            scaffold.apply_plan(plan)
        except scaffold.ScaffoldError as error:  # the tree changed since planning: nothing written
            raise Exit(f'new-op: {error}', code=USAGE_ERROR) from None
        except OSError as error:
            raise Exit(
                f'new-op: writing failed ({error}); rolled back: the files it had created are removed and the '
                'edited ones restored, the tree is as before',
                code=1,
            ) from None
    verb = 'would ' if dry_run else ''
    for path in plan.created:
        print(f'{verb}create  {path}')
    for path in plan.edited:
        print(f'{verb}edit    {path}')
    if not dry_run:
        print('\nnext:')
        for step in scaffold.next_steps(plan):
            print(f'  {step}')
