"""Install a freshly built wheel into a new virtual environment and import it there.

Usage: python -m cann_ops_pipeline.wheel_check DIST_DIR

torch is pinned to the version of the interpreter running this check, so the check reuses what
is already installed or cached instead of resolving a different (possibly multi-GB) build.
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


def check_wheel(wheel: Path) -> None:
    with tempfile.TemporaryDirectory(prefix='wheel-check-') as tmp:
        env_dir = Path(tmp) / 'venv'
        venv.EnvBuilder(with_pip=True).create(env_dir)
        python = env_dir / ('Scripts/python.exe' if sys.platform == 'win32' else 'bin/python')
        # Neither PYTHONPATH nor the working directory may let the source tree shadow the wheel.
        env = {key: value for key, value in os.environ.items() if key != 'PYTHONPATH'}
        install = [str(python), '-m', 'pip', 'install', '-q', str(wheel), *pinned_requirements()]
        subprocess.run(install, check=True, env=env, cwd=tmp)
        subprocess.run([str(python), '-c', IMPORT_CHECK], check=True, env=env, cwd=tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('dist_dir', type=Path)
    args = parser.parse_args(argv)
    wheel = find_wheel(args.dist_dir)
    print(f'checking {wheel.name}', flush=True)
    check_wheel(wheel)
    return 0


if __name__ == '__main__':
    sys.exit(main())
