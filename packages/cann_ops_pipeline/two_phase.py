"""The two-phase xdist test run: ordinary-memory tests with many workers, large_npu_mem tests with few.

    python -m cann_ops_pipeline.two_phase [--phase1-workers N] [--phase2-workers N] [--fail-fast]
                                          [--dry-run] [pytest args...] [-- pytest args...]

Phase 1 runs `-m 'not large_npu_mem'` with many workers (4 per device, or one per CPU without a
device), phase 2 runs `-m large_npu_mem` with one worker per device (1 without a device); a `-m`
among the pytest args is combined with the phase's expression by `and`. Arguments this runner does
not know go to both pytest runs unchanged, as does everything after `--`. Exit code 5 (no test
selected) does not fail a phase; a failing phase 1 still runs phase 2 unless --fail-fast (an
interrupted phase 1 stops the run). The exit code is 0 when no phase failed (5 when neither phase
ran a test), else the first failing phase's exit code.

Pure standard library. Devices are counted by cann_ops_pipeline.device_count (never by torch), and
the count is exported as OPS_TILELANG_DEVICE_COUNT so that both pytest runs bind workers alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from cann_ops_pipeline.device_count import DEVICE_COUNT_ENV, count_devices

LARGE_MARKER = 'large_npu_mem'
WORKERS_PER_DEVICE_PHASE1 = 4
WORKERS_PER_DEVICE_PHASE2 = 1
NO_TESTS = 5
INTERRUPTED = 2
EXIT_MEANING = {
    0: 'passed',
    1: 'tests failed',
    2: 'interrupted',
    3: 'internal error',
    4: 'usage error',
    5: 'no tests selected',
}
OUTCOME_WORDS = ('passed', 'failed', 'skipped', 'xfailed', 'xpassed', 'error', 'errors')
SUMMARY_LINE = re.compile(r'^=*\s*(no tests ran|\d+ [a-z]+(, \d+ [a-z]+)*) in \d+(\.\d+)?s\b')
ANSI_ESCAPE = re.compile(r'\x1b\[[0-9;]*m')


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    marker: str  # the phase's own marker expression
    workers: int


@dataclasses.dataclass(frozen=True)
class PhaseResult:
    returncode: int
    seconds: float
    summary: str | None = None  # pytest's final summary line, e.g. '3 passed, 2 deselected in 1.2s'


Runner = Callable[[Sequence[str], Mapping[str, str]], PhaseResult]


class UsageError(ValueError):
    """A command line this runner cannot honour."""


def split_markexpr(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """Take pytest's `-m EXPR` / `-mEXPR` out of args: (the expression, the other args).

    As in pytest, the last -m wins.
    """
    expr, rest = None, []
    it = iter(args)
    for arg in it:
        if arg == '-m':
            expr = next(it, None)
            if expr is None:
                raise UsageError('-m needs a marker expression')
        elif arg.startswith('-m') and not arg.startswith('--'):
            expr = arg[2:].removeprefix('=')
        else:
            rest.append(arg)
    return expr, rest


def check_passthrough(args: Sequence[str]) -> None:
    """The phases choose the worker count: pytest's own -n would fight with it."""
    for arg in args:
        if (arg.startswith('-n') and not arg.startswith('--')) or arg.split('=')[0] == '--numprocesses':
            raise UsageError(f'{arg!r}: set the worker counts with --phase1-workers / --phase2-workers instead')


def combine_markexpr(user: str | None, phase: str) -> str:
    """The phase's expression, and-ed with the user's, each parenthesised."""
    if user is None or not user.strip():
        return phase
    return f'({user}) and ({phase})'


def phase_argv(phase: Phase, user_markexpr: str | None, args: Sequence[str], python: str = sys.executable) -> list[str]:
    """The pytest command of one phase."""
    markexpr = combine_markexpr(user_markexpr, phase.marker)
    return [python, '-m', 'pytest', '-m', markexpr, '-n', str(phase.workers), *args]


def default_workers(device_count: int, cpu_count: int) -> tuple[int, int]:
    """(phase 1, phase 2) workers: 4 and 1 per device; one per CPU and 1 without a device."""
    if device_count > 0:
        return WORKERS_PER_DEVICE_PHASE1 * device_count, WORKERS_PER_DEVICE_PHASE2 * device_count
    return max(1, cpu_count), 1


def build_phases(phase1_workers: int, phase2_workers: int) -> list[Phase]:
    return [
        Phase('phase 1', f'not {LARGE_MARKER}', phase1_workers),
        Phase('phase 2', LARGE_MARKER, phase2_workers),
    ]


def failed(returncode: int) -> bool:
    return returncode not in (0, NO_TESTS)


def combined_exit_code(returncodes: Sequence[int]) -> int:
    """0 when no phase failed (5 when none ran a test), else the first failure's code (1 for signals)."""
    for code in returncodes:
        if failed(code):
            return code if 0 < code < 256 else 1
    if returncodes and all(code == NO_TESTS for code in returncodes):
        return NO_TESTS
    return 0


def parse_summary_counts(line: str | None) -> dict[str, int]:
    """{'passed': 3, 'deselected': 2, ...} from pytest's final summary line."""
    if not line:
        return {}
    return {word: int(num) for num, word in re.findall(r'(\d+) ([a-z]+)', line.split(' in ')[0])}


def selected_count(line: str | None) -> int | None:
    """Tests that ran or were skipped (deselected ones excluded); None without a summary line."""
    if not line:
        return None
    counts = parse_summary_counts(line)
    return sum(counts.get(word, 0) for word in OUTCOME_WORDS)


