"""The wings' tests, one folder per wing (canopy.server.wings.<wing>): each test there skips,
with the reason and what to install, when its wing's extra is missing, or fails under
REQUIRE_WINGS (tests.conftest.require_wing). Their modules import the wing's code at the top,
which needs no extra library (each wing imports its libraries where it uses them), so a
missing extra is a skip and not a collection error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require_wing

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    wing = Path(str(item.path)).resolve().relative_to(HERE).parts[0]
    require_wing(wing)
