"""The committed baselines and device memory profiles parse and validate, in the CPU tier.

Only a device run reads them otherwise (verify-baseline, the two-phase run's marking), so a file broken by a
hand edit or a bad merge would pass every CPU check. Each file is loaded with the loader the plugins use
(tests/testing/baseline.py, tests/testing/mem_profiles.py) and must be what pytest would have written: the
canonical text of its records, records only of its own test module's tests (the loaders check the node IDs'
module), no empty file (a refresh deletes or never writes one), baselines only of public operators. Records of
tests since renamed are not errors here: the plugins keep and list them as stale until a full refresh. Every
failure names the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.testing import baseline, mem_profiles
from tests.testing.files import CorruptFileError
from tests.testing.timing import public_operator_names

ROOT = Path(__file__).resolve().parents[2]
BASELINES = sorted(ROOT.glob('tests/*/benchmark/*.jsonl'))
PROFILES = sorted(ROOT.glob(f'tests/*/{mem_profiles.PROFILE_DIR}/*.json'))


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _test_module(record_file: Path) -> str:
    """The node ID of the test module a record file belongs to: tests/<domain>/<kind>/test_x.* -> test_x.py."""
    return f'{_name(record_file.parent.parent)}/{record_file.stem}.py'


def _load(path: Path, loader, *args):
    """`loader(path, *args)`, with any error it raises (not only CorruptFileError) naming the file."""
    try:
        return loader(path, *args)
    except CorruptFileError:
        raise
    except Exception as exc:
        pytest.fail(f'{_name(path)}: the loader raised {type(exc).__name__}: {exc}', pytrace=False)


def test_the_committed_records_are_found():
    assert BASELINES, 'no baseline file under tests/*/benchmark/'
    assert PROFILES, f'no profile under tests/*/{mem_profiles.PROFILE_DIR}/'


@pytest.mark.parametrize('path', BASELINES, ids=_name)
def test_committed_baseline_is_valid(path):
    test_module = _test_module(path)
    assert (ROOT / test_module).is_file(), f'{_name(path)}: no test module {test_module} beside it'
    records = _load(path, baseline.load_baseline, test_module)
    assert records, f'{_name(path)}: no record (a refresh never writes an empty file: delete it)'
    assert path.read_text(encoding='utf-8') == baseline.dumps_baseline(records), (
        f'{_name(path)}: not the text pytest writes (one record a line, sorted by key, fields in order): '
        'edited by hand? Refresh it (--refresh-baseline)'
    )
    stale = baseline.stale_records(records, public_operator_names())
    assert not stale, f'{_name(path)}: records of operators that are not public: ' + ', '.join(
        sorted({record['kernel'] for record in stale})
    )


@pytest.mark.parametrize('path', PROFILES, ids=_name)
def test_committed_memory_profile_is_valid(path):
    test_module = _test_module(path)
    assert (ROOT / test_module).is_file(), f'{_name(path)}: no test module {test_module} beside it'
    records = _load(path, mem_profiles.load_profile, test_module)
    assert records, f'{_name(path)}: no record (a full refresh deletes such a file)'
    assert path.read_text(encoding='utf-8') == mem_profiles.render_profile(test_module, records), (
        f'{_name(path)}: not the canonical text pytest writes (sorted keys, 2-space indent): edited by hand? '
        'Refresh it (--refresh-mem)'
    )


# ---------------------------------------------------------------- a corrupt file is named


def _first(paths: list[Path]) -> Path:
    if not paths:
        pytest.skip('no committed file of this kind')
    return paths[0]


def _baseline_corruptions(text: str) -> dict[str, str]:
    line = json.loads(text.splitlines()[0])
    return {
        'truncated': text[: len(text) // 2],
        'not an object': '[1, 2]\n',
        'missing field': json.dumps({k: v for k, v in line.items() if k != 'time_us'}) + '\n',
        'wrong type': json.dumps({**line, 'time_us': 'fast'}) + '\n',
        'not finite': json.dumps({**line, 'time_us': float('nan')}) + '\n',
        'params_id': json.dumps({**line, 'params_id': 'other'}) + '\n',
        'duplicate key': text.splitlines()[0] + '\n' + text.splitlines()[0] + '\n',
        'merge conflict': '<<<<<<< HEAD\n' + text,
    }


def _profile_corruptions(text: str) -> dict[str, str]:
    data = json.loads(text)
    node_id, record = next(iter(data['records'].items()))
    return {
        'truncated': text[: len(text) // 2],
        'empty': '',
        'another format': json.dumps({**data, 'format': 'other'}),
        'another module': json.dumps({**data, 'test_file': 'tests/other/test_other.py'}),
        'negative peak': json.dumps({**data, 'records': {node_id: {**record, 'peak_mb': -1.0}}}),
        'missing field': json.dumps({**data, 'records': {node_id: {'peak_mb': 1.0}}}),
        'merge conflict': '<<<<<<< HEAD\n' + text,
    }


@pytest.mark.parametrize('kind', ['baseline', 'profile'])
def test_a_corrupt_copy_of_a_committed_file_is_refused_with_its_path(tmp_path, kind):
    if kind == 'baseline':
        source, corruptions, loader = _first(BASELINES), _baseline_corruptions, baseline.load_baseline
    else:
        source, corruptions, loader = _first(PROFILES), _profile_corruptions, mem_profiles.load_profile
    test_module = _test_module(source)
    for what, text in corruptions(source.read_text(encoding='utf-8')).items():
        copy = tmp_path / f'{what.replace(" ", "_")}{source.suffix}'
        copy.write_text(text, encoding='utf-8')
        with pytest.raises(CorruptFileError) as info:
            loader(copy, test_module)
        assert str(info.value).startswith(f'{copy}: '), (what, str(info.value))
