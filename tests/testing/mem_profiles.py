"""The device memory profile files: schema, validation on load, deterministic rendering, update rules.

One file per test module, beside it: tests/engram/test_x.py -> tests/engram/npu_mem_profiles/test_x.json,
holding one record per device test, keyed by node ID. The schema (version 1) is documented in
tests/README.md. Rendering is canonical (sorted keys, 2-space indent, trailing newline), so a record
that is not re-measured keeps its bytes and a file whose records did not change is not rewritten.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Collection, Mapping
from pathlib import Path

from tests.testing.files import CorruptFileError, atomic_write_text

FORMAT = 'cann_ops_tilelang.npu_mem_profile'
VERSION = 1
UNIT = 'MiB'
MIB = 1 << 20
PROFILE_DIR = 'npu_mem_profiles'

TOP_LEVEL_FIELDS = frozenset({'format', 'version', 'test_file', 'unit', 'records'})
NUMBER_FIELDS = ('allocated_peak_mb', 'reserved_peak_mb', 'peak_mb')
NULLABLE_NUMBER_FIELDS = ('outside_allocator_mb',)
TEXT_FIELDS = ('method', 'device')
RECORD_FIELDS = frozenset(NUMBER_FIELDS + NULLABLE_NUMBER_FIELDS + TEXT_FIELDS)


def profile_path(test_path: str | os.PathLike) -> Path:
    """tests/engram/test_x.py -> tests/engram/npu_mem_profiles/test_x.json"""
    test_path = Path(test_path)
    return test_path.parent / PROFILE_DIR / f'{test_path.stem}.json'


def _mb(num_bytes: int) -> float:
    return round(num_bytes / MIB, 3)


def make_record(
    *, allocated_bytes: int, reserved_bytes: int, outside_allocator_bytes: int | None, method: str, device: str
) -> dict:
    """A record; `peak_mb` (what the threshold compares) is the reserved peak plus memory outside the allocator."""
    allocated, reserved = _mb(allocated_bytes), _mb(reserved_bytes)
    outside = None if outside_allocator_bytes is None else _mb(outside_allocator_bytes)
    return {
        'allocated_peak_mb': allocated,
        'reserved_peak_mb': reserved,
        'outside_allocator_mb': outside,
        'peak_mb': round(max(allocated, reserved) + (outside or 0.0), 3),
        'method': method,
        'device': device,
    }


def render_profile(test_file: str, records: Mapping[str, dict]) -> str:
    """The canonical text of a profile file."""
    data = {'format': FORMAT, 'version': VERSION, 'test_file': test_file, 'unit': UNIT, 'records': dict(records)}
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + '\n'


def _is_number(value: object) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and value >= 0
    except OverflowError:  # an integer past float's range: no MiB figure
        return False


def _check_record(path: Path, nodeid: str, record: object) -> None:
    where = f'record {nodeid!r}'
    if not isinstance(record, dict):
        raise CorruptFileError(path, f'{where} is a {type(record).__name__}, expected an object')
    if set(record) != RECORD_FIELDS:
        missing, unknown = sorted(RECORD_FIELDS - set(record)), sorted(set(record) - RECORD_FIELDS)
        raise CorruptFileError(path, f'{where} has missing fields {missing} / unknown fields {unknown}')
    for name in NUMBER_FIELDS:
        if not _is_number(record[name]):
            raise CorruptFileError(path, f'{where}: {name} = {record[name]!r} is not a number of MiB >= 0')
    for name in NULLABLE_NUMBER_FIELDS:
        if record[name] is not None and not _is_number(record[name]):
            raise CorruptFileError(path, f'{where}: {name} = {record[name]!r} is neither null nor a number >= 0')
    for name in TEXT_FIELDS:
        if not isinstance(record[name], str):
            raise CorruptFileError(path, f'{where}: {name} = {record[name]!r} is not a string')


def parse_profile(text: str, path: str | os.PathLike, test_file: str) -> dict[str, dict]:
    """The records of a profile of `test_file` (its node ID, e.g. 'tests/engram/test_x.py').

    Anything but a valid version-1 profile of that very module raises CorruptFileError naming `path`.
    """
    path = Path(path)
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise CorruptFileError(path, f'not valid JSON (truncated or hand-edited?): {exc}') from None
    if not isinstance(data, dict) or data.get('format') != FORMAT:
        found = data.get('format') if isinstance(data, dict) else type(data).__name__
        raise CorruptFileError(path, f'not an NPU memory profile: format {found!r}, expected {FORMAT!r}')
    if type(data.get('version')) is not int or data['version'] != VERSION:  # not 1.0, not True
        raise CorruptFileError(path, f'schema version {data.get("version")!r} is not supported (expected {VERSION})')
    if set(data) != TOP_LEVEL_FIELDS:
        missing, unknown = sorted(TOP_LEVEL_FIELDS - set(data)), sorted(set(data) - TOP_LEVEL_FIELDS)
        raise CorruptFileError(path, f'missing fields {missing} / unknown fields {unknown}')
    if data['test_file'] != test_file:
        raise CorruptFileError(path, f'is the profile of {data["test_file"]!r}, not of {test_file!r}')
    if data['unit'] != UNIT:
        raise CorruptFileError(path, f'unit {data["unit"]!r} is not supported (expected {UNIT!r})')
    records = data['records']
    if not isinstance(records, dict):
        raise CorruptFileError(path, f'records is a {type(records).__name__}, expected an object')
    for nodeid, record in records.items():
        if not nodeid.startswith(f'{test_file}::'):
            raise CorruptFileError(path, f'record {nodeid!r} is not a node ID of {test_file!r}')
        _check_record(path, nodeid, record)
    return records


def load_profile(path: str | os.PathLike, test_file: str) -> dict[str, dict]:
    """The validated records of the profile at `path`; {} when there is no file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        text = raw.decode('utf-8')
    except UnicodeDecodeError as exc:
        raise CorruptFileError(path, f'not UTF-8 text: {exc}') from None
    return parse_profile(text, path, test_file)


