"""Fixtures more than one test package uses."""

from __future__ import annotations

import pytest

from tests.registry_server import registry_fixture

registry = pytest.fixture(registry_fixture)  # a real OCI registry on a loopback port (tests/registry_server.py)