def _echo(proc: subprocess.Popen) -> str | None:
    """Copy the child's output to ours, line by line; return pytest's final summary line."""
    summary = None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        plain = ANSI_ESCAPE.sub('', line).strip()
        if SUMMARY_LINE.match(plain):
            summary = plain.strip('= ')
    return summary


def run_subprocess(argv: Sequence[str], env: Mapping[str, str]) -> PhaseResult:
    """Run one pytest command, echoing its output live."""
    start = time.monotonic()
    with subprocess.Popen(
        list(argv), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors='replace'
    ) as proc:
        try:
            summary = _echo(proc)
        except KeyboardInterrupt:  # pytest got the same SIGINT: let it write its report, then stop
            summary = _echo(proc)
        returncode = proc.wait()
    return PhaseResult(returncode, time.monotonic() - start, summary)


def format_summary(phases: Sequence[Phase], markexprs: Sequence[str], results: Sequence[PhaseResult | None]) -> str:
    """The verdict and one line per phase: marker expression, workers, exit status, selected, time."""
    codes = [result.returncode for result in results if result is not None]
    verdict = 'FAILED' if any(failed(code) for code in codes) else 'passed'
    lines = [f'two-phase run: {verdict}']
    for phase, markexpr, result in zip(phases, markexprs, results, strict=True):
        head = f'  {phase.name}: -m {shlex.quote(markexpr)} -n {phase.workers}'
        if result is None:
            lines.append(f'{head}: not run')
            continue
        meaning = EXIT_MEANING.get(result.returncode, 'failed')
        selected = selected_count(result.summary)
        lines.append(
            f'{head}: exit {result.returncode} ({meaning}), '
            f'selected {"?" if selected is None else selected}, {result.seconds:.1f} s'
            + (f' [{result.summary}]' if result.summary else '')
        )
    return '\n'.join(lines)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='python -m cann_ops_pipeline.two_phase',
        description='Run pytest in two phases: -m "not large_npu_mem" with many xdist workers, then '
        '-m large_npu_mem with few. Unknown arguments, and all arguments after --, go to both pytest runs.',
        allow_abbrev=False,
    )
    parser.add_argument(
        '--phase1-workers',
        type=_count,
        metavar='N',
        help=f'xdist workers of phase 1 (default {WORKERS_PER_DEVICE_PHASE1} per device, one per CPU without one)',
    )
    parser.add_argument(
        '--phase2-workers',
        type=_count,
        metavar='N',
        help=f'xdist workers of phase 2 (default {WORKERS_PER_DEVICE_PHASE2} per device, 1 without a device)',
    )
    parser.add_argument('--fail-fast', action='store_true', help='skip phase 2 when phase 1 failed')
    parser.add_argument('--dry-run', action='store_true', help='print both pytest commands and exit')
    return parser


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f'{text!r} is not a worker count (an integer >= 0; 0 runs without xdist)')
    return value


def parse_command_line(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """(this runner's options, the pytest args), in their original order."""
    argv = list(argv)
    ours, after = (argv[: argv.index('--')], argv[argv.index('--') + 1 :]) if '--' in argv else (argv, [])
    options, unknown = make_parser().parse_known_args(ours)
    return options, [*unknown, *after]


def _cpu_count() -> int:
    if hasattr(os, 'sched_getaffinity'):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def run(
    argv: Sequence[str],
    *,
    runner: Runner = run_subprocess,
    environ: Mapping[str, str] | None = None,
    cpu_count: Callable[[], int] = _cpu_count,
    out: Callable[[str], None] = print,
) -> int:
    """The whole run; returns the exit code. `runner` executes one pytest command."""
    environ = dict(os.environ if environ is None else environ)
    options, pytest_args = parse_command_line(argv)
    try:
        check_passthrough(pytest_args)
        user_markexpr, rest = split_markexpr(pytest_args)
        device_count = count_devices(environ).count
    except ValueError as exc:
        out(f'two_phase: error: {exc}')
        return 4
    environ[DEVICE_COUNT_ENV] = str(device_count)  # the pytest runs bind workers without probing again
    default1, default2 = default_workers(device_count, cpu_count())
    phases = build_phases(
        default1 if options.phase1_workers is None else options.phase1_workers,
        default2 if options.phase2_workers is None else options.phase2_workers,
    )
    markexprs = [combine_markexpr(user_markexpr, phase.marker) for phase in phases]
    argvs = [phase_argv(phase, user_markexpr, rest) for phase in phases]
    if options.dry_run:
        for phase, phase_args in zip(phases, argvs, strict=True):
            out(f'{phase.name}: {DEVICE_COUNT_ENV}={device_count} {shlex.join(phase_args)}')
        return 0
    results: list[PhaseResult | None] = [None] * len(phases)
    for i, (phase, phase_args) in enumerate(zip(phases, argvs, strict=True)):
        out(f'==> {phase.name}: {shlex.join(phase_args)}')
        results[i] = runner(phase_args, environ)
        code = results[i].returncode
        if code == INTERRUPTED or (options.fail_fast and failed(code)):
            break
    out(format_summary(phases, markexprs, results))
    return combined_exit_code([result.returncode for result in results if result is not None])


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stdout.isatty():  # pytest writes into a pipe here: keep its colours and width
        os.environ.setdefault('PY_COLORS', '1')
        os.environ.setdefault('COLUMNS', str(shutil.get_terminal_size().columns))
    return run(sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    sys.exit(main())
