"""A simulation model running a cocotb module that serves the host over a Unix socket.

Both the ``verilator`` / ``icarus`` transports (:mod:`fusetile.sim.cocotb_transport`)
and the UART bridge's RTL behind a pseudo-terminal (:mod:`fusetile.sim.uart_rtl`)
start a built model (:func:`fusetile.sim.build.build`) as a subprocess whose cocotb
test connects back to a socket this side listens on. :class:`SimulatorProcess` is
that launch, the wait for the connection, and the clean-up: the simulator's log is
kept when something failed.
"""

import shutil
import socket
import subprocess
import tempfile
import time
import weakref
from pathlib import Path

from ..host.transport import TransportError


__all__ = ["SimulatorProcess", "recv_exact"]


def recv_exact(sock, n):
    """Read exactly ``n`` bytes; ``None`` on a clean EOF before the first byte."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            if not buf:
                return None
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _reap(proc, listener, conn, workdir, keep):
    """Stop the simulator and free everything; safe to call more than once."""
    for s in (conn, listener):
        if s is not None:
            try:
                s.close()
            except OSError:
                pass
    if proc is not None and proc.poll() is None:
        try:
            proc.wait(timeout=10)   # the simulator ends its test on EOF
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if workdir is not None and not keep[0]:
        shutil.rmtree(workdir, ignore_errors=True)


class SimulatorProcess:
    """``model`` running the cocotb test ``module``, connected.

    The test finds the socket's path in ``FUSETILE_SOCKET``. The simulator runs in a
    fresh directory (:attr:`workdir`, its output in ``sim.log``), removed on
    :meth:`close` unless :meth:`fail` was called or ``keep`` is set.

    Parameters
    ----------
    model : fusetile.sim.build.BuildResult
    module : str
        The cocotb test module.
    name : str
        What error messages call the simulator (``"The verilator simulator"``).
    extra_env : dict, optional
        More environment for the test.
    start_timeout : float
        Seconds the simulator may take to start and connect.
    keep : bool
        Keep :attr:`workdir` (a waveform is written there).

    Attributes
    ----------
    proc : subprocess.Popen
    conn : socket.socket
    workdir : Path

    Raises
    ------
    TransportError
        If the simulator exits or does not connect within ``start_timeout``.
    """

    def __init__(self, model, module, *, name, extra_env=None, start_timeout=120.0,
                 keep=False):
        from .build import simulator_command, simulator_env

        self.name = name
        self.conn = None
        self._keep = [bool(keep)]
        # A short path: Unix socket paths are limited to about 100 bytes.
        self.workdir = Path(tempfile.mkdtemp(prefix=f"fusetile-{model.sim}-"))
        path = str(self.workdir / "sim.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(1)
            listener.settimeout(0.2)
            env = simulator_env(model, module, results_file=self.workdir / "results.xml",
                                extra_env={"FUSETILE_SOCKET": path, **(extra_env or {})})
            with open(self.workdir / "sim.log", "wb") as log:
                self.proc = subprocess.Popen(simulator_command(model), cwd=self.workdir,
                                             env=env, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL)
            self._finalizer = weakref.finalize(self, _reap, self.proc, None, None,
                                               self.workdir, self._keep)
            deadline = time.monotonic() + start_timeout
            while self.conn is None:
                try:
                    self.conn, _ = listener.accept()
                except socket.timeout:
                    if self.proc.poll() is not None:
                        self.fail(f"{name} {self.exit_status()} before it connected")
                    if time.monotonic() > deadline:
                        self.fail(f"{name} did not connect within {start_timeout} s")
        finally:
            listener.close()
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _reap, self.proc, None, self.conn,
                                           self.workdir, self._keep)

    @property
    def pid(self):
        return self.proc.pid

    @property
    def alive(self):
        """Whether the simulator process is running."""
        return self.proc.poll() is None

    def exit_status(self):
        """How the simulator ended: "exited with code N" or "was killed by signal N"."""
        code = self.proc.returncode
        return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"

    def log_tail(self, lines=15):
        """The last ``lines`` lines of the simulator's output."""
        try:
            text = (self.workdir / "sim.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def fail(self, message):
        """Kill the simulator, keep its log and raise a :exc:`TransportError` with
        ``message``, where the log is and its tail."""
        if self.alive:
            self.proc.kill()
            self.proc.wait()
        self._keep[0] = True
        tail = self.log_tail()
        error = TransportError(f"{message}; log {self.workdir / 'sim.log'}"
                               + (f":\n{tail}" if tail else ""))
        self._finalizer()
        raise error

    def shutdown(self, request, reply_size):
        """Send ``request`` (the server's shutdown request), wait for its reply of
        ``reply_size`` bytes, then :meth:`close`: the test ends and the simulator
        exits."""
        if self.alive:
            try:
                self.conn.settimeout(5)
                self.conn.sendall(request)
                self.conn.recv(reply_size)
            except OSError:
                pass
        self.close()

    def close(self):
        """Close the connection, wait for the simulator (killing it after 10 s) and
        remove :attr:`workdir` unless it is kept. Safe to call more than once."""
        self._finalizer()
