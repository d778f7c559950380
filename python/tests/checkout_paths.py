"""Puts the checkout's Python packages on sys.path, for the tests and the test engines run
from the repository: baton_engine (python/baton-engine), baton_torch_engine
(python/baton-torch-engine) and baton_demo_model (python/). Importing it is the whole use."""
import os
import sys

PYTHON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

for _dir in ("", "baton-engine", "baton-torch-engine"):
    _path = os.path.join(PYTHON, _dir)
    if _path not in sys.path:
        sys.path.insert(0, _path)
