"""``%cluster`` and ``%%spmd``: run cells SPMD on a local multi-process JAX cluster.

The cluster itself (engines, coordinator, health) is :mod:`shardlab.cluster.manager`, which
imports no IPython; this module parses the magics, hands every engine's shell shardlab's own
hooks (so a cell's mode applies there too) and shows what the engines printed.

``%cluster start -n 2 --devices-per-process 4``   start (CPU: simulated devices per process;
    ``--gpus 0,1`` or ``--gpus per-process`` on GPUs; ``--heartbeat-timeout S``,
    ``--init-timeout S``)
``%cluster status``     processes, pids, devices, live bytes, listeners
``%cluster stop``       stop every process of the cluster
``%cluster restart``    stop (or clean up after a death) and start with the same options
``%cluster pull NAME [--process P] [--as LOCAL]``   bring a value (a record: Report, Plan,
    CostBreakdown...) from process P (default 0) into the notebook, to draw it here
``%%spmd [--all] [--timeout S]``   run the cell on every process, in the cell's mode
``%spmd [--all] [--timeout S] CODE``   the same for one line (``%spmd --all %devices``)
"""

from __future__ import annotations

import argparse
import keyword
import math
import shlex
import sys
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from shardlab._core.platforms import nvidia_driver_present
from shardlab.cluster.manager import ClusterError, LocalCluster, ProcessOutput, device_sets

if TYPE_CHECKING:
    from shardlab.kernel.session import ShardlabSession

# Run once on every engine after it joined the runtime: shardlab's modes, magics and hooks in
# the engine's own IPython shell (graph cells, %release and %devices work there).
ENGINE_SETUP = (
    "from shardlab.kernel.register import register as _shardlab_register\n"
    "_shardlab_register(get_ipython())\n"
    "del _shardlab_register\n"
)


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit the kernel's process
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")


def _count(low: int, high: int) -> Any:
    """An argparse type: a whole number from ``low`` to ``high`` (argparse names the option
    and the value in its error)."""

    def parse(text: str) -> int:
        if len(text) > 12 or not text.strip().lstrip("+-").isdigit():
            raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a whole number")
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value

    return parse


def _seconds(text: str) -> float:
    """``--timeout``: finite seconds, at least one (shorter stops every cell at once)."""
    try:
        value = float(text[:40])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 1 <= value <= 7 * 24 * 3600:
        raise argparse.ArgumentTypeError(
            f"{text[:20]} seconds: give 1 to 604800 (leave --timeout out for none)"
        )
    return value


def _start_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="%cluster start", add_help=False)
    parser.add_argument("-n", type=_count(1, 64), default=2, help="number of processes")
    devices = parser.add_mutually_exclusive_group()
    devices.add_argument("--devices-per-process", type=_count(1, 4096), default=None)
    devices.add_argument("--gpus", default=None, help="0,1,... or per-process")
    parser.add_argument("--heartbeat-timeout", type=_count(1, 3600), default=10)
    parser.add_argument("--init-timeout", type=_count(1, 3600), default=30)
    return parser


def _spmd_parser(prog: str) -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog=prog, add_help=False)
    parser.add_argument("--all", action="store_true", help="show every process's output")
    parser.add_argument("--timeout", type=_seconds, default=None, help="seconds")
    return parser


def _words(line: str, prog: str, *, posix: bool = True) -> list[str]:
    """The magic's arguments split as a shell would; an unclosed quote is a usage error."""
    try:
        return shlex.split(line, posix=posix)
    except ValueError as error:  # "No closing quotation", "No escaped character"
        raise UsageError(f"{prog}: {str(error).lower()} in {line[:60]!r}") from None


def _plain_name(text: str, what: str) -> str:
    """A variable name (``loss``, ``plan``) or a dotted attribute path (``state.params``),
    never an expression, a keyword or a dunder (``__builtins__``)."""
    parts = text.split(".")
    ok = all(p.isidentifier() and not keyword.iskeyword(p) for p in parts)
    if not ok or any(p.startswith("__") and p.endswith("__") for p in parts) or len(text) > 200:
        raise UsageError(
            f"%cluster pull: {what} {text[:40]!r} is not a variable name; give a name such "
            "as loss or state.params"
        )
    return text


