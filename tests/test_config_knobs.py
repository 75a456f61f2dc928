"""Every documented knob of the analysis configs is read somewhere.

A field that no code reads still shows up in ``help()``, in the docs and in a user's config, and
silently does nothing (``LocalizeConfig`` once carried two such knobs). The check is textual: some
module of the package must read the field as an attribute of something other than ``self`` (the
dataclass's own validation does not count as a use).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import holmes_ml
from holmes_ml.features import FeatureConfig, IrregularityConfig
from holmes_ml.localize import LocalizeConfig
from holmes_ml.serve.agent import AgentConfig

SOURCE = "\n".join(p.read_text() for p in Path(holmes_ml.__file__).parent.rglob("*.py"))


@pytest.mark.parametrize("config", [LocalizeConfig, FeatureConfig, IrregularityConfig,
                                    AgentConfig], ids=lambda c: c.__name__)
def test_every_field_is_read(config):
    unread = [f.name for f in dataclasses.fields(config)
              if not re.search(rf"(?<!self)\.{f.name}\b", SOURCE)]
    assert unread == [], f"{config.__name__}: fields no code reads: {unread}"
