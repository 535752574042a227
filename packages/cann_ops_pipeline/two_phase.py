"""The two-phase xdist test run: ordinary-memory tests with many workers, large_npu_mem tests with few.

    python -m cann_ops_pipeline.two_phase [--phase1-workers N] [--phase2-workers N] [--fail-fast]
                                          [--dry-run] [pytest args...] [-- pytest args...]

Phase 1 runs `-m 'not large_npu_mem'` with many workers, phase 2 runs `-m large_npu_mem` with one
worker per device (1 without a device); a `-m` among the pytest args is combined with the phase's
expression by `and`. A phase with 0 or 1 worker runs in-process (`-n 0`): no xdist start-up.

Phase 1 defaults to W = max(1, min(CPUs // devices, 16)) workers per device, or one per CPU without a
device. The device binding caps each worker's allocator to 1/W of its device, so the runner passes
`--npu-mem-threshold X` to both phases, X = min(the user's --npu-mem-threshold if given, else the npu_mem
default 15000 MB; the per-worker share device MB // W of the smallest device): a test whose profiled
peak exceeds its worker's share is marked large_npu_mem and goes to phase 2. With --phase1-workers N
the share uses W = ceil(N / devices) (1 in-process); when the device memory is unknown there is no
share (X is the given threshold or the default) and the default W is at most 4. The dry run and the
final summary show X and why, e.g. `--npu-mem-threshold 8985 (device share: 143771 MB / 16 workers; ...)`.
CPUs are shared the same way: an xdist phase with N workers gets OMP_NUM_THREADS (and the MKL, OpenBLAS
and TVM equivalents) = max(1, CPUs // N) unless the environment sets them, since every worker's torch
and TVM thread pools would otherwise size themselves to the whole host.

Arguments this runner does not know go to both pytest runs unchanged, as does everything after `--`.
The test level, `-m` and `-K` are checked once before any phase. Exit code 5 (no test selected) does
not fail a phase; a failing phase 1 still runs phase 2 unless --fail-fast (an interrupted phase 1, or
one that ended in a usage error, stops the run). The exit code is 0 when no phase failed (5 when
neither phase ran a test), else the first failing phase's exit code; usage errors exit 4, as in pytest.

Phase 2 is started while phase 1 runs (`-p cann_ops_pipeline.phase_gate`): its interpreter start, imports
and collection overlap phase 1, and its tests wait at the gate until phase 1 has ended; its output is
shown then, after phase 1's, and its time counts from there. A stopped run ends it unheard.

Pure standard library. Devices are counted and their memory read by cann_ops_pipeline.device_count
(never by torch), and the count is exported as OPS_TILELANG_DEVICE_COUNT so that both pytest runs
bind workers alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cann_ops_pipeline.conventions import (
    DEFAULT_NPU_MEM_THRESHOLD_MB,
    LARGE_MARKER,
    NO_TESTS_COLLECTED,
    USAGE_ERROR,
    markexpr_problem,
    test_level_from_env,
)
from cann_ops_pipeline.conventions import NPU_MEM_THRESHOLD_OPTION as THRESHOLD_OPTION
from cann_ops_pipeline.device_count import DEVICE_COUNT_ENV, Tool, count_devices, device_memory_mb, run_tool
from cann_ops_pipeline.phase_gate import GATE_ENV, open_gate

DEFAULT_DIST = 'worksteal'  # see phase_argv
THREAD_ENV_VARS = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'TVM_NUM_THREADS')
MAX_WORKERS_PER_DEVICE = 16  # phase 1 default: one worker per CPU per device, at most this many
UNKNOWN_MEMORY_WORKERS_PER_DEVICE = 4  # phase 1 default cap when the device memory cannot be read
WORKERS_PER_DEVICE_PHASE2 = 1
INTERRUPTED = 2
STOPS_THE_RUN = (INTERRUPTED, USAGE_ERROR)  # phase 2 would be interrupted too, or refuse the same arguments
EXIT_MEANING = {
    0: 'passed',
    1: 'tests failed',
    2: 'interrupted',
    3: 'internal error',
    USAGE_ERROR: 'usage error',
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
PHASE_GATE_PLUGIN = 'cann_ops_pipeline.phase_gate'


@dataclasses.dataclass(frozen=True)
class Threshold:
    """The --npu-mem-threshold both phases get, and why."""

    mb: float
    reason: str

    def args(self) -> list[str]:
        return [THRESHOLD_OPTION, format_mb(self.mb)]

    def describe(self) -> str:
        return f'{THRESHOLD_OPTION} {format_mb(self.mb)} ({self.reason})'


class UsageError(ValueError):
    """A command line this runner cannot honour."""


def split_option(args: Sequence[str], option: str, needs: str) -> tuple[str | None, list[str]]:
    """Take a pytest option and its value out of args: (the value, the other args).

    Forms: `OPTION VALUE`, and glued `--long=VALUE` or `-sVALUE` / `-s=VALUE`. As in pytest, the last wins.
    """
    value, rest = None, []
    glued = f'{option}=' if option.startswith('--') else option
    it = iter(args)
    for arg in it:
        if arg == option:
            value = next(it, None)
            if value is None:
                raise UsageError(f'{option} needs {needs}')
        elif arg.startswith(glued) and (glued.endswith('=') or not arg.startswith('--')):
            value = arg[len(glued) :].removeprefix('=')
        else:
            rest.append(arg)
    return value, rest


def split_markexpr(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """Take pytest's `-m EXPR` / `-mEXPR` out of args: (the expression, the other args)."""
    return split_option(args, '-m', 'a marker expression')


