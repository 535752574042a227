"""Loads the project's pytest plugins; each one is a module of small hooks in tests/testing/plugins."""

import sys

import pytest

pytest_plugins = [
    'tests.testing.plugins.seed',
    'tests.testing.plugins.devices',
    'tests.testing.plugins.benchmark',
    'tests.testing.plugins.param_select',
    'tests.testing.plugins.device_binding',
    'tests.testing.plugins.npu_mem',
    'tests.testing.plugins.xdist_fail_fast',
    'tests.testing.plugins.compile_warnings',
    'tests.testing.plugins.longest_first',
    'tests.testing.plugins.run_timeline',
    'tests.testing.plugins.worker_exit',
]


@pytest.fixture(autouse=True)
def _no_bytecode_for_pytester_projects(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests with pytester write no bytecode for the projects it makes, in process or in a child: they rewrite
    a file in place between two runs within a second, often at the same size, and bytecode (which the
    pipeline caches, cann_ops_pipeline.bytecode_cache) is keyed by the source's mtime in seconds and its size,
    so the second run would import the first one's code. Cached bytecode of everything else is still read."""
    if 'pytester' in request.fixturenames:
        monkeypatch.setattr(sys, 'dont_write_bytecode', True)
        monkeypatch.setenv('PYTHONDONTWRITEBYTECODE', '1')
