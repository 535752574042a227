"""Random numbers: a counter-based normal generator whose numbers depend only on the seed, the stream position and
the element index, the same bits on the Ascend and CUDA kernels (experimental: not exported from the root
package yet)."""

from .randn import randn, randn_like, set_seed

__all__ = ['randn', 'randn_like', 'set_seed']
