"""Device binding of xdist workers, the device count and memory, with fake counts and vendor tools on a CPU."""

from __future__ import annotations

import json
import types

import pytest

from cann_ops_pipeline import device_count
from cann_ops_pipeline.device_count import DeviceInventory, count_devices, device_memory_mb
from tests.testing.plugins import device_binding
from tests.testing.plugins.device_binding import Binding, plan_binding

pytest_plugins = ['pytester']


@pytest.mark.parametrize(
    ('workers', 'devices', 'expected'),
    [
        (3, 2, [(0, 2), (1, 1), (0, 2)]),  # (device, workers on it) for gw0, gw1, gw2
        (8, 2, [(0, 4), (1, 4)] * 4),
        (2, 4, [(0, 1), (1, 1)]),
        (1, 1, [(0, 1)]),
    ],
)
def test_workers_go_round_robin_over_the_devices(workers, devices, expected):
    plans = [plan_binding(worker, workers, devices) for worker in range(workers)]
    assert [(plan.device, plan.workers_on_device) for plan in plans] == expected
    assert plans[0].memory_fraction == 1 / expected[0][1]


def test_no_binding_without_devices():
    assert plan_binding(0, 4, 0) is None


def test_worker_numbers():
    assert device_binding.worker_number('gw12') == 12
    with pytest.raises(pytest.UsageError, match="cannot bind xdist worker 'master' to a device"):
        device_binding.worker_number('master')


def test_a_preset_visible_device_list_is_respected():
    environ = {'CUDA_VISIBLE_DEVICES': '4, 6'}
    values = device_binding.bind_environment(Binding(worker=3, device=1, workers_on_device=2), environ)
    assert values == {'ASCEND_RT_VISIBLE_DEVICES': '1', 'CUDA_VISIBLE_DEVICES': '6'}
    assert environ == values
    with pytest.raises(pytest.UsageError, match=r"CUDA_VISIBLE_DEVICES='4' lists 1 device\(s\)"):
        device_binding.visible_value('CUDA_VISIBLE_DEVICES', 1, {'CUDA_VISIBLE_DEVICES': '4'})


def test_a_worker_takes_the_controllers_count_and_never_probes():
    env = {'OPS_TILELANG_DEVICE_COUNT': '5'}
    assert device_binding.worker_device_count({'ops_tilelang_device_count': 2}, env) == 2
    assert device_binding.worker_device_count({}, env) == 5
    assert device_binding.worker_device_count({}, {}) == 0
    with pytest.raises(ValueError, match="OPS_TILELANG_DEVICE_COUNT='two' is not a device count"):
        device_binding.worker_device_count({}, {'OPS_TILELANG_DEVICE_COUNT': 'two'})


def test_workers_sharing_the_device():
    def config(binding, workerinput=None):
        fake = types.SimpleNamespace(stash=pytest.Stash())
        if binding != 'unset':
            fake.stash[device_binding.binding_key] = binding
        if workerinput is not None:
            fake.workerinput = workerinput
        return fake

    assert device_binding.workers_sharing_device(config('unset')) == 1
    assert device_binding.workers_sharing_device(config(Binding(1, 1, 3), {'workercount': 6})) == 3
    assert device_binding.workers_sharing_device(config(None, {'workercount': 6})) == 6, 'unbound: all share'


