"""Performance baseline records and files: schema, JSONL I/O, refresh merge and verify verdicts.

One file per test file: `tests/engram/test_x.py` -> `tests/engram/benchmark/test_x.jsonl`, one
JSON object per line, sorted by the record key (kernel, operation, params_id, cluster), fields in
the order of FIELDS. Only pytest writes these files (`--refresh-baseline`), atomically.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from tests.testing.bench import format_param_value, make_param_id
from tests.testing.files import CorruptFileError
from tests.testing.host_timing import HOST_MIN_DELTA_US_FLOOR, HOST_REGRESSION_THRESHOLD_FLOOR, HOST_TIMING_BACKEND

FIELDS = (
    'kernel',
    'operation',
    'params_id',
    'cluster',
    'time_us',
    'bandwidth_gbs',
    'timing_backend',
    'params',
    'extras',
    'environment',
    'node_id',
)
_NUMBER_DIGITS = 3  # microseconds to the nanosecond, GB/s to the MB/s

Key = tuple[str, str, str, str]


def baseline_path(test_file: str | os.PathLike) -> Path:
    """Where the baselines of a test file live: `<its folder>/benchmark/<its stem>.jsonl`."""
    test_file = Path(test_file)
    return test_file.parent / 'benchmark' / f'{test_file.stem}.jsonl'


def record_key(record: Mapping) -> Key:
    return (record['kernel'], record['operation'], record['params_id'], record['cluster'])


def format_key(key: Key) -> str:
    kernel, operation, params_id, cluster = key
    return f'{kernel} {operation} [{params_id}] on {cluster}'


def json_safe(value, where: str):
    """`value` as plain JSON data: torch dtypes as in test IDs ('bf16'), tuples as lists, finite floats."""
    if isinstance(value, torch.dtype):
        return format_param_value(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)  # plain str, also for subclasses such as torch.__version__
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f'{where} is {value}: baselines hold finite numbers only')
        return float(value)
    if isinstance(value, (list, tuple)):
        return [json_safe(v, f'{where}[{i}]') for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f'{where} has the key {k!r}: keys must be strings')
            out[k] = json_safe(v, f'{where}[{k!r}]')
        return out
    raise TypeError(f'{where} is a {type(value).__name__} ({value!r}): not JSON data (use numbers, strings, dtypes)')


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_time_us(value, name: str = 'time_us') -> float:
    if not _is_number(value) or value <= 0:
        raise ValueError(f'{name} must be a finite number of microseconds > 0, got {value!r}')
    return float(value)


def check_bandwidth_gbs(value) -> float | None:
    if value is None:
        return None
    if not _is_number(value) or value < 0:
        raise ValueError(f'bandwidth_gbs must be None or a finite number of GB/s >= 0, got {value!r}')
    return float(value)


def make_record(
    *,
    kernel: str,
    operation: str,
    params: Mapping,
    time_us: float,
    bandwidth_gbs: float | None,
    extras: Mapping | None,
    cluster: str,
    timing_backend: str,
    environment: Mapping,
    node_id: str,
) -> dict:
    """A validated record, fields in FIELDS order, numbers rounded to _NUMBER_DIGITS."""
    for name, value in (('kernel', kernel), ('operation', operation), ('cluster', cluster)):
        if not isinstance(value, str) or not value or value != value.strip():
            raise ValueError(f'{name} must be a non-empty string without surrounding spaces, got {value!r}')
    if not isinstance(params, Mapping):
        raise TypeError(f'params must be the dict of test parameters, got {type(params).__name__}')
    if extras is not None and not isinstance(extras, Mapping):
        raise TypeError(f'extras must be None or a dict, got {type(extras).__name__}')
    time_us = check_time_us(time_us)
    bandwidth_gbs = check_bandwidth_gbs(bandwidth_gbs)
    record = {
        'kernel': kernel,
        'operation': operation,
        'params_id': make_param_id(params),
        'cluster': cluster,
        'time_us': round(time_us, _NUMBER_DIGITS),
        'bandwidth_gbs': None if bandwidth_gbs is None else round(bandwidth_gbs, _NUMBER_DIGITS),
        'timing_backend': timing_backend,
        'params': json_safe(params, 'params'),
        'extras': None if extras is None else json_safe(extras, 'extras'),
        'environment': json_safe(environment, 'environment'),
        'node_id': node_id,
    }
    check_record(record)
    return record


def _reject_constant(name: str):
    raise ValueError(f'{name} is not a finite number')


def check_record(obj) -> dict:
    """`obj` if it is a well-formed record, else ValueError saying what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f'a record must be a JSON object, got {type(obj).__name__}')
    missing = [f for f in FIELDS if f not in obj]
    if missing:
        raise ValueError(f'missing field(s) {", ".join(missing)}')
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise ValueError(f'unknown field(s) {", ".join(unknown)}')
    for name in ('kernel', 'operation', 'params_id', 'cluster', 'timing_backend', 'node_id'):
        if not isinstance(obj[name], str) or not obj[name]:
            raise ValueError(f'{name} must be a non-empty string, got {obj[name]!r}')
    check_time_us(obj['time_us'])
    check_bandwidth_gbs(obj['bandwidth_gbs'])
    for name, optional in (('params', False), ('extras', True), ('environment', False)):
        if not (isinstance(obj[name], dict) or (optional and obj[name] is None)):
            raise ValueError(f'{name} must be an object{" or null" if optional else ""}, got {obj[name]!r}')
    if not all(isinstance(v, str) or v is None for v in obj['environment'].values()):
        raise ValueError(f'environment values must be strings or null, got {obj["environment"]!r}')
    expected_id = make_param_id(obj['params'])
    if obj['params_id'] != expected_id:
        raise ValueError(f'params_id {obj["params_id"]!r} does not match params (expected {expected_id!r})')
    return obj


