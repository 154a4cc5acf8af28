"""What the tests share besides fixtures: plain modules, no tests and no fixtures.

The fixtures themselves live in ``tests/conftest.py``; test modules import helpers from here
and never from each other or from ``conftest``.
"""
