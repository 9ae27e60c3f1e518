"""The host runtime: the tile seen through typed registers over any transport.

Layers, bottom up: :mod:`.transport` (words on the tile's bus, one class per target),
:mod:`.device` (registers, counters, windows, control, from the memory map), and the
command line in :mod:`.cli`.
"""

from .transport import (Transport, TransportError, BusError, register_transport,
                        register_transport_path, transport_names, open_transport)
from .device import Device, TileFault


__all__ = [
    "Transport", "TransportError", "BusError", "register_transport",
    "register_transport_path", "transport_names", "open_transport",
    "Device", "TileFault",
]
