"""Transports: how the host reaches the tile's Wishbone bus.

A :class:`Transport` moves 32-bit words to and from byte addresses of the tile's bus
(``read32`` / ``write32`` and bursts) and lets the tile run for a number of clock
cycles (``wait_cycles``). Everything above it (:class:`~fusetile.host.device.Device`,
the runtime) is unaware of which transport it runs on, the way PYNQ's MMIO picks its
backend by capability and Glasgow runs the same applet code in simulation and on a
board.

Transports are found by name through a registry, so adding one is one class::

    @register_transport("mytarget")
    class MyTransport(Transport):
        def _read32(self, addr): ...
        def _write32(self, addr, value): ...
        def wait_cycles(self, n): ...

Transports whose module pulls in heavy or optional dependencies (cocotb, pyserial) are
registered by dotted path with :func:`register_transport_path` and imported only when
opened.
"""

import importlib

from ..hdl.regmap import ADDR_WIDTH


__all__ = [
    "TransportError", "BusError", "Transport",
    "register_transport", "register_transport_path", "transport_names", "transport_class",
    "open_transport",
]


class TransportError(Exception):
    """The transport could not carry out an access (link down, bus timeout, simulator
    stopped, transport unavailable)."""


class BusError(TransportError):
    """The tile answered an access with Wishbone ERR.

    Parameters
    ----------
    addr : int
        Byte address of the access.
    write : bool
        Whether the access was a write.
    memory_map : MemoryMap or None
        When given, the message names the register, counter or window ``addr`` is in.

    Attributes
    ----------
    addr : int
    write : bool
    region : str or None
        Name of the register, counter or window at ``addr`` (``None`` if unmapped or
        no memory map was given).
    """

    def __init__(self, addr, write, memory_map=None):
        self.addr = addr
        self.write = bool(write)
        self.region = None
        where = ""
        if memory_map is not None:
            entry = memory_map.lookup(addr)
            if entry is None:
                where = " (unmapped)"
            else:
                self.region = entry.item.name
                offset = addr - entry.addr
                where = f" ({self.region}" + (f" + {offset:#x}" if offset else "") + ")"
        kind = "write to" if self.write else "read from"
        super().__init__(f"bus error: {kind} {addr:#010x}{where}")

    def __reduce__(self):
        return (BusError, (self.addr, self.write))


def _check_int(name, value):
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, not {value!r}")


class Transport:
    """A link to one tile's Wishbone bus (abstract).

    Addresses are *byte* addresses from the tile's base and must be 4-aligned; data are
    32-bit unsigned words. Misaligned or out-of-range addresses and out-of-range values
    raise :exc:`ValueError` before the bus is touched.

    Subclasses implement :meth:`_read32`, :meth:`_write32` and :meth:`wait_cycles`; they
    may override :meth:`_read_burst` / :meth:`_write_burst` with something faster than
    the default loops, and :meth:`close`.

    Parameters
    ----------
    addr_width : int
        Bytes of address space are ``2 ** addr_width`` (the tile's byte-address width).
    memory_map : MemoryMap or None
        Used to name the region of a failing access in :exc:`BusError` messages.

    Attributes
    ----------
    memory_map : MemoryMap or None
    addr_width : int
    words_read, words_written : int
        Bus words moved through the public API so far (the host's cost of a task, e.g.
        the profiler's register reads per inference).
    """

    def __init__(self, *, addr_width=ADDR_WIDTH, memory_map=None):
        _check_int("addr_width", addr_width)
        self.addr_width = addr_width
        self.memory_map = memory_map
        self.closed = False
        self.words_read = self.words_written = 0

    # -- checks -----------------------------------------------------------------
    def _check_addr(self, addr, count=1):
        _check_int("Address", addr)
        if addr % 4:
            raise ValueError(f"Address must be 4-byte aligned, not {addr:#x}")
        end = 1 << self.addr_width
        if addr < 0 or addr + 4 * max(count, 1) > end:
            raise ValueError(f"Address must be in the range 0x0..{end - 4:#x}, not {addr:#x}"
                             + (f" (burst of {count} words)" if count > 1 else ""))

    @staticmethod
    def _check_value(value):
        _check_int("Value", value)
        if not 0 <= value < 1 << 32:
            raise ValueError(f"Value must be a 32-bit unsigned integer, not {value!r}")

    @staticmethod
    def _check_count(count):
        _check_int("count", count)
        if count < 0:
            raise ValueError(f"count must be a non-negative integer, not {count!r}")

    def _check_open(self):
        if self.closed:
            raise TransportError(f"{type(self).__name__} is closed")

    def _bus_error(self, addr, write):
        """The exception to raise when the tile answers ERR at ``addr``."""
        return BusError(addr, write, self.memory_map)

    # -- public API ---------------------------------------------------------------
    def read32(self, addr):
        """Read the 32-bit word at byte address ``addr``."""
        self._check_addr(addr)
        self._check_open()
        self.words_read += 1
        return self._read32(addr)

    def write32(self, addr, value):
        """Write the 32-bit word ``value`` to byte address ``addr``."""
        self._check_addr(addr)
        self._check_value(value)
        self._check_open()
        self.words_written += 1
        self._write32(addr, value)

    def read_burst(self, addr, count, *, increment=True):
        """Read ``count`` words from ``addr`` on (``increment=False``: ``count`` times
        from ``addr``, e.g. to drain a FIFO register). Returns a list of ints."""
        self._check_count(count)
        self._check_addr(addr, count if increment else 1)
        self._check_open()
        if count == 0:
            return []
        self.words_read += count
        return list(self._read_burst(addr, count, increment))

    def write_burst(self, addr, values, *, increment=True):
        """Write ``values`` to ``addr`` on (``increment=False``: all to ``addr``)."""
        values = list(values)
        for value in values:
            self._check_value(value)
        self._check_addr(addr, len(values) if increment else 1)
        self._check_open()
        if values:
            self.words_written += len(values)
            self._write_burst(addr, values, increment)

    def wait_cycles(self, n):
        """Let the tile run for ``n`` clock cycles (simulators advance their clock;
        boards sleep for at least that long)."""
        raise NotImplementedError

    def irq(self):
        """The tile's interrupt line (0 or 1), or ``None`` where the transport cannot
        see it (a board behind a serial link)."""
        return None

    def close(self):
        """Release the link. Closing twice is harmless."""
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- for subclasses -------------------------------------------------------------
    def _read32(self, addr):
        raise NotImplementedError

    def _write32(self, addr, value):
        raise NotImplementedError

    def _read_burst(self, addr, count, increment):
        step = 4 if increment else 0
        return [self._read32(addr + step * i) for i in range(count)]

    def _write_burst(self, addr, values, increment):
        step = 4 if increment else 0
        for i, value in enumerate(values):
            self._write32(addr + step * i, value)


