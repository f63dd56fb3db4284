"""Planted bugs for jax's numerics tests (run by tests/numerics_mutants.py)."""

from tests.numerics_mutants import Mutant  # noqa: F401

MUTANTS: list = []
