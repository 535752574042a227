"""Without a C++ compiler the Ascend C emulator stops with one error that says what to install."""

from __future__ import annotations

import pytest
from cann_ops_ascend_emu import driver


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """A cache with no emulator runtime yet, so that the next launch has to compile it."""
    monkeypatch.setenv(driver.ENV_CACHE_DIR, str(tmp_path / 'cache'))


@pytest.mark.usefixtures('empty_cache')
def test_no_gpp_on_path_is_one_error_naming_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, 'CXX', 'g++')
    monkeypatch.setenv('PATH', str(tmp_path / 'nothing-here'))  # no compiler on PATH
    with pytest.raises(driver.CompilerNotFoundError) as raised:
        driver._runtime_object()
    message = str(raised.value)
    assert "'g++' (CXX) was not found" in message
    assert 'apt-get install g++' in message
    assert '\n' not in message
    assert isinstance(raised.value, driver.EmulatorError)
    assert isinstance(raised.value, RuntimeError)


@pytest.mark.usefixtures('empty_cache')
def test_a_cxx_that_does_not_exist_is_named(monkeypatch):
    monkeypatch.setattr(driver, 'CXX', '/opt/no-such-toolchain/bin/g++-99')
    with pytest.raises(driver.CompilerNotFoundError, match=r"'/opt/no-such-toolchain/bin/g\+\+-99' \(CXX\)"):
        driver._runtime_object()


@pytest.mark.usefixtures('empty_cache')
def test_a_compiler_without_cxx20_is_told_so(tmp_path, monkeypatch):
    fake = tmp_path / 'old-g++'
    fake.write_text(
        '#!/bin/sh\necho "g++: error: unrecognized command-line option \'-std=c++20\'" >&2\nexit 1\n', encoding='utf-8'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(driver, 'CXX', str(fake))
    with pytest.raises(driver.EmulatorError, match='does not know C\\+\\+20: the emulator needs g\\+\\+ 10 or newer'):
        driver._runtime_object()
