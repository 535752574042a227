"""torch.compile through a backend that keeps the FX graphs Dynamo hands it: what the CPU-tier tests read to check
that a call traces into one graph of the operators' torch.library ops."""

from __future__ import annotations

import torch


class GraphRecorder:
    """A torch.compile backend (or an aot_autograd compiler) that keeps each FX graph it is given and runs it
    as traced. Making one resets Dynamo, so that no graph cached by an earlier test stands in for a new trace."""

    def __init__(self) -> None:
        torch._dynamo.reset()
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def targets(self, index: int = 0) -> set[str]:
        """The call_function targets of graph `index`, as strings (an op overload: 'ns.op.overload')."""
        return {str(node.target) for node in self.graphs[index].graph.nodes if node.op == 'call_function'}
