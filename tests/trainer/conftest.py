"""Fixtures of the trainer tests: the data tests' prepared corpus (a tiny
real-format corpus with vocabularies) for the end-to-end export test."""

from tests.data.conftest import fixture_wheel  # noqa: F401
from tests.data.conftest import prepared_dir  # noqa: F401