def parse_threshold(text: str) -> float:
    """A --npu-mem-threshold value: a number of MB >= 0, as the npu_mem plugin takes it."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise UsageError(f'{THRESHOLD_OPTION} {text!r}: expected a number of MB >= 0')
    return value


def split_threshold(args: Sequence[str]) -> tuple[float | None, list[str]]:
    """Take `--npu-mem-threshold N` / `=N` out of args (the runner passes the final one to both phases)."""
    text, rest = split_option(args, THRESHOLD_OPTION, 'a number of MB')
    return (None if text is None else parse_threshold(text)), rest


def _check_markexpr(markexpr: str) -> None:
    problem = markexpr_problem(markexpr)
    if problem is not None:
        raise UsageError(problem)


def check_selection(markexpr: str | None, args: Sequence[str], environ: Mapping[str, str]) -> None:
    """Check once, before any phase, what both phases would refuse: the test level, `-m` and `-K`.

    pytest's own parser judges `-m` (its message); the -K grammar is the param_select plugin's. A -K
    parameter that no test has can only be known after collection: phase 1 reports it (exit 4, which
    stops the run).
    """
    test_level_from_env(environ)
    if markexpr is not None and markexpr.strip():
        _check_markexpr(markexpr)
    param_text, _ = split_option(args, '-K', 'a parameter expression')
    if param_text is not None:
        from tests.testing.param_expr import ParamExprError, parse  # the repository's -K plugin, from the root

        try:
            parse(param_text)
        except ParamExprError as exc:
            raise UsageError(f'-K: {exc}') from None


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


def xdist_count(workers: int) -> int:
    """What `-n` gets: 0 or 1 worker runs in-process (`-n 0`), without xdist's worker start-up."""
    return workers if workers > 1 else 0


def gives_dist(args: Sequence[str]) -> bool:
    """Whether the pytest args choose xdist's distribution mode themselves (--dist X, --dist=X, -d)."""
    return any(arg == '-d' or arg.split('=')[0] == '--dist' for arg in args)


def phase_argv(phase: Phase, user_markexpr: str | None, args: Sequence[str], python: str = sys.executable) -> list[str]:
    """The pytest command of one phase.

    With xdist workers the distribution defaults to `worksteal`: each worker starts with a contiguous share of
    the tests, so neighbouring parametrizations (the same kernel configuration, other runtime sizes) compile
    their kernel once on one worker instead of once per worker, as xdist's round-robin `load` would have it;
    idle workers then steal from the others' tails.
    """
    markexpr = combine_markexpr(user_markexpr, phase.marker)
    count = xdist_count(phase.workers)
    dist = ['--dist', DEFAULT_DIST] if count > 0 and not gives_dist(args) else []
    return [python, '-m', 'pytest', '-m', markexpr, '-n', str(count), *dist, *args]


