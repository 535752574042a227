"""Child pytest runs (pytester, subprocesses) import the project from the source tree."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _project_on_pythonpath(monkeypatch):
    paths = [str(ROOT), str(ROOT / 'packages'), os.environ.get('PYTHONPATH', '')]
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join(p for p in paths if p))
