"""The project's pytest markers have one home, cann_ops_pipeline.conventions.MARKERS: what pytest sees is that."""

from __future__ import annotations

import re

from cann_ops_pipeline import conventions
from cann_ops_pipeline.phases import ROOT

# pytest's own markers and those of the plugins this project uses; everything else must be the project's.
_NOT_OURS = {'parametrize', 'skip', 'skipif', 'xfail', 'usefixtures', 'filterwarnings'}


def test_pytest_sees_every_project_marker_in_its_one_wording(pytestconfig):
    # Other plugins may register a marker of the same name (pytest-benchmark's `benchmark`): the project's own
    # line must be there, once, in its one wording.
    lines = [line.strip() for line in pytestconfig.getini('markers')]
    for name, description in conventions.MARKERS.items():
        assert lines.count(f'{name}: {description}') == 1, name


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
