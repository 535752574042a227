"""A summary of TileLang compile warnings at the end of the run.

Kernels compile inside tests, so their warnings land in the tests' captured output, shown only for tests
that fail. This plugin reads every test's captured stdout, stderr and log for the lines that TileLang's
logger (`[TileLang:<logger>:WARNING]`, written to stdout), TVM (`file.cc:123: Warning: ...`) and the
device compilers (`warning:`, `warning #123-D:`) write, and lists them once at the end, each with how
often it came and the first test it came in. Under xdist the workers hand theirs to the controller
(`workeroutput`). Nothing is read with capturing off (`-s`).
"""

from __future__ import annotations

import dataclasses
import re

import pytest

WARNING_LINE = re.compile(r'\[TileLang:[^\]]*:WARNING\]|\bWarning: |\bwarning(?::|\s#\d)', re.IGNORECASE)
_TIMESTAMP = re.compile(r'^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+|\[\d\d:\d\d:\d\d(\.\d+)?\]\s*)')
MAX_SHOWN = 20
MAX_LINE = 240
_WORKEROUTPUT_KEY = 'ops_tilelang_compile_warnings'


@dataclasses.dataclass
class Seen:
    count: int
    first: str  # node ID of the first test whose output had it


_SEEN = pytest.StashKey[dict[str, Seen]]()


def warning_lines(text: str) -> list[str]:
    """The compile-warning lines of captured output, timestamps removed (so repeats compare equal)."""
    return [_TIMESTAMP.sub('', line.strip()) for line in text.splitlines() if WARNING_LINE.search(line)]


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SEEN] = {}


def _note(seen: dict[str, Seen], line: str, count: int, first: str) -> None:
    if line in seen:
        seen[line].count += count
    else:
        seen[line] = Seen(count, first)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    seen = item.config.stash[_SEEN]
    for name, text in report.sections:
        if name.startswith(('Captured stdout', 'Captured stderr', 'Captured log')) and name.endswith(report.when):
            for line in warning_lines(text):
                _note(seen, line, 1, item.nodeid)
    return report


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: merge a worker's warnings."""
    seen = node.config.stash[_SEEN]
    for line, count, first in getattr(node, 'workeroutput', {}).get(_WORKEROUTPUT_KEY, ()):
        _note(seen, line, count, first)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if hasattr(config, 'workerinput'):
        wire = [(line, s.count, s.first) for line, s in config.stash[_SEEN].items()]
        config.workeroutput[_WORKEROUTPUT_KEY] = wire


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    seen = config.stash.get(_SEEN, {})
    if not seen:
        return
    total = sum(s.count for s in seen.values())
    terminalreporter.write_sep('=', f'TileLang compile warnings: {len(seen)} distinct, {total} in all', yellow=True)
    ranked = sorted(seen.items(), key=lambda kv: (-kv[1].count, kv[0]))
    for line, s in ranked[:MAX_SHOWN]:
        shown = line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + '...'
        terminalreporter.write_line(f'{s.count:>4}x {shown}  (first in {s.first})')
    if len(ranked) > MAX_SHOWN:
        terminalreporter.write_line(f'     ... and {len(ranked) - MAX_SHOWN} more')
