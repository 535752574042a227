"""xdist workers end their process as soon as pytest is done with them.

A worker's results reach the controller with xdist's `workerfinished` event at the end of its session; what
follows is the interpreter's teardown: torch's caching allocator and the CUDA context, the thread and process
pools of torch and TileLang, every module's finalisation. The controller waits for every worker process to
end before its own session ends, so the slowest teardown is the run's tail, and on a device host with many
workers sharing one GPU it is seconds (tests/README.md, "Two-phase run"). A worker therefore ends with
os._exit, with its session's exit status, after pytest's last cleanup (registered first, it runs last).

What a worker skips is its atexit handlers: nothing here needs them (every file a plugin writes is written
before; pytest-cov's workers send their data at the session's end). `-p no:tests.testing.plugins.worker_exit`
keeps the normal exit. The controller and runs without xdist are untouched.
"""

from __future__ import annotations

import os
import sys

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, 'workerinput'):
        config.add_cleanup(lambda: _end_process(config))


def _end_process(config: pytest.Config) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(getattr(config, 'workeroutput', {}).get('exitstatus', 0)))