class SpmdError(RuntimeError):
    """A cell failed on one or more processes (or the cluster did); the message names them.

    IPython shows the first failing process's own traceback (from its engine) and the
    summary, not a traceback through this magic.
    """

    def __init__(self, message: str, *, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback

    def _render_traceback_(self) -> list[str]:
        lines = self.remote_traceback.splitlines() if self.remote_traceback else []
        return [*lines, f"\x1b[31m{type(self).__name__}\x1b[0m: {self}"]


@magics_class
class ClusterMagics(Magics):
    """``%cluster``, ``%%spmd`` and ``%spmd``; the cluster belongs to this shell."""

    def __init__(self, shell: Any, *, session: ShardlabSession) -> None:
        super().__init__(shell)
        self.session = session
        self.current_cluster: LocalCluster | None = None
        self._start_args: list[str] = []

    # -- %cluster -------------------------------------------------------------------------
    @line_magic
    def cluster(self, line: str) -> None:
        """Start, inspect, stop or restart the local cluster: ``%cluster start|status|stop|
        restart|pull``. See ``docs/guide/cluster.md``."""
        words = _words(line, "%cluster")
        if not words:
            raise UsageError("%cluster: use %cluster start|status|stop|restart|pull NAME")
        command, rest = words[0], words[1:]
        if command in ("status", "stop") and rest:
            raise UsageError(f"%cluster {command} takes no arguments (got {' '.join(rest)[:40]!r})")
        if command == "start":
            self._start(rest)
        elif command == "status":
            print(self._status_text())
        elif command == "stop":
            self._stop()
            print("cluster: stopped")
        elif command == "restart":
            self._stop()
            self._start(rest or self._start_args)
        elif command == "pull":
            self._pull(rest)
        else:
            raise UsageError(
                f"%cluster: unknown command {command[:40]!r}; use start, status, stop, restart "
                "or pull"
            )

    def _start(self, args: list[str]) -> None:
        if (
            self.current_cluster is not None
            and self.current_cluster.died is None
            and self.current_cluster.running
        ):
            raise UsageError("%cluster start: a cluster is running; use %cluster restart")
        options = _start_parser().parse_args(args)
        if options.gpus is not None and not nvidia_driver_present():
            raise UsageError(
                f"%cluster start: --gpus {options.gpus[:40]}: this machine has no NVIDIA GPU "
                "driver; run on CPU devices with --devices-per-process 4"
            )
        self._stop()  # what is left of a cluster that died or timed out
        try:
            devices = device_sets(
                options.n, devices_per_process=options.devices_per_process, gpus=options.gpus
            )
        except ClusterError as error:
            raise UsageError(f"%cluster start: {error}") from None
        self._start_args = list(args)
        cluster = LocalCluster(
            options.n,
            devices,
            init_timeout_s=options.init_timeout,
            heartbeat_timeout_s=options.heartbeat_timeout,
        )
        # No notice from the watcher thread: printed from there it lands under whichever
        # cell ran last, or a later one. The cell waiting on the cluster raises the failure;
        # one that happened while no cell ran is raised, with its time, by the next call.
        status = cluster.start()
        self.current_cluster = cluster
        try:
            cluster.execute(ENGINE_SETUP)
        except ClusterError:
            cluster.stop()
            self.current_cluster = None
            raise
        print(status.text())

    def _stop(self) -> None:
        if self.current_cluster is not None:
            self.current_cluster.stop()
        self.current_cluster = None

    def _status_text(self) -> str:
        if self.current_cluster is None:
            return "cluster: none (start one with %cluster start -n 2 --devices-per-process 4)"
        status = self.current_cluster.status()
        text = status.text()
        if status.state == "running":
            text += "\n  listening: " + ", ".join(status.listeners)
        return text

    def _running(self) -> LocalCluster:
        if self.current_cluster is None:
            raise UsageError(
                "no cluster: start one with %cluster start -n 2 --devices-per-process 4"
            )
        return self.current_cluster

    def _pull(self, args: list[str]) -> None:
        parser = _ArgumentParser(prog="%cluster pull", add_help=False)
        parser.add_argument("name")
        parser.add_argument("--process", type=int, default=0)
        parser.add_argument("--as", dest="local", default=None)
        options = parser.parse_args(args)
        _plain_name(options.name, "NAME")
        if "." in options.name and options.local is None:
            raise UsageError(
                f"%cluster pull {options.name[:40]}: name the local variable for an attribute "
                f"path, e.g. --as {options.name.rsplit('.', 1)[1]}"
            )
        if options.local is not None:
            _plain_name(options.local, "--as")
            if "." in options.local:
                raise UsageError(
                    f"%cluster pull: --as {options.local[:40]!r}: give one variable name"
                )
        cluster = self._running()
        if not 0 <= options.process < cluster.n:
            raise UsageError(
                f"%cluster pull: --process {options.process}; the cluster has processes "
                f"0..{cluster.n - 1}"
            )
        try:
            value = cluster.pull(options.name, process_id=options.process)
        except ClusterError as error:
            raise SpmdError(str(error)).with_traceback(None) from None
        except Exception as error:  # a NameError there, a value that does not pickle
            raise SpmdError(
                f"%cluster pull {options.name}: process {options.process}: "
                f"{getattr(error, 'ename', type(error).__name__)}: "
                f"{getattr(error, 'evalue', error)}"
            ).with_traceback(None) from None
        shell = self.shell
        assert shell is not None
        target = options.local or options.name
        shell.user_ns[target] = value
        print(f"{target} = {type(value).__name__} from process {options.process}")

    # -- %%spmd ---------------------------------------------------------------------------
    @cell_magic("spmd")
    def spmd_cell(self, line: str, cell: str) -> None:
        """Run the cell on every process of the cluster: ``%%spmd [--all] [--timeout S]``.

        The cell runs in its own mode on the engines too (eager, jit or graph). Output comes
        from process 0 unless ``--all`` (each line tagged ``[p1]``); an error on any process
        is raised here, naming the processes. ``--timeout S`` turns a hang (a collective
        waiting for a peer) into an error; a cell that does not answer even an interrupt
        stops the cluster.
        """
        __tracebackhide__ = True
        options = _spmd_parser("%%spmd").parse_args(_words(line, "%%spmd"))
        self._spmd(cell, options)

    @line_magic("spmd")
    def spmd_line(self, line: str) -> None:
        """One line on every process: ``%spmd [--all] [--timeout S] CODE``."""
        __tracebackhide__ = True
        words = _words(line, "%spmd", posix=False)
        options, rest = _spmd_parser("%spmd").parse_known_args(words)
        code = line[line.index(rest[0]) :] if rest else ""
        if not code.strip():
            raise UsageError("%spmd: give the code to run, e.g. %spmd --all %devices")
        self._spmd(code, options)

    def _spmd(self, code: str, options: argparse.Namespace) -> None:
        __tracebackhide__ = True
        cluster = self._running()
        mode = self._mode()
        body = code if code.lstrip().startswith("%%") else f"%%{mode}\n{code}"
        show_all = options.all
        prefixed = show_all and cluster.n > 1

        def on_stdout(process_id: int, text: str) -> None:
            if process_id == 0 or show_all:
                sys.stdout.write(_tag(text, process_id) if prefixed else text)
                sys.stdout.flush()

        try:
            outputs = cluster.run(body, timeout_s=options.timeout, on_stdout=on_stdout)
        except ClusterError as error:
            raise SpmdError(str(error)).with_traceback(None) from None
        for output in outputs:
            if output.process_id == 0 or show_all:
                _republish(output, prefixed)
        failed = [o for o in outputs if o.error is not None]
        if failed:
            names = "; ".join(
                f"process {o.process_id}: {o.error[0]}: {o.error[1]}" for o in failed if o.error
            )
            trace = failed[0].error[2] if failed[0].error else ""
            if not isinstance(trace, str):
                trace = "\n".join(trace)
            heading = f"process {failed[0].process_id}:\n" if trace else ""
            raise SpmdError(names, remote_traceback=heading + trace).with_traceback(None) from None

    def _mode(self) -> str:
        current = self.session.current
        if current is not None and current.mode is not None:
            return current.mode
        return self.session.default_mode


def _tag(text: str, process_id: int) -> str:
    return "".join(f"[p{process_id}] {line}" for line in text.splitlines(True))


def _republish(output: ProcessOutput, prefixed: bool) -> None:
    from IPython.display import publish_display_data

    if output.stderr:
        text = _tag(output.stderr, output.process_id) if prefixed else output.stderr
        sys.stderr.write(text)
    for shown in (*output.outputs, *([output.result] if output.result else [])):
        if prefixed:
            print(f"[p{output.process_id}]")
        publish_display_data(
            data=shown.get("data", {}),
            metadata={**(shown.get("metadata") or {}), "shardlab_process": output.process_id},
        )
