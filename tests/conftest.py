"""Loads the project's pytest plugins; each one is a module of small hooks in tests/testing/plugins."""

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
]
