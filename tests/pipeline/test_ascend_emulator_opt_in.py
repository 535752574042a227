"""The Ascend C emulator opt-in of cann_ops_tilelang.config: explicit, documented, never a fallback."""

import importlib.util

import pytest
import torch

from cann_ops_tilelang import config
from cann_ops_tilelang.config import ASCEND_EMULATOR_ENV, EMULATED_VECTOR_CORES

pytestmark = pytest.mark.skipif(
    config.is_ascend_available(), reason='the emulator opt-in is refused on a machine with an Ascend NPU'
)


@pytest.fixture
def emulator_on(monkeypatch):
    monkeypatch.setenv(ASCEND_EMULATOR_ENV, '1')


def test_without_the_opt_in_cpu_tensors_are_refused(monkeypatch):
    monkeypatch.delenv(ASCEND_EMULATOR_ENV, raising=False)
    assert not config.ascend_emulator_enabled()
    with pytest.raises(RuntimeError, match='no CPU fallback'):
        config.require_accelerator(torch.zeros(4))


@pytest.mark.parametrize('value', ['0', 'off', 'false', ''])
def test_false_values_keep_the_opt_in_off(monkeypatch, value):
    monkeypatch.setenv(ASCEND_EMULATOR_ENV, value)
    with pytest.raises(RuntimeError, match='no CPU fallback'):
        config.require_accelerator(torch.zeros(4))


def test_a_malformed_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(ASCEND_EMULATOR_ENV, 'maybe')
    with pytest.raises(ValueError, match=f"{ASCEND_EMULATOR_ENV}='maybe' is not a boolean"):
        config.require_accelerator(torch.zeros(4))


@pytest.mark.usefixtures('emulator_on')
def test_cpu_tensors_run_the_ascend_kernels_of_the_emulated_chip():
    cpu = torch.device('cpu')
    assert config.is_emulated(cpu)
    assert config.backend_of(cpu) == 'ascend'
    assert config.require_accelerator(torch.zeros(4), torch.ones(2)) == 'ascend'
    assert config.get_num_cores(cpu) == EMULATED_VECTOR_CORES
    with config.device_guard(cpu):
        pass
    if not config.is_cuda_available():
        assert config.get_device() == cpu


@pytest.mark.usefixtures('emulator_on')
def test_the_opt_in_does_not_admit_other_devices():
    assert not config.is_emulated(torch.device('meta'))
    with pytest.raises(RuntimeError, match="no kernels for 'meta' tensors"):
        config.require_accelerator(torch.zeros(1, device='meta'))
    with pytest.raises(RuntimeError, match='one device'):
        config.require_accelerator(torch.zeros(1), torch.zeros(1, device='meta'))


@pytest.mark.usefixtures('emulator_on')
def test_the_opt_in_needs_the_emulator_package(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name == 'cann_ops_ascend_emu' else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, 'find_spec', find_spec)
    with pytest.raises(RuntimeError, match='needs the development package cann_ops_ascend_emu'):
        config.require_accelerator(torch.zeros(4))
