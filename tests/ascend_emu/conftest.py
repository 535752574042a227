"""The emulator's own tests check the Ascend C emulation that stands in for an NPU where there is none; on a host
with an accelerator, level 0 leaves them to level 1 (tests.testing.generator.skip_device_stand_in_at_level_0)."""

import pytest

from tests.testing.generator import skip_device_stand_in_at_level_0


@pytest.fixture(autouse=True)
def _emulator_tests_from_level_1_on_accelerator_hosts():
    skip_device_stand_in_at_level_0('Ascend C emulator')
