"""The project's pytest markers have one home, cann_ops_pipeline.conventions.MARKERS: what pytest sees is that."""

from __future__ import annotations

import re

import pytest

from cann_ops_pipeline import conventions
from cann_ops_pipeline.phases import ROOT

# pytest's own markers and those of the plugins this project uses; everything else must be the project's.
_NOT_OURS = {'parametrize', 'skip', 'skipif', 'xfail', 'usefixtures', 'filterwarnings'}


def _registered(config: pytest.Config) -> dict[str, str]:
    """name -> description of every `markers` ini line of this run (pytest's and plugins' included)."""
    lines = config.getini('markers')
    return dict(line.split(':', 1) for line in lines if ':' in line) | {line: '' for line in lines if ':' not in line}


def test_pytest_sees_every_project_marker_in_its_one_wording(pytestconfig):
    registered = _registered(pytestconfig)
    for name, description in conventions.MARKERS.items():
        assert registered.get(name, '').strip() == description, name
    project_lines = [line for line in pytestconfig.getini('markers') if line.split(':', 1)[0] in conventions.MARKERS]
    assert len(project_lines) == len(conventions.MARKERS)  # each registered once, by one plugin


def test_pyproject_declares_no_marker():
    pyproject = (ROOT / 'pyproject.toml').read_text(encoding='utf-8')
    pytest_ini = pyproject.split('[tool.pytest.ini_options]', 1)[1].split('\n[', 1)[0]
    assert not re.search(r'^markers\s*=', pytest_ini, re.MULTILINE)


def test_the_plugins_word_no_marker_themselves():
    plugins = sorted((ROOT / 'tests' / 'testing' / 'plugins').glob('*.py'))
    for path in plugins:
        for line in re.findall(r"addinivalue_line\(\s*'markers',\s*([^)]*)\)", path.read_text(encoding='utf-8')):
            assert line.startswith('marker_line('), f'{path.name}: {line}'


def test_every_marker_the_tests_use_is_declared():
    used = set()
    for path in (ROOT / 'tests').rglob('*.py'):
        used |= set(re.findall(r'\bpytest\.mark\.([a-z_]+)', path.read_text(encoding='utf-8')))
    assert used - _NOT_OURS - set(conventions.MARKERS) == set()
