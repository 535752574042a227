"""Install a freshly built wheel into a new virtual environment and import it there.

Usage: python -m cann_ops_pipeline.wheel_check DIST_DIR [--pin REQ ...]

torch (and tilelang) are pinned to the versions of the interpreter running this check, or to the
`--pin` requirements given (the build-wheel nox session passes its torch pin and needs nothing else
installed), so the check reuses what is cached instead of resolving a different (possibly multi-GB)
build. pip's own lines show the progress of the install, which takes a while on a cold cache.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import venv
from importlib import metadata
from pathlib import Path

DISTRIBUTION = 'cann-ops-tilelang'
IMPORT_CHECK = """
import sys
import torch
import cann_ops_tilelang as ops
assert sys.prefix in ops.__file__, f'imported {ops.__file__}, not the installed wheel'
assert ops.__all__, 'the package exports no operator'
missing = [name for name in ops.__all__ if not callable(getattr(ops, name, None))]
assert not missing, f'exported but not callable: {missing}'
assert not torch.cuda.is_initialized(), 'importing the package initialised CUDA'
assert 'torch_npu' not in sys.modules, 'importing the package imported torch_npu'
print(f'cann_ops_tilelang {ops.__version__} from {ops.__file__}: {len(ops.__all__)} operators')
"""


def find_wheel(dist_dir: Path) -> Path:
    """The newest wheel of the project in `dist_dir`, as an absolute path: pip runs from another folder."""
    dist_dir = Path(dist_dir).resolve()
    wheels = sorted(dist_dir.glob(f'{DISTRIBUTION.replace("-", "_")}-*.whl'), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise FileNotFoundError(f'no {DISTRIBUTION} wheel in {dist_dir}: run the build first')
    return wheels[-1]


def pinned_requirements() -> list[str]:
    """Pins for the heavy dependencies, taken from the interpreter that runs the check."""
    pins = []
    for name in ('torch', 'tilelang'):
        try:
            pins.append(f'{name}=={metadata.version(name)}')
        except metadata.PackageNotFoundError:
            continue
    return pins


def check_wheel(wheel: Path, pins: list[str] | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix='wheel-check-') as tmp:
        env_dir = Path(tmp) / 'venv'
        venv.EnvBuilder(with_pip=True).create(env_dir)
        python = env_dir / ('Scripts/python.exe' if sys.platform == 'win32' else 'bin/python')
        # Neither PYTHONPATH nor the working directory may let the source tree shadow the wheel.
        env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
        pins = pinned_requirements() if pins is None else pins
        print(f'installing {wheel.name} with {", ".join(pins) or "its dependencies"} into a fresh venv', flush=True)
        install = [str(python), '-m', 'pip', 'install', '--progress-bar', 'off', str(wheel), *pins]
        subprocess.run(install, check=True, env=env, cwd=tmp)
        print('importing it there', flush=True)
        subprocess.run([str(python), '-c', IMPORT_CHECK], check=True, env=env, cwd=tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('dist_dir', type=Path)
    parser.add_argument('--pin', action='append', metavar='REQ', help='a requirement to install with the wheel')
    args = parser.parse_args(argv)
    wheel = find_wheel(args.dist_dir)
    print(f'checking {wheel.name}', flush=True)
    check_wheel(wheel, args.pin)
    return 0


if __name__ == '__main__':
    sys.exit(main())
