"""The bytecode cache of the pipeline's pytest steps (cann_ops_pipeline.bytecode_cache)."""

import os
import subprocess
import sys

import pytest

from cann_ops_pipeline.bytecode_cache import BYTECODE_CACHE_ENV, bytecode_env, default_directory, torch_lacks_bytecode

pytest_plugins = ['pytester']


def lacking() -> bool:
    return True


def having() -> bool:
    return False


@pytest.mark.parametrize('lacks', [lacking, having])
def test_nothing_changes_where_python_writes_bytecode_itself(lacks):
    assert bytecode_env({}, lacks_bytecode=lacks) == {}
    assert bytecode_env({'PYTHONDONTWRITEBYTECODE': '', BYTECODE_CACHE_ENV: '/x'}, lacks_bytecode=lacks) == {}


def cache(prefix: str) -> dict[str, str]:
    return {'PYTHONDONTWRITEBYTECODE': '', 'PYTHONPYCACHEPREFIX': prefix}


@pytest.mark.parametrize(
    ('extra', 'lacks', 'expected'),
    [
        ({}, lacking, cache(str(default_directory()))),
        ({}, having, {}),  # torch has its bytecode: a prefix would only compile it again
        ({BYTECODE_CACHE_ENV: ' '}, lacking, cache(str(default_directory()))),
        ({BYTECODE_CACHE_ENV: ' '}, having, {}),
        ({BYTECODE_CACHE_ENV: '/cache/here'}, lacking, cache('/cache/here')),
        ({BYTECODE_CACHE_ENV: '/cache/here'}, having, cache('/cache/here')),  # asked for
        ({'PYTHONPYCACHEPREFIX': '/theirs'}, lacking, cache('/theirs')),
        ({BYTECODE_CACHE_ENV: '/cache/here', 'PYTHONPYCACHEPREFIX': '/theirs'}, having, cache('/theirs')),
    ],
)
def test_where_the_bytecode_goes(extra, lacks, expected):
    assert bytecode_env({'PYTHONDONTWRITEBYTECODE': '1', **extra}, lacks_bytecode=lacks) == expected


@pytest.mark.parametrize('off', ['off', 'OFF', ' off '])
def test_off_keeps_the_environment(off):
    assert bytecode_env({'PYTHONDONTWRITEBYTECODE': '1', BYTECODE_CACHE_ENV: off}, lacks_bytecode=lacking) == {}


def test_torch_without_bytecode_beside_its_sources_is_found_without_importing_it(tmp_path, monkeypatch):
    package = tmp_path / 'torch'
    package.mkdir()
    (package / '__init__.py').write_text('raise ImportError("imported")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'torch')
    try:
        assert torch_lacks_bytecode()
        cached = package / '__pycache__' / f'__init__.{sys.implementation.cache_tag}.pyc'
        cached.parent.mkdir()
        cached.write_bytes(b'')
        assert not torch_lacks_bytecode()
    finally:
        monkeypatch.undo()  # this process's own torch back in sys.modules before anything else runs


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
