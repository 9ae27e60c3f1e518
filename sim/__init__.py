"""Simulation harnesses for the tile's RTL under cocotb (Verilator, Icarus).

- :mod:`.verilog`: the tile's Verilog, generated once per configuration and sources.
- :mod:`.build`: simulator models built once and reused; running cocotb tests on them.
- :mod:`.tb`: the cocotb testbench (clock, reset, Wishbone master) and ``run_host``.
- :mod:`.cocotb_transport`: the ``verilator`` / ``icarus`` host transports.
- :mod:`.cocotb_server`: the cocotb test those transports run in the simulator.

Importing this package imports nothing heavy; cocotb is needed only by ``tb``,
``cocotb_server`` and by code running inside a simulator.
"""
