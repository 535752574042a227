"""The bytecode cache of the pipeline's pytest steps (cann_ops_pipeline.bytecode_cache)."""

import os
import subprocess
import sys

import pytest

from cann_ops_pipeline.bytecode_cache import BYTECODE_CACHE_ENV, bytecode_env, default_directory

pytest_plugins = ['pytester']


def test_nothing_changes_where_python_writes_bytecode_itself():
    assert bytecode_env({}) == {}
    assert bytecode_env({'PYTHONDONTWRITEBYTECODE': '', BYTECODE_CACHE_ENV: '/x'}) == {}


@pytest.mark.parametrize(
    ('extra', 'prefix'),
    [
        ({}, str(default_directory())),
        ({BYTECODE_CACHE_ENV: '/cache/here'}, '/cache/here'),
        ({BYTECODE_CACHE_ENV: ' '}, str(default_directory())),
        ({BYTECODE_CACHE_ENV: '/cache/here', 'PYTHONPYCACHEPREFIX': '/theirs'}, '/theirs'),
    ],
)
def test_bytecode_goes_to_a_directory_of_its_own(extra, prefix):
    assert bytecode_env({'PYTHONDONTWRITEBYTECODE': '1', **extra}) == {
        'PYTHONDONTWRITEBYTECODE': '',
        'PYTHONPYCACHEPREFIX': prefix,
    }


@pytest.mark.parametrize('off', ['off', 'OFF', ' off '])
def test_off_keeps_the_environment(off):
    assert bytecode_env({'PYTHONDONTWRITEBYTECODE': '1', BYTECODE_CACHE_ENV: off}) == {}


def test_a_process_with_that_environment_caches_under_the_prefix_only(tmp_path):
    """Python reads the emptied PYTHONDONTWRITEBYTECODE as unset: an import writes its bytecode under the
    prefix, none beside the source."""
    source = tmp_path / 'src'
    source.mkdir()
    (source / 'cached_module.py').write_text('VALUE = 1\n')
    prefix = tmp_path / 'prefix'
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPYCACHEPREFIX'}
    env.update({'PYTHONDONTWRITEBYTECODE': '1', BYTECODE_CACHE_ENV: str(prefix)})
    env.update(bytecode_env(env))
    code = 'import sys; sys.path.insert(0, sys.argv[1]); import cached_module'
    subprocess.run([sys.executable, '-c', code, str(source)], env=env, check=True)
    (written,) = prefix.rglob('cached_module.*.pyc')
    assert written.parent == prefix / source.relative_to(source.anchor)
    assert not (source / '__pycache__').exists()


def test_pytester_projects_never_get_stale_bytecode(pytester):
    """A test file rewritten in place at the same size and mtime (two writes within a second) runs as
    rewritten: tests/conftest.py's fixture has pytester tests write no bytecode for what it makes."""
    test_file = pytester.makepyfile(test_value='def test_value():\n    assert 1 == 1\n')
    pytester.runpytest('-p', 'no:cacheprovider').assert_outcomes(passed=1)
    stat = test_file.stat()
    test_file.write_text('def test_value():\n    assert 1 == 2\n')
    os.utime(test_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert sys.dont_write_bytecode
    pytester.runpytest('-p', 'no:cacheprovider').assert_outcomes(failed=1)
