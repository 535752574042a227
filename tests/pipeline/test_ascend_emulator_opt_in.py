"""The Ascend emulator opt-in of cann_ops_tilelang.config: explicit, documented, never a fallback; the
emulator plugs in by registering with the wheel, and an opt-in with nothing registered says what to do."""

import json
import os
import sys
import textwrap

import pytest
import torch

from cann_ops_tilelang import config
from cann_ops_tilelang.config import ASCEND_EMULATOR_ENV, EMULATED_VECTOR_CORES

pytestmark = pytest.mark.skipif(
    config.is_ascend_available(), reason='the emulator opt-in is refused on a machine with an Ascend NPU'
)

NOT_REGISTERED = f'{ASCEND_EMULATOR_ENV}=1 but no Ascend emulator is registered in this process'


def _fake_compile(prim_func):
    raise AssertionError('nothing here compiles')


@pytest.fixture
def registered(monkeypatch):
    """A stand-in emulator registered for this test only (monkeypatch restores what was there)."""
    monkeypatch.setattr(config.ascend_emulator, 'compile_prim_func', None)
    config.ascend_emulator.register(_fake_compile)


@pytest.fixture
def emulator_on(monkeypatch, registered):
    monkeypatch.setenv(ASCEND_EMULATOR_ENV, '1')


@pytest.mark.usefixtures('registered')
def test_without_the_opt_in_cpu_tensors_are_refused(monkeypatch):
    """A registered emulator changes nothing until the process opts in."""
    monkeypatch.delenv(ASCEND_EMULATOR_ENV, raising=False)
    assert not config.ascend_emulator.enabled()
    assert not config.ascend_emulator.runs(torch.device('cpu'))
    with pytest.raises(RuntimeError, match='no CPU fallback'):
        config.require_accelerator(torch.zeros(4))


@pytest.mark.usefixtures('registered')
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
    assert config.ascend_emulator.runs(cpu)
    assert config.ascend_emulator.active()
    assert config.backend_of(cpu) == 'ascend'
    assert config.require_accelerator(torch.zeros(4), torch.ones(2)) == 'ascend'
    assert config.get_num_cores(cpu) == EMULATED_VECTOR_CORES
    with config.device_guard(cpu):
        pass
    if not config.is_cuda_available():
        assert config.get_device() == cpu


@pytest.mark.usefixtures('emulator_on')
def test_the_opt_in_does_not_admit_other_devices():
    assert not config.ascend_emulator.runs(torch.device('meta'))
    with pytest.raises(RuntimeError, match="no kernels for 'meta' tensors"):
        config.require_accelerator(torch.zeros(1, device='meta'))
    with pytest.raises(RuntimeError, match='one device'):
        config.require_accelerator(torch.zeros(1), torch.zeros(1, device='meta'))


@pytest.mark.usefixtures('emulator_on')
def test_a_machine_with_an_npu_refuses_the_opt_in(monkeypatch):
    monkeypatch.setattr(config, 'is_ascend_available', lambda: True)
    assert not config.ascend_emulator.active(), 'npu tensors get real kernels there'
    with pytest.raises(RuntimeError, match='is for machines without an Ascend NPU: this one has one'):
        config.require_accelerator(torch.zeros(4))


def test_the_opt_in_with_nothing_registered_says_what_to_do(monkeypatch):
    monkeypatch.setattr(config.ascend_emulator, 'compile_prim_func', None)
    monkeypatch.setenv(ASCEND_EMULATOR_ENV, '1')
    for call in (lambda: config.require_accelerator(torch.zeros(4)), lambda: config.ascend_emulator.compile(None)):
        with pytest.raises(RuntimeError, match=NOT_REGISTERED) as raised:
            call()
        message = str(raised.value)
        assert '\n' not in message
        assert 'import cann_ops_ascend_emu' in message
        assert 'python -m cann_ops_ascend_emu.run script.py' in message


def test_importing_the_emulator_registers_it():
    emulator = pytest.importorskip('cann_ops_ascend_emu')
    assert config.ascend_emulator.compile_prim_func is emulator.compile_prim_func


def test_the_run_entry_point_registers_the_emulator_and_opts_in(tmp_path, monkeypatch):
    """`python -m cann_ops_ascend_emu.run script.py args` runs the script as python would, with both done."""
    run = pytest.importorskip('cann_ops_ascend_emu.run')
    script = tmp_path / 'script.py'
    script.write_text(
        textwrap.dedent("""
            import json, pathlib, sys
            import torch
            from cann_ops_tilelang import config
            import helper  # beside the script: its directory is first on sys.path, as under python script.py
            result = [sys.argv, __name__, config.require_accelerator(torch.zeros(4))]
            pathlib.Path(__file__).with_suffix('.json').write_text(json.dumps(result))
        """),
        encoding='utf-8',
    )
    (tmp_path / 'helper.py').write_text('', encoding='utf-8')
    monkeypatch.setenv(ASCEND_EMULATOR_ENV, '0')  # the entry point sets it; monkeypatch restores it
    monkeypatch.setattr(sys, 'argv', ['run.py'])
    monkeypatch.setattr(sys, 'path', list(sys.path))
    monkeypatch.delitem(sys.modules, 'helper', raising=False)
    run.main([str(script), 'a', 'b'])
    assert json.loads(script.with_suffix('.json').read_text()) == [[str(script), 'a', 'b'], '__main__', 'ascend']
    assert os.environ[ASCEND_EMULATOR_ENV] == '1'


def test_the_run_entry_point_explains_its_usage():
    run = pytest.importorskip('cann_ops_ascend_emu.run')
    for argv in ([], ['-m'], ['--help']):
        with pytest.raises(SystemExit, match=r'usage: python -m cann_ops_ascend_emu.run \(script.py \| -m module\)'):
            run.main(argv)
