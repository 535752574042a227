"""The device guard, lazy core counts and switches of cann_ops_tilelang.config, and what importing the wheel
does (CPU only)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cann_ops_tilelang import config
from cann_ops_tilelang.config import PRINT_KERNEL_SOURCE_ENV

# Importing every module of the package must not query a device, import torch_npu or compile.
IMPORT_PROBE = """
import pkgutil, sys
import torch, tilelang

def forbidden(name):
    def fail(*args, **kwargs):
        raise SystemExit(f'{name} called at import time')
    return fail

tilelang.compile = forbidden('tilelang.compile')
tilelang.lower = forbidden('tilelang.lower')
for name in ('device_count', 'get_device_properties', 'get_device_capability', 'current_device', 'init'):
    setattr(torch.cuda, name, forbidden(f'torch.cuda.{name}'))

import cann_ops_tilelang
modules = [m.name for m in pkgutil.walk_packages(cann_ops_tilelang.__path__, 'cann_ops_tilelang.')]
for name in modules:
    __import__(name)
assert not torch.cuda.is_initialized(), 'CUDA initialised at import'
assert 'torch_npu' not in sys.modules, 'torch_npu imported at import'
# The emulator registers itself with the wheel; the wheel never imports it (the opt-in alone is refused).
assert 'cann_ops_ascend_emu' not in sys.modules, 'the wheel imported the emulator'
assert cann_ops_tilelang.config.ascend_emulator.compile_prim_func is None, 'an emulator registered at import'
print(len(modules), 'modules')
"""


def test_import_touches_no_device_and_compiles_nothing():
    packages = str(Path(config.__file__).parents[1])
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [packages, os.environ.get('PYTHONPATH')]))}
    result = subprocess.run([sys.executable, '-c', IMPORT_PROBE], capture_output=True, text=True, check=False, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert int(result.stdout.split()[0]) >= 1


def test_no_module_of_the_wheel_imports_the_emulator_or_importlib():
    """The emulator plugs in through config.ascend_emulator, never through an import (not even a lazy one
    inside a function, which the import probe above would not see); and every import of the wheel is a plain,
    visible one (no importlib)."""
    package = Path(config.__file__).parent
    offenders = []
    for path in sorted(package.rglob('*.py')):
        for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or '']
            else:
                continue
            if any(name.split('.')[0] in ('cann_ops_ascend_emu', 'importlib') for name in names):
                offenders.append(f'{path.relative_to(package)}:{node.lineno}')
    assert not offenders


def test_cpu_tensors_are_refused_without_fallback():
    x = torch.zeros(4)
    with pytest.raises(RuntimeError, match="no kernels for 'cpu' tensors.*no CPU fallback"):
        config.require_accelerator(x)


def test_mixed_devices_are_refused():
    with pytest.raises(RuntimeError, match='one device'):
        config.require_accelerator(torch.zeros(1), torch.zeros(1, device='meta'))


def test_require_accelerator_needs_a_tensor():
    with pytest.raises(ValueError, match='at least one tensor'):
        config.require_accelerator()


@pytest.mark.parametrize(('device', 'backend'), [('cuda:0', 'cuda'), ('cuda', 'cuda')])
def test_backend_follows_the_device(device, backend):
    assert config.backend_of(torch.device(device)) == backend


def test_unsupported_device_types_are_refused():
    with pytest.raises(RuntimeError, match="no kernels for 'meta' tensors"):
        config.backend_of(torch.device('meta'))


@pytest.mark.skipif(config._torch_npu() is not None, reason='torch_npu is installed here')
def test_require_ascend_without_torch_npu():
    with pytest.raises(RuntimeError, match='torch_npu is not installed'):
        config.require_ascend()


@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is present')
def test_get_device_without_accelerator():
    with pytest.raises(RuntimeError, match='no accelerator'):
        config.get_device()


@pytest.mark.parametrize(
    ('value', 'expected'),
    [(None, False), ('', False), ('0', False), ('off', False), ('1', True), ('TRUE', True), (' yes ', True)],
)
def test_print_kernel_source_switch(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(PRINT_KERNEL_SOURCE_ENV, raising=False)
    else:
        monkeypatch.setenv(PRINT_KERNEL_SOURCE_ENV, value)
    assert config.should_print_kernel_source() is expected


@pytest.mark.parametrize(('value', 'expected'), [(None, False), ('', False), ('0', False), ('1', True)])
def test_the_launch_path_reads_the_print_switch_as_it_is_now(monkeypatch, value, expected):
    """kernel_source_requested (a dict lookup while unset) sees every change made through os.environ."""
    monkeypatch.setenv(PRINT_KERNEL_SOURCE_ENV, '1')
    assert config.kernel_source_requested() is True
    if value is None:
        monkeypatch.delenv(PRINT_KERNEL_SOURCE_ENV)
    else:
        monkeypatch.setenv(PRINT_KERNEL_SOURCE_ENV, value)
    assert config.kernel_source_requested() is expected
    monkeypatch.setenv(PRINT_KERNEL_SOURCE_ENV, 'maybe')
    with pytest.raises(ValueError, match='is not a boolean'):
        config.kernel_source_requested()


def test_print_kernel_source_rejects_garbage(monkeypatch):
    monkeypatch.setenv(PRINT_KERNEL_SOURCE_ENV, 'maybe')
    with pytest.raises(ValueError, match=f'{PRINT_KERNEL_SOURCE_ENV}=.maybe. is not a boolean'):
        config.should_print_kernel_source()


def test_core_counts_are_cached_per_device(monkeypatch):
    calls = []

    class Props:
        multi_processor_count = 132

    def fake_properties(index):
        calls.append(index)
        return Props()

    config._cuda_sm_count.cache_clear()
    monkeypatch.setattr(torch.cuda, 'get_device_properties', fake_properties)
    try:
        assert config.get_num_sms(torch.device('cuda', 0)) == 132
        assert config.get_num_sms(torch.device('cuda', 0)) == 132
        assert config.get_num_sms(torch.device('cuda', 1)) == 132
    finally:
        config._cuda_sm_count.cache_clear()
    assert calls == [0, 1]


@pytest.mark.parametrize(
    ('cc', 'arch'), [((8, 0), 'sm_80'), ((8, 9), 'sm_89'), ((9, 0), 'sm_90a'), ((10, 0), 'sm_100a')]
)
def test_cuda_arch_uses_arch_specific_targets_where_tilelang_needs_them(cc, arch):
    assert config.cuda_arch_for(*cc) == arch
