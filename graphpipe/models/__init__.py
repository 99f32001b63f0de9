"""The model zoo: the paper's networks (mmt, dlrm, candle_uno, transformer, two_branch) and small test models.

`load_model(spec, preset)` returns a `ZooModel` (model, inputs, targets, loss_fn); `spec` is a
zoo name or `path/to/file.py:factory`.
"""

from graphpipe.models.registry import PRESET_NAMES, ZOO_NAMES, load_model, zoo_config
from graphpipe.models.zoo_model import ZooModel

__all__ = ["PRESET_NAMES", "ZOO_NAMES", "ZooModel", "load_model", "zoo_config"]