def phase1_workers_per_device(device_count: int, cpu_count: int, memory_known: bool = True) -> int:
    """Default phase-1 workers per device: the CPUs per device, 1 to 16 (at most 4 with unknown memory)."""
    per_device = max(1, min(cpu_count // device_count, MAX_WORKERS_PER_DEVICE))
    return per_device if memory_known else min(per_device, UNKNOWN_MEMORY_WORKERS_PER_DEVICE)


def default_workers(device_count: int, cpu_count: int, memory_known: bool = True) -> tuple[int, int]:
    """(phase 1, phase 2) workers: see phase1_workers_per_device, and 1 per device; one per CPU and 1 without one."""
    if device_count > 0:
        per_device = phase1_workers_per_device(device_count, cpu_count, memory_known)
        return per_device * device_count, WORKERS_PER_DEVICE_PHASE2 * device_count
    return max(1, cpu_count), 1


def workers_per_device(workers: int, device_count: int) -> int:
    """xdist workers on the busiest device (round-robin binding); 1 in-process or without a device."""
    if device_count <= 0 or xdist_count(workers) == 0:
        return 1
    return math.ceil(workers / device_count)


def format_mb(mb: float) -> str:
    """8985 for 8985.0, 20.5 for 20.5: what pytest gets and the summary shows."""
    return str(int(mb)) if float(mb).is_integer() else repr(float(mb))


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One bound on the threshold: `name` and how it came about (`detail`)."""

    mb: float
    name: str
    detail: str = ''

    def as_winner(self) -> str:
        return f'{self.name}: {self.detail}' if self.detail else self.name

    def as_other(self) -> str:
        return f'{self.name} {format_mb(self.mb)}' + (f' ({self.detail})' if self.detail else '')


def threshold_candidates(user_mb: float | None, memory_mb: int | None, per_device: int) -> list[Candidate]:
    """The device share (smallest device's MB // workers on one device), and the user's value if given,
    else the plugin's default (a given value replaces the default, so it may be higher)."""
    candidates = []
    if memory_mb is not None:
        workers = f'{per_device} worker{"s" if per_device != 1 else ""}'
        candidates.append(Candidate(memory_mb // per_device, 'device share', f'{memory_mb} MB / {workers}'))
    if user_mb is not None:
        candidates.append(Candidate(user_mb, 'given'))
    else:
        candidates.append(Candidate(DEFAULT_NPU_MEM_THRESHOLD_MB, 'npu_mem default'))
    return candidates


def choose_threshold(user_mb: float | None, memory_mb: int | None, per_device: int, note: str = '') -> Threshold:
    """The smallest candidate (on a tie the first: share, given, default); the reason names it, then the rest.

    E.g. `device share: 143771 MB / 16 workers; min with npu_mem default 15000`.
    """
    candidates = threshold_candidates(user_mb, memory_mb, per_device)
    best = min(candidates, key=lambda candidate: candidate.mb)
    others = [candidate.as_other() for candidate in candidates if candidate is not best]
    parts = [best.as_winner(), *([f'min with {", ".join(others)}'] if others else []), *([note] if note else [])]
    return Threshold(float(best.mb), '; '.join(parts))


def build_phases(phase1_workers: int, phase2_workers: int) -> list[Phase]:
    return [
        Phase('phase 1', f'not {LARGE_MARKER}', phase1_workers),
        Phase('phase 2', LARGE_MARKER, phase2_workers),
    ]


def thread_env(workers: int, cpus: int, environ: Mapping[str, str]) -> dict[str, str]:
    """Thread-pool sizes for a phase's workers: an even share of the CPUs; variables already set are kept."""
    if xdist_count(workers) == 0:
        return {}
    share = str(max(1, cpus // workers))
    return {name: share for name in THREAD_ENV_VARS if name not in environ}


def failed(returncode: int) -> bool:
    return returncode not in (0, NO_TESTS_COLLECTED)


def combined_exit_code(returncodes: Sequence[int]) -> int:
    """0 when no phase failed (5 when none ran a test), else the first failure's code (1 for signals)."""
    for code in returncodes:
        if failed(code):
            return code if 0 < code < 256 else 1
    if returncodes and all(code == NO_TESTS_COLLECTED for code in returncodes):
        return NO_TESTS_COLLECTED
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


def _popen(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
    """One pytest command with its output (stderr too) in a pipe."""
    return subprocess.Popen(
        list(argv), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors='replace'
    )


def _end(proc: subprocess.Popen) -> None:
    """Terminate a phase's pytest (killed if it does not end within 10 s) and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _follow(proc: subprocess.Popen) -> tuple[int, str | None]:
    """Echo a phase's output live until it ends: (its exit code, pytest's final summary line)."""
    try:
        summary = _echo(proc)
    except KeyboardInterrupt:  # pytest got the same SIGINT: let it write its report, then stop
        summary = _echo(proc)
    except BaseException:  # SIGTERM (see main) reached only this process: end the phase too
        _end(proc)
        raise
    return proc.wait(), summary


def run_subprocess(argv: Sequence[str], env: Mapping[str, str]) -> PhaseResult:
    """Run one pytest command, echoing its output live."""
    start = time.monotonic()
    with _popen(argv, env) as proc:
        returncode, summary = _follow(proc)
    return PhaseResult(returncode, time.monotonic() - start, summary)


class StartedPhase:
    """A phase's pytest started ahead of its turn: it starts up and collects, then holds its tests at the
    gate (phase_gate) and its output in the pipe until `release`; `cancel` ends it unheard."""

    def __init__(self, proc: subprocess.Popen, gate: Path) -> None:
        self._proc = proc
        self._gate = gate

    def release(self) -> PhaseResult:
        """Open the gate, echo the phase's output (held until now) live, wait; its time counts from here."""
        start = time.monotonic()
        open_gate(self._gate)
        try:
            returncode, summary = _follow(self._proc)
        finally:
            self._close()
        return PhaseResult(returncode, time.monotonic() - start, summary)

    def cancel(self) -> None:
        _end(self._proc)
        self._close()

    def _close(self) -> None:
        self._proc.stdout.close()
        shutil.rmtree(self._gate.parent, ignore_errors=True)


Starter = Callable[[Sequence[str], Mapping[str, str]], StartedPhase]


def start_subprocess(argv: Sequence[str], env: Mapping[str, str]) -> StartedPhase:
    """Start one pytest command (phase_argv's `python -m pytest ...`) with its tests held at a gate."""
    gate = Path(tempfile.mkdtemp(prefix='two_phase_gate_')) / 'open'
    held = [*argv[:3], '-p', PHASE_GATE_PLUGIN, *argv[3:]]
    return StartedPhase(_popen(held, {**env, GATE_ENV: str(gate)}), gate)


def format_summary(
    phases: Sequence[Phase],
    markexprs: Sequence[str],
    results: Sequence[PhaseResult | None],
    threshold: Threshold | None = None,
) -> str:
    """The verdict, the threshold, and one line per phase: marker expression, -n, exit status, selected, time."""
    codes = [result.returncode for result in results if result is not None]
    verdict = 'FAILED' if any(failed(code) for code in codes) else 'passed'
    lines = [f'two-phase run: {verdict}', *([f'  {threshold.describe()}'] if threshold else [])]
    for phase, markexpr, result in zip(phases, markexprs, results, strict=True):
        head = f'  {phase.name}: -m {shlex.quote(markexpr)} -n {xdist_count(phase.workers)}'
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


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):
        """argparse's message, with the usage-error exit code of pytest and this runner (not argparse's 2)."""
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f'{self.prog}: error: {message}\n')


def make_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog='python -m cann_ops_pipeline.two_phase',
        description='Run pytest in two phases: -m "not large_npu_mem" with many xdist workers, then '
        '-m large_npu_mem with few. Unknown arguments, and all arguments after --, go to both pytest runs.',
        allow_abbrev=False,
    )
    parser.add_argument(
        '--phase1-workers',
        type=_count,
        metavar='N',
        help=f'xdist workers of phase 1 (default: CPUs // devices per device, at most {MAX_WORKERS_PER_DEVICE}, '
        f'at most {UNKNOWN_MEMORY_WORKERS_PER_DEVICE} when the device memory is unknown; one per CPU without a '
        f'device). Also sets the per-worker device share that caps {THRESHOLD_OPTION}',
    )
    parser.add_argument(
        '--phase2-workers',
        type=_count,
        metavar='N',
        help=f'xdist workers of phase 2 (default {WORKERS_PER_DEVICE_PHASE2} per device, 1 without a device)',
    )
    parser.add_argument('--fail-fast', action='store_true', help='skip phase 2 when phase 1 failed')
    parser.add_argument('--dry-run', action='store_true', help='print the threshold and both pytest commands and exit')
    return parser


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f'{text!r} is not a worker count (an integer >= 0; 0 or 1: no xdist)')
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


def threshold_note(device_count: int, memory_mb: int | None, default_phase1: bool) -> str:
    """Why the threshold has no device share, if it has none."""
    if device_count <= 0:
        return 'no device'
    if memory_mb is not None:
        return ''
    cap = f', phase 1 at most {UNKNOWN_MEMORY_WORKERS_PER_DEVICE} workers per device' if default_phase1 else ''
    return f'device memory unknown{cap}'


def plan_run(
    options: argparse.Namespace, user_threshold: float | None, device_count: int, memory_mb: int | None, cpus: int
) -> tuple[list[Phase], Threshold]:
    """Both phases' worker counts and the threshold they share, from the options and the host."""
    default1, default2 = default_workers(device_count, cpus, memory_known=memory_mb is not None)
    workers1 = default1 if options.phase1_workers is None else options.phase1_workers
    workers2 = default2 if options.phase2_workers is None else options.phase2_workers
    note = threshold_note(device_count, memory_mb, default_phase1=options.phase1_workers is None)
    threshold = choose_threshold(user_threshold, memory_mb, workers_per_device(workers1, device_count), note)
    return build_phases(workers1, workers2), threshold


def run(
    argv: Sequence[str],
    *,
    runner: Runner = run_subprocess,
    starter: Starter | None = start_subprocess,
    environ: Mapping[str, str] | None = None,
    cpu_count: Callable[[], int] = _cpu_count,
    tool: Tool = run_tool,
    out: Callable[[str], None] = print,
) -> int:
    """The whole run; returns the exit code. `runner` executes phase 1's pytest command; `starter` starts
    phase 2's while phase 1 runs, its tests held until phase 1 has ended (None: `runner` runs it then);
    `tool` runs a vendor tool."""
    environ = dict(os.environ if environ is None else environ)
    options, pytest_args = parse_command_line(argv)
    try:
        check_passthrough(pytest_args)
        user_markexpr, rest = split_markexpr(pytest_args)
        user_threshold, rest = split_threshold(rest)
        check_selection(user_markexpr, rest, environ)
        device_count = count_devices(environ, tool).count
        memory_mb = device_memory_mb(environ, tool) if device_count > 0 else None
    except ValueError as exc:
        out(f'two_phase: error: {exc}')
        return USAGE_ERROR
    environ[DEVICE_COUNT_ENV] = str(device_count)  # the pytest runs bind workers without probing again
    cpus = cpu_count()
    phases, threshold = plan_run(options, user_threshold, device_count, memory_mb, cpus)
    markexprs = [combine_markexpr(user_markexpr, phase.marker) for phase in phases]
    argvs = [phase_argv(phase, user_markexpr, [*threshold.args(), *rest]) for phase in phases]
    threads = [thread_env(phase.workers, cpus, environ) for phase in phases]
    if options.dry_run:
        out(f'threshold: {threshold.describe()}')
        for phase, phase_args, phase_threads in zip(phases, argvs, threads, strict=True):
            assignments = [f'{DEVICE_COUNT_ENV}={device_count}', *(f'{k}={v}' for k, v in phase_threads.items())]
            out(f'{phase.name}: {" ".join(assignments)} {shlex.join(phase_args)}')
        return 0
    out(f'==> threshold: {threshold.describe()}')
    results: list[PhaseResult | None] = [None] * len(phases)
    # Later phases start up and collect while phase 1 runs; their tests wait for their turn.
    started = [None] + [
        starter(argvs[i], {**environ, **threads[i]}) if starter else None for i in range(1, len(phases))
    ]
    try:
        for i, (phase, phase_args) in enumerate(zip(phases, argvs, strict=True)):
            out(f'==> {phase.name}: {shlex.join(phase_args)}')
            ahead, started[i] = started[i], None
            results[i] = ahead.release() if ahead is not None else runner(phase_args, {**environ, **threads[i]})
            code = results[i].returncode
            if code in STOPS_THE_RUN or (options.fail_fast and failed(code)):
                break
    finally:
        for ahead in started:
            if ahead is not None:
                ahead.cancel()
    out(format_summary(phases, markexprs, results, threshold))
    return combined_exit_code([result.returncode for result in results if result is not None])


def _terminated(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds run(): the phase started ahead is ended, not left at its gate


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminated)
    if sys.stdout.isatty():  # pytest writes into a pipe here: keep its colours and width
        os.environ.setdefault('PY_COLORS', '1')
        os.environ.setdefault('COLUMNS', str(shutil.get_terminal_size().columns))
    return run(sys.argv[1:] if argv is None else argv)


if __name__ == '__main__':
    sys.exit(main())