def load_baseline(path: str | os.PathLike, test_file: str | None = None) -> list[dict]:
    """The records of a baseline file ([] if it does not exist); CorruptFileError names file and line.

    `test_file`: the node ID of the test module the file belongs to (`tests/engram/test_x.py`); a record
    whose `node_id` is not one of its tests is an error (each test file has its own baseline file).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding='utf-8')
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise CorruptFileError(path, f'cannot read: {exc}') from exc
    records, lines = [], {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = check_record(json.loads(line, parse_constant=_reject_constant))
        # json.JSONDecodeError is a ValueError; an integer past float's range overflows, a deeply nested one recurses
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            raise CorruptFileError(path, f'line {number}: {exc}') from exc
        if test_file is not None and record['node_id'].split('::', 1)[0] != test_file:
            raise CorruptFileError(
                path,
                f'line {number}: node_id {record["node_id"]!r} is not a test of {test_file} (its records belong '
                'in the baseline file of its own test file)',
            )
        key = record_key(record)
        if key in lines:
            raise CorruptFileError(path, f'line {number}: duplicate of line {lines[key]} ({format_key(key)})')
        lines[key] = number
        records.append(record)
    return records


def dumps_baseline(records: Iterable[Mapping]) -> str:
    """The file text: one record per line, sorted by key, fields in FIELDS order."""
    ordered = sorted(records, key=record_key)
    return ''.join(json.dumps({f: r[f] for f in FIELDS}, ensure_ascii=False, allow_nan=False) + '\n' for r in ordered)


def merge_refresh(old: Iterable[Mapping], new: Iterable[Mapping], ran_node_ids: set[str]) -> list[dict]:
    """The refreshed records of one file: `new`, plus every `old` record it does not replace.

    An old record is replaced when it belongs to a cluster of `new` and either has the key of a new
    record or was written by a test that ran now (so a test's dropped parameter sets go too).
    Records of other clusters and of tests that did not run are kept as they are.
    """
    new = list(new)
    clusters = {r['cluster'] for r in new}
    new_keys = {record_key(r) for r in new}
    kept = [
        r for r in old if not (r['cluster'] in clusters and (record_key(r) in new_keys or r['node_id'] in ran_node_ids))
    ]
    return sorted([*kept, *new], key=record_key)


def duplicate_keys(records: Iterable[Mapping]) -> dict[Key, list[str]]:
    """Keys recorded more than once, with the node IDs that recorded them."""
    seen: dict[Key, list[str]] = {}
    for r in records:
        seen.setdefault(record_key(r), []).append(r['node_id'])
    return {key: nodes for key, nodes in seen.items() if len(nodes) > 1}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One result against its baseline: status 'ok', 'regression', 'improvement' or 'missing'."""

    status: str
    record: Mapping
    baseline: Mapping | None = None

    @property
    def delta_us(self) -> float | None:
        return None if self.baseline is None else self.record['time_us'] - self.baseline['time_us']

    @property
    def ratio(self) -> float | None:
        return None if self.baseline is None else self.record['time_us'] / self.baseline['time_us']


def judge(time_us: float, baseline_us: float, threshold: float, min_delta_us: float) -> str:
    """'regression' when slower by more than `threshold` (relative) AND `min_delta_us` (absolute),
    'improvement' when faster by more than both, else 'ok'."""
    if time_us > baseline_us * (1 + threshold) and time_us - baseline_us > min_delta_us:
        return 'regression'
    if time_us < baseline_us * (1 - threshold) and baseline_us - time_us > min_delta_us:
        return 'improvement'
    return 'ok'


def verify(
    results: Iterable[Mapping], baselines: Iterable[Mapping], threshold: float, min_delta_us: float
) -> list[Verdict]:
    """A verdict per result (in key order), against the baseline of the same key and cluster. Host records
    (timing_backend 'host') are judged with at least the host floors of tests/testing/host_timing.py."""
    by_key = {record_key(b): b for b in baselines}
    verdicts = []
    for record in sorted(results, key=record_key):
        baseline = by_key.get(record_key(record))
        if baseline is None:
            verdicts.append(Verdict('missing', record))
            continue
        limits = (threshold, min_delta_us)
        if record.get('timing_backend') == HOST_TIMING_BACKEND:
            limits = (max(threshold, HOST_REGRESSION_THRESHOLD_FLOOR), max(min_delta_us, HOST_MIN_DELTA_US_FLOOR))
        verdicts.append(Verdict(judge(record['time_us'], baseline['time_us'], *limits), record, baseline))
    return verdicts


def geometric_mean(values: Iterable[float]) -> float:
    """The geometric mean of positive numbers (ValueError for none)."""
    values = list(values)
    if not values or any(v <= 0 for v in values):
        raise ValueError(f'the geometric mean needs positive numbers, got {values!r}')
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def format_geomean(ratios: Iterable[float]) -> str:
    """The verify report line: how this run's times compare with the baselines, all results at once."""
    ratios = list(ratios)
    mean = geometric_mean(ratios)
    return f'geometric mean of time / baseline over {len(ratios)} result(s): {mean:.3f}x ({mean - 1:+.1%})'


def stale_records(records: Iterable[Mapping], public_operators: Iterable[str]) -> list[Mapping]:
    """Records whose kernel is not (or no longer) a public operator."""
    public = set(public_operators)
    return [r for r in records if r['kernel'] not in public]
