"""The paper's case study (§6): 2 branches, each 4 x [multi-head attention + 2 Linear], merged by concat.

The same network as MMT with two branches of four layers (MMT's layer sizes in the paper preset).
"""

from __future__ import annotations

from dataclasses import replace

from graphpipe.models import mmt
from graphpipe.models.zoo_model import ExampleData, ZooModel

Config = mmt.Config

PRESETS: dict[str, Config] = {
    "tiny": replace(mmt.PRESETS["tiny"], num_branches=2, num_layers=4),
    "paper": replace(mmt.PRESETS["paper"], num_branches=2, num_layers=4),
}


def build(config: Config, data: ExampleData) -> ZooModel:
    return mmt.build(config, data)