# -- registry -------------------------------------------------------------------

_registry = {}


def _check_name(name):
    if not isinstance(name, str) or not name or ":" in name:
        raise TypeError(f"Transport name must be a non-empty string without ':', not {name!r}")


def register_transport(name):
    """Class decorator registering a :class:`Transport` subclass under ``name``."""
    _check_name(name)

    def decorator(cls):
        if not (isinstance(cls, type) and issubclass(cls, Transport)):
            raise TypeError(f"Registered transport must be a Transport subclass, not {cls!r}")
        _registry[name] = cls
        return cls
    return decorator


def register_transport_path(name, path):
    """Register the transport class at ``"package.module:ClassName"`` under ``name``,
    imported only when it is first opened."""
    _check_name(name)
    if not isinstance(path, str) or path.count(":") != 1:
        raise TypeError(f"Transport path must be a 'module:ClassName' string, not {path!r}")
    _registry[name] = path


def transport_names():
    """Names of the registered transports, sorted."""
    return sorted(_registry)


def transport_class(name):
    """The :class:`Transport` subclass registered under ``name``.

    Raises
    ------
    ValueError
        If no transport has that name (the message lists the known ones).
    TransportError
        If the transport's module cannot be imported (e.g. its dependency is missing).
    """
    try:
        entry = _registry[name]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown transport {name!r}; known transports: "
                         f"{', '.join(transport_names())}") from None
    if isinstance(entry, str):
        module_name, _, attr = entry.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as e:
            raise TransportError(f"Transport {name!r} is not available: {e}") from e
        _registry[name] = entry = cls
    return entry


def open_transport(target, **kwargs):
    """Open the transport named by ``target``.

    ``target`` is a registered name, optionally followed by ``:ARG`` which is passed as
    the first positional argument (e.g. ``"serial:/dev/ttyUSB0"``). Keyword arguments go
    to the transport's constructor (e.g. ``config=TileConfig(...)``).
    """
    if not isinstance(target, str):
        raise TypeError(f"Transport target must be a string, not {target!r}")
    name, sep, arg = target.partition(":")
    cls = transport_class(name)
    return cls(arg, **kwargs) if sep else cls(**kwargs)


register_transport_path("amaranth", "fusetile.host.amaranth_sim:AmaranthTransport")
register_transport_path("verilator", "fusetile.sim.cocotb_transport:VerilatorTransport")
register_transport_path("icarus", "fusetile.sim.cocotb_transport:IcarusTransport")
register_transport_path("model", "fusetile.host.model_transport:ModelTransport")
register_transport_path("serial", "fusetile.host.serial_transport:SerialTransport")
