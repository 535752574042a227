"""invoke tasks: the pipeline phases in the current environment (no virtualenvs), plus developer tools.

`invoke --list` shows them; each phase runs the same steps as the nox session of the same name.
"""

from invoke import Collection

from tasks import new_op, phases

ns = Collection.from_module(phases)
ns.add_task(new_op.new_op)
