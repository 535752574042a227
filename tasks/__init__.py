"""invoke tasks: the pipeline phases in the current environment (no virtualenvs), plus developer tools.

`invoke --list` shows them; each phase runs the same steps as the nox session of the same name.
"""

import sys
from pathlib import Path

from invoke import Collection

# The pipeline package is not installed: the tasks import it from the source tree (as the noxfile does).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'packages'))

from tasks import new_op, phases

ns = Collection.from_module(phases)
ns.add_task(new_op.new_op)
