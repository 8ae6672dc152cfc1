"""Bridges from harnessrl's samples to other training frameworks.

Each integration is its own module and imports its framework on import, so importing this package
pulls in nothing heavy: ``import harnessrl.integrations.verl`` needs ``verl`` installed (see
``docs/verl.md``).
"""