@dataclasses.dataclass(frozen=True)
class ProfileUpdate:
    """New records of one file and what changed: stale IDs are kept, removed ones were dropped."""

    records: dict[str, dict]
    added: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()


def update_records(
    old: Mapping[str, dict],
    measured: Mapping[str, dict],
    *,
    collected: Collection[str] | None,
    missing_only: bool,
    prune: bool,
) -> ProfileUpdate:
    """Merge fresh measurements into a file's records.

    `missing_only` adds only node IDs without a record. Records whose node ID is not in `collected`
    (None: the module was not collected) are dropped with `prune`, else reported as stale.
    """
    records = dict(old)
    for nodeid, record in measured.items():
        if not (missing_only and nodeid in old):
            records[nodeid] = record
    added = tuple(sorted(set(records) - set(old)))
    updated = tuple(sorted(k for k in measured if k in old and records[k] != old[k]))
    gone = () if collected is None else tuple(sorted(set(records) - set(collected)))
    if prune:
        for nodeid in gone:
            del records[nodeid]
        return ProfileUpdate(records, added, updated, removed=gone)
    return ProfileUpdate(records, added, updated, stale=gone)


def write_profile(path: str | os.PathLike, test_file: str, records: Mapping[str, dict]) -> str:
    """Write the canonical file atomically.

    Returns 'written', 'unchanged' (same bytes: not touched), 'deleted' (no record left) or 'absent'
    (no record and no file).
    """
    path = Path(path)
    if not records:
        if path.exists():
            path.unlink()
            return 'deleted'
        return 'absent'
    text = render_profile(test_file, records)
    if path.exists() and path.read_bytes() == text.encode('utf-8'):
        return 'unchanged'
    atomic_write_text(path, text)
    return 'written'