def test_the_default_cap_sets_torchs_memory_fraction(monkeypatch):
    import torch

    from cann_ops_tilelang import config as runtime

    calls = []
    monkeypatch.setattr(runtime, 'is_ascend_available', lambda: False)
    monkeypatch.setattr(runtime, 'is_cuda_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'set_per_process_memory_fraction', lambda f, device=None: calls.append(f))
    assert device_binding.pytest_cap_device_memory(config=None, fraction=0.25) is True
    assert calls == [0.25]
    monkeypatch.setattr(runtime, 'is_cuda_available', lambda: False)
    assert device_binding.pytest_cap_device_memory(config=None, fraction=0.25) is None


NVIDIA_SMI = """GPU 0: NVIDIA H200 (UUID: GPU-aaaa)
GPU 1: NVIDIA H200 (UUID: GPU-bbbb)
  MIG 1g.18gb     Device  0: (UUID: MIG-cccc)
"""
NPU_SMI = """
        Total Count                    : 8

        NPU ID                         : 0
        Chip Count                     : 1
"""


def fake_tools(outputs):
    return lambda argv: outputs.get(argv[0])


def test_device_count_sources():
    assert count_devices({'OPS_TILELANG_DEVICE_COUNT': '3'}, fake_tools({'nvidia-smi': NVIDIA_SMI})) == DeviceInventory(
        3, None, 'OPS_TILELANG_DEVICE_COUNT'
    ), 'the override wins'
    assert count_devices({}, fake_tools({'nvidia-smi': NVIDIA_SMI})) == DeviceInventory(2, 'cuda', 'nvidia-smi')
    assert count_devices({}, fake_tools({'npu-smi': NPU_SMI})) == DeviceInventory(8, 'ascend', 'npu-smi')
    assert count_devices({'CUDA_VISIBLE_DEVICES': '1'}, fake_tools({'nvidia-smi': NVIDIA_SMI})).count == 1
    assert count_devices({'CUDA_VISIBLE_DEVICES': ''}, fake_tools({'nvidia-smi': NVIDIA_SMI})).count == 0
    assert count_devices({'ASCEND_RT_VISIBLE_DEVICES': '0,1,2'}, fake_tools({'npu-smi': NPU_SMI})).count == 3
    assert count_devices({}, fake_tools({})) == DeviceInventory(0, None, 'no npu-smi/nvidia-smi device')
    with pytest.raises(ValueError, match="OPS_TILELANG_DEVICE_COUNT='-1' is not a device count"):
        count_devices({'OPS_TILELANG_DEVICE_COUNT': '-1'}, fake_tools({}))


def test_a_missing_tool_counts_nothing(monkeypatch):
    monkeypatch.setattr(device_count.shutil, 'which', lambda name: None)
    assert device_count.run_tool(['nvidia-smi', '-L']) is None


NVIDIA_SMI_MEMORY = """143771
143771
81559
"""
NPU_SMI_LIST = """
        Total Count                    : 2

        NPU ID                         : 0
        Chip Count                     : 1

        NPU ID                         : 1
        Chip Count                     : 1
"""


def npu_smi_usages(npu_id, hbm_mb):
    """`npu-smi info -t usages -i <id>` of a one-chip NPU.

    Not captured on an Ascend 950: the layout (one 'Field(Unit) : value' line per metric, padded with
    spaces) follows the sample in Huawei's npu-smi reference for `info -t usages`; the parser reads
    only the 'HBM Capacity(MB)' lines, one per chip.
    """
    return f"""
        NPU ID                         : {npu_id}
        Chip Count                     : 1

        DDR Capacity(MB)               : 15171
        DDR Usage Rate(%)              : 3
        DDR Hugepages Total(page)      : 0
        DDR Hugepages Usage Rate(%)    : 0
        HBM Capacity(MB)               : {hbm_mb}
        HBM Usage Rate(%)              : 0
        Aicore Usage Rate(%)           : 0
        Aicpu Usage Rate(%)            : 0
        Ctrlcpu Usage Rate(%)          : 1
        DDR Bandwidth Usage Rate(%)    : 0
        HBM Bandwidth Usage Rate(%)    : 0
        Chip ID                        : 0
"""


def fake_commands(outputs):
    """A vendor tool that knows whole command lines; everything else is not installed."""
    calls = []

    def tool(argv):
        calls.append(' '.join(argv))
        return outputs.get(' '.join(argv))

    tool.calls = calls
    return tool


NVIDIA_MEMORY_QUERY = 'nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits'
ASCEND = {
    'npu-smi info -l': NPU_SMI_LIST,
    'npu-smi info -t usages -i 0': npu_smi_usages(0, 65536),
    'npu-smi info -t usages -i 1': npu_smi_usages(1, 32768),
}


def test_the_vendor_tool_outputs_parse():
    assert device_count.parse_nvidia_smi_memory(NVIDIA_SMI_MEMORY) == [143771, 143771, 81559]
    assert device_count.parse_nvidia_smi_memory('[N/A]\n81559\n') == [None, 81559], 'positions stay indices'
    assert device_count.parse_npu_smi_ids(NPU_SMI_LIST) == [0, 1]
    assert device_count.parse_npu_smi_hbm(npu_smi_usages(3, 65536)) == [65536]
    assert device_count.parse_npu_smi_hbm('HBM Usage Rate(%) : 6') == []


@pytest.mark.parametrize(
    ('environ', 'expected'),
    [
        ({}, 81559),  # the smallest GPU
        ({'CUDA_VISIBLE_DEVICES': '0,1'}, 143771),  # index entries select their GPUs
        ({'CUDA_VISIBLE_DEVICES': ' 1 '}, 143771),
        ({'CUDA_VISIBLE_DEVICES': 'GPU-aaaa'}, 81559),  # not resolved: all GPUs count, the safe answer
        ({'CUDA_VISIBLE_DEVICES': '7'}, None),  # no such GPU
        ({'CUDA_VISIBLE_DEVICES': ''}, None),  # no GPU visible
        ({'ASCEND_RT_VISIBLE_DEVICES': '0'}, 81559),  # the other vendor's variable does not apply
    ],
)
def test_cuda_device_memory_respects_the_visible_devices(environ, expected):
    assert device_memory_mb(environ, fake_commands({NVIDIA_MEMORY_QUERY: NVIDIA_SMI_MEMORY})) == expected


def test_ascend_device_memory_is_read_per_npu():
    tool = fake_commands(ASCEND)
    assert device_memory_mb({}, tool) == 32768
    assert tool.calls == ['npu-smi info -l', 'npu-smi info -t usages -i 0', 'npu-smi info -t usages -i 1']
    assert device_memory_mb({'ASCEND_RT_VISIBLE_DEVICES': '0'}, fake_commands(ASCEND)) == 65536
    unreadable = fake_commands({**ASCEND, 'npu-smi info -t usages -i 1': 'HBM Usage Rate(%) : 0'})
    assert device_memory_mb({}, unreadable) is None, 'one NPU unknown: the smallest is unknown'


def test_device_memory_override_and_unknown_memory():
    tool = fake_commands({NVIDIA_MEMORY_QUERY: NVIDIA_SMI_MEMORY})
    assert device_memory_mb({'OPS_TILELANG_DEVICE_MEMORY_MB': ' 143771 '}, tool) == 143771, 'the override wins'
    assert tool.calls == [], 'and no tool runs'
    assert device_memory_mb({'OPS_TILELANG_DEVICE_MEMORY_MB': ''}, tool) == 81559, 'empty: unset'
    assert device_memory_mb({}, fake_commands({})) is None, 'no tool, no device'
    assert device_memory_mb({}, fake_commands({NVIDIA_MEMORY_QUERY: ''})) is None


@pytest.mark.parametrize('value', ['0', '-5', 'lots', '1.5', '80G'])
def test_a_bad_device_memory_override_is_an_error_naming_it(value):
    with pytest.raises(ValueError, match=f"OPS_TILELANG_DEVICE_MEMORY_MB='{value}' is not a device memory size"):
        device_memory_mb({'OPS_TILELANG_DEVICE_MEMORY_MB': value}, fake_commands({}))


BINDING_CONFTEST = """
import json
import os

pytest_plugins = ['tests.testing.plugins.device_binding']
SEEN = ('CUDA_VISIBLE_DEVICES', 'ASCEND_RT_VISIBLE_DEVICES')


def note(config, event, **extra):
    worker = config.workerinput['workerid']
    line = {'event': event, **{var: os.environ.get(var) for var in SEEN}, **extra}
    with open(config.rootpath / f'{worker}.jsonl', 'a') as f:
        f.write(json.dumps(line) + '\\n')


def pytest_configure(config):
    config.addinivalue_line('markers', 'npu: needs the (fake) device')
    if hasattr(config, 'workerinput'):
        note(config, 'configure')  # what any later plugin or conftest code sees


def pytest_cap_device_memory(config, fraction):
    note(config, 'cap', fraction=fraction)
    return True
"""

BINDING_TESTS = """
import pytest


def test_1_cpu(pytestconfig):
    from conftest import note
    note(pytestconfig, 'cpu test')


@pytest.mark.npu
def test_2_device(pytestconfig):
    from conftest import note
    note(pytestconfig, 'device test')


@pytest.mark.npu
def test_3_device(pytestconfig):
    from conftest import note
    note(pytestconfig, 'device test')
"""


def test_xdist_workers_are_bound_before_configure_and_capped_at_their_first_device_test(pytester, monkeypatch):
    monkeypatch.setenv('PYTEST_DISABLE_PLUGIN_AUTOLOAD', '1')
    monkeypatch.setenv('OPS_TILELANG_DEVICE_COUNT', '2')
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '5,7')
    monkeypatch.delenv('ASCEND_RT_VISIBLE_DEVICES', raising=False)
    pytester.makeconftest(BINDING_CONFTEST)
    pytester.makepyfile(test_bound=BINDING_TESTS)
    result = pytester.runpytest_subprocess('-p', 'xdist', '-n', '3', '--dist', 'each')
    result.assert_outcomes(passed=9)
    result.stdout.fnmatch_lines(
        ['device binding: 3 xdist workers over 2 device(s) (OPS_TILELANG_DEVICE_COUNT), up to 2 per device']
    )

    def events(worker):
        lines = (pytester.path / f'{worker}.jsonl').read_text().splitlines()
        return [json.loads(line) for line in lines]

    shared = {'CUDA_VISIBLE_DEVICES': '5', 'ASCEND_RT_VISIBLE_DEVICES': '0'}
    capped = [
        {'event': 'configure', **shared},
        {'event': 'cpu test', **shared},
        {'event': 'cap', 'fraction': 0.5, **shared},
        {'event': 'device test', **shared},
        {'event': 'device test', **shared},
    ]
    assert events('gw0') == capped, 'gw0 shares device 0 with gw2: capped to half, once, at its first device test'
    assert events('gw2') == capped
    alone = {'CUDA_VISIBLE_DEVICES': '7', 'ASCEND_RT_VISIBLE_DEVICES': '1'}
    assert events('gw1') == [
        {'event': 'configure', **alone},
        {'event': 'cpu test', **alone},
        {'event': 'device test', **alone},
        {'event': 'device test', **alone},
    ], 'gw1 has device 1 alone: no cap'
