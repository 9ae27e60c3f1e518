"""Temporary re-export while the importer moves over: the IR lives in kernels/graph.py."""
from ..kernels.graph import *            # noqa: F401,F403
from ..kernels.graph import avgpool_requant, _windows, _pad   # noqa: F401
