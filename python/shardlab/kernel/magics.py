"""shardlab's magics: ``%mode``, ``%%eager``/``%%jit``/``%%graph``, ``%release``, ``%devices``.

Each :class:`ShardlabMagics` is given the session it acts on (``register.py`` wires them);
``session.py`` does not import this module.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from shardlab.engine.cells.errors import CellSyntaxError, GraphStagingError
from shardlab.engine.cells.source import (
    Segment,
    ShellLineInBlock,
    dropped_blank_lines,
    split_shell_lines,
)
from shardlab.engine.cells.staging import run_graph_cell
from shardlab.engine.modes import ModeError, mode_context, parse_mode
from shardlab.engine.resources import live_memory as memory
from shardlab.engine.resources.devices import (
    DeviceSpecError,
    check_cpu_device_count,
    parse_devices,
)
from shardlab.engine.resources.switch import switch_cpu_devices
from shardlab.kernel.release import release_shell

if TYPE_CHECKING:
    from shardlab.kernel.session import ShardlabSession

_OFFSET_FLAG = "--shardlab-line-offset="
# Cell magics whose body is Python they run: in a graph cell, the body is staged inside them.
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
_GRAPH_OPTIONS = frozenset({"--show-converted", "--strict"})


@magics_class
class ShardlabMagics(Magics):
    """Magics bound to one :class:`ShardlabSession`."""

    def __init__(self, shell: Any, *, session: ShardlabSession) -> None:
        super().__init__(shell)
        self.session = session
        self._graph_sources: dict[tuple[str, int], tuple[str, str]] = {}
        self._graph_options: set[str] = set()

    # -- modes -----------------------------------------------------------------------------
    @line_magic
    def mode(self, line: str) -> None:
        """Show or set the default execution mode: ``%mode [eager|jit|graph]``.

        Cells without ``%%eager``/``%%jit``/``%%graph`` and without ``shardlab.mode`` cell
        metadata run in the default mode. With no argument, prints the default and the
        effective modes of the last cells.
        """
        arg = line.strip()
        if arg:
            try:
                self.session.set_default(parse_mode(arg, origin="%mode"))
            except ModeError as error:
                raise UsageError(str(error)) from None
            print(f"default mode: {self.session.default_mode}")
            return
        print(f"default mode: {self.session.default_mode}")
        history = self.session.effective_history()
        if history:
            print("last cells:")
            for item in history[-10:]:
                print(
                    f"  [{item.execution_count}] {item.mode:<5} {f'(from {item.source})':<15} "
                    f"{item.duration_s * 1e3:9.1f} ms"
                    + (f"  {conversions_text(item.conversions)}" if item.conversions else "")
                )

    def _run_in_mode(self, mode: str, cell: str) -> Any:
        """Runs ``cell`` in the user namespace under ``mode``; returns its last expression."""
        __tracebackhide__ = True
        shell = self.shell
        assert shell is not None
        code = shell.transform_cell(cell)
        tree = ast.parse(code)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)  # type: ignore[attr-defined]
        filename = shell.compile.cache(code, running_count(shell))
        with mode_context(parse_mode(mode)):
            exec(compile(tree, filename, "exec"), shell.user_ns)
            if last is not None:
                return eval(compile(last, filename, "eval"), shell.user_ns)
        return None

    @cell_magic("mode")
    def mode_cell(self, line: str, cell: str) -> Any:
        """Run the cell in a mode: ``%%mode eager|jit|graph`` (as ``%%eager`` and so on)."""
        __tracebackhide__ = True
        try:
            mode = parse_mode(line.strip(), origin="%%mode")
        except ModeError as error:
            raise UsageError(str(error)) from None
        if mode == "graph":
            return self._graph(f"{_OFFSET_FLAG}1", cell)
        return self._run_in_mode(mode, cell)

    @cell_magic
    def eager(self, line: str, cell: str) -> Any:
        """Run the cell op by op (``jax.disable_jit()``): print and breakpoints see values."""
        __tracebackhide__ = True
        return self._run_in_mode("eager", cell)

    @cell_magic
    def jit(self, line: str, cell: str) -> Any:
        """Run the cell as plain JAX: jitted functions compile and are cached."""
        __tracebackhide__ = True
        return self._run_in_mode("jit", cell)

    @cell_magic
    def graph(self, line: str, cell: str) -> Any:
        """Stage the whole cell as one compiled program, cached by input shapes.

        Names the cell reads that hold arrays become inputs; names it binds are written
        back after the program ran. ``print`` and ``jax.debug.print`` print at run time,
        every run, in program order. Magic, shell (``!cmd``) and help (``x?``) lines run as
        Python around the staged statements, in order, every run; a cell magic on the first
        line (``%%time``) wraps the staged cell.

        Python control flow on traced values is converted (``if`` → ``lax.cond``, ``while``
        → ``lax.while_loop``, ``for`` over an array → ``lax.scan``); on concrete values it
        stays Python. ``--show-converted`` prints the converted source first; ``--strict``
        makes a statement that cannot be converted an error instead of Python.
        """
        __tracebackhide__ = True
        return self._graph(line, cell)

    def _graph(self, line: str, cell: str) -> Any:
        __tracebackhide__ = True
        offset = 1
        options = set()
        for token in line.split():
            if token.startswith(_OFFSET_FLAG):
                number = token[len(_OFFSET_FLAG) :]
                if not number.isdigit() or len(number) > 9:
                    raise UsageError(
                        f"%%graph: {token[:60]!r}: the line offset is a whole number "
                        f"({_OFFSET_FLAG}1); the kernel sets it, a cell need not"
                    )
                offset = int(number)
            elif token in _GRAPH_OPTIONS:
                options.add(token)
            else:
                raise UsageError(
                    f"%%graph: unknown option {token[:60]!r}; use %%graph [--show-converted] "
                    "[--strict]"
                )
        self._graph_options = options
        wrapped = self._cell_magic_around(cell, offset)
        if wrapped is not None:
            return wrapped()
        cell_text = ("%%graph\n" if offset else "") + cell
        code, filename = self._prepared(cell, offset)
        try:
            segments = split_shell_lines(code)
        except SyntaxError as error:
            raise CellSyntaxError.at(
                error, filename=self._label(filename), line_offset=offset
            ) from None
        except ShellLineInBlock as error:
            raise GraphStagingError(
                lineno=error.lineno + offset,
                line=code.splitlines()[error.lineno - 1].strip(),
                reason=(
                    "a magic, shell or help line sits inside a block; a graph cell runs such "
                    "lines as Python around the staged program, which needs them at the top "
                    "level of the cell."
                ),
                fix="move the line out of the block (or into its own cell), or run the cell "
                "with %%jit.",
            ).with_traceback(None) from None
        return self._run_segments(segments, filename, offset, cell_text)

    def _run_segments(
        self, segments: Sequence[Segment], filename: str, offset: int, cell_text: str
    ) -> Any:
        __tracebackhide__ = True
        shell = self.shell
        assert shell is not None
        result: Any = None
        for segment in segments:
            if segment.context is not None:  # ``with jax.set_mesh(mesh):`` around its body
                with contextlib.ExitStack() as stack:
                    managers = eval(f"({segment.context},)", shell.user_ns)
                    for manager, target in zip(managers, segment.targets, strict=True):
                        value = stack.enter_context(manager)
                        if target is not None:
                            shell.user_ns[target] = value
                    result = self._run_segments(segment.body, filename, offset, cell_text)
            elif segment.staged:
                result = self._run_staged(segment.source, filename, offset, cell_text)
            else:
                result = self._run_python(segment.source, filename, offset)
        return result

    def _run_staged(self, code: str, filename: str, offset: int, cell_text: str) -> Any:
        __tracebackhide__ = True
        shell = self.shell
        assert shell is not None
        if "--show-converted" in self._graph_options:
            print(self._converted_text(code, filename, offset))
        try:
            run = run_graph_cell(
                code,
                shell.user_ns,
                cache=self.session.graph_cache,
                filename=filename,
                line_offset=offset,
                cell_text=cell_text,
                strict="--strict" in self._graph_options,
            )
        except GraphStagingError as error:
            raise error.with_traceback(None) from None
        except SyntaxError as error:
            raise CellSyntaxError.at(
                error, filename=self._label(filename), line_offset=offset
            ) from None
        for note in run.notes:
            print(f"[shardlab] {note}")
        if run.conversions is not None:
            self.session.add_conversions(run.conversions)
        return run.result if run.has_result else None

    def _converted_text(self, code: str, filename: str, offset: int) -> str:
        """``--show-converted``: the staged statements as the conversion rewrote them."""
        cell = self.session.graph_cache.analysed(code, filename, offset)
        if cell.converted_source is None:
            return "# no control flow to convert in this cell"
        return f"# converted ({len(cell.sites)} statement(s)):\n{cell.converted_source}"

    def _label(self, filename: str) -> str:
        """``In [8]`` for a cell's traceback filename, as IPython shows it."""
        shell = self.shell
        assert shell is not None
        named = shell.compile.format_code_name(filename)
        return f"{named[1].replace('[', ' [')}" if named else filename

    def _run_python(self, code: str, filename: str, offset: int) -> Any:
        """Runs magic, shell and help lines of a graph cell as the cell's Python."""
        __tracebackhide__ = True
        shell = self.shell
        assert shell is not None
        tree = ast.parse("\n" * offset + code, filename=filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)  # type: ignore[attr-defined]
        exec(compile(tree, filename, "exec"), shell.user_ns)
        if last is not None:
            return eval(compile(last, filename, "eval"), shell.user_ns)
        return None

    def _cell_magic_around(self, cell: str, offset: int) -> Any:
        """A cell magic on the first line of a graph cell (``%%time``): a callable that runs
        it, with the rest staged when the magic runs Python (time, timeit, capture, prun),
        or as that magic alone when it runs something else (``%%bash``, ``%%html``)."""
        shell = self.shell
        assert shell is not None
        stripped = cell.lstrip("\n")
        if not stripped.startswith("%%"):
            return None
        blank = len(cell) - len(stripped)
        first, _, rest = stripped.partition("\n")
        name, _, args = first[2:].partition(" ")
        if name in ("graph", "mode"):
            return None
        if name in _PYTHON_CELL_MAGICS:
            inner = f"%%graph {_OFFSET_FLAG}{offset + blank + 1}\n{rest}"
            return lambda: shell.run_cell_magic(name, args, inner)
        return lambda: shell.run_cell_magic(name, args, rest)

    def _prepared(self, cell: str, offset: int) -> tuple[str, str]:
        """The cell's Python source and its traceback filename, cached: re-runs of a graph
        cell should cost the program, not IPython's tokenizer."""
        key = (cell, offset)
        cached = self._graph_sources.get(key)
        if cached is not None and cached[1] in linecache.cache:
            return cached
        shell = self.shell
        assert shell is not None
        code = shell.transform_cell(cell)  # inside a running cell: not routed again
        # transform_cell drops leading blank lines; pad them back so every line keeps its
        # number (syntax errors, magic lines run as Python, --show-converted).
        code = "\n" * dropped_blank_lines(cell, code) + code
        cell_text = ("%%graph\n" if offset else "") + cell
        filename = shell.compile.cache(cell_text, running_count(shell))
        if len(self._graph_sources) > 256:
            self._graph_sources.clear()
        self._graph_sources[key] = (code, filename)
        return code, filename

    # -- memory ----------------------------------------------------------------------------
    @line_magic
    def release(self, line: str) -> None:
        """Free memory: ``%release [--all]``.

        Clears IPython's output history (``Out``, ``_``, ``__``, ``___``), the last
        traceback, staged graph cells and JAX's compilation caches; deletes device arrays no
        name refers to; returns freed heap to the OS (glibc ``malloc_trim``). ``--all`` also
        deletes arrays bound to names and unbinds those names (using one afterwards is a
        ``NameError``, not "Array has been deleted"), listing them; names of arrays that a
        module also holds are kept, and listed too. Prints per-device bytes and process RSS
        before and after.
        """
        args = line.split()
        unknown = [a for a in args if a != "--all"]
        if unknown:
            raise UsageError(f"%release: unknown option {unknown[0]!r}; use %release [--all]")
        delete_named = "--all" in args
        report = release_shell(self.shell, self.session, delete_named=delete_named)
        print(report.text())

    # -- devices ---------------------------------------------------------------------------
    @line_magic
    def devices(self, line: str) -> None:
        """Show devices, or switch the CPU device count: ``%devices [cpu:N]``.

        Without an argument: platform, devices, the pinned set, the current mesh and
        per-device live bytes. ``%devices cpu:N`` switches in-process, moving every array
        in the namespace (and in the output history) through host memory so nothing is
        lost; each array is copied once and keeps its names. ``N`` is bounded by what the
        host can hold (about 1.25 MiB of host memory per simulated device, at most half of
        the memory available, and at most 4096). GPU visibility cannot change in a running
        process: install a kernelspec with ``python -m shardlab install --devices gpu:0,1``
        and restart with it.
        """
        arg = line.strip()
        shell = self.shell
        assert shell is not None
        if not arg:
            print(devices_text(shell.user_ns))
            return
        print(switch_devices(shell, self.session, arg))
        self.session.status.send()


def conversions_text(conversions: dict[str, Any]) -> str:
    """``3 converted: cond 1, scan 1; 1 as Python`` for ``%mode``'s listing."""
    staged = ", ".join(f"{kind} {count}" for kind, count in sorted(conversions["staged"].items()))
    text = f"{conversions['converted']} converted" + (f": {staged}" if staged else "")
    if conversions.get("python"):
        text += f"; {conversions['python']} ran as Python"
    if conversions.get("left_as_python"):
        text += f"; {len(conversions['left_as_python'])} not convertible"
    return text


def switch_devices(shell: Any, session: ShardlabSession, arg: str) -> str:
    """``%devices cpu:N``: switches the CPU device count in-process; returns the report text.

    Raises:
        UsageError: the spec is malformed, names GPUs (their visibility is fixed when JAX
            starts: the message gives the kernelspec command), or exceeds the host's bound.
    """
    arg = arg.strip()
    try:
        target = parse_devices(arg)
    except DeviceSpecError as error:
        raise UsageError(str(error)) from None
    if target.platform == "gpu":
        raise UsageError(
            f"%devices {arg}: GPU visibility is fixed when JAX starts and cannot change "
            "in a running kernel. Install a kernelspec pinned to it — python -m shardlab "
            f"install --devices {target.spec} --name shardlab-gpu — then pick that "
            "kernel (or restart with it)."
        )
    assert target.count is not None
    try:
        check_cpu_device_count(target.count)
    except DeviceSpecError as error:
        raise UsageError(str(error)) from None
    session.graph_cache.clear()
    # IPython keeps the last outputs beside the namespace too: the values of hidden names
    # (``push(..., interactive=False)``) and the display hook's ``_``, ``__``, ``___``.
    hook = getattr(shell, "displayhook", None)
    unders = {n: getattr(hook, n) for n in ("_", "__", "___") if hasattr(hook, n)}
    try:
        report = switch_cpu_devices(
            target.count,
            shell.user_ns,
            hidden=frozenset(shell.user_ns_hidden),
            also=[shell.user_ns_hidden, unders],
        )
    except DeviceSpecError as error:
        raise UsageError(str(error)) from None
    for name, value in unders.items():
        setattr(hook, name, value)
    return report.text()


def _mesh_text(namespace: dict[str, Any]) -> str:
    import jax
    from jax.sharding import Mesh

    parts = []
    try:
        abstract = jax.sharding.get_abstract_mesh()
        if abstract is not None and not abstract.empty:
            parts.append(f"set: {dict(abstract.shape)}")
    except Exception:
        pass
    named = [f"{n}={dict(v.shape)}" for n, v in namespace.items() if isinstance(v, Mesh)]
    if named:
        parts.append("in namespace: " + ", ".join(named))
    return "; ".join(parts) if parts else "none (create one with shardlab.mesh(data=2, model=4))"


def devices_text(namespace: dict[str, Any]) -> str:
    """The ``%devices`` report."""
    import jax

    devices = jax.devices()
    pinned = os.environ.get("SHARDLAB_DEVICES", "not pinned (JAX's defaults)")
    lines = [
        f"platform: {devices[0].platform if devices else 'none'} ({len(devices)} devices)",
        f"pinned:   {pinned}",
        f"mesh:     {_mesh_text(namespace)}",
        "devices:",
    ]
    per_device = memory.live_bytes_per_device()
    for device in devices:
        used = per_device.get(str(device), 0)
        lines.append(f"  {device.id:>3}  {device.device_kind:<12} live {used:>12,} bytes")
    return "\n".join(lines)


def running_count(shell: Any) -> int:
    """The execution count of the running cell, as its prompt shows it (``In [3]``).

    IPython 9 counts the cell before running it, so ``shell.execution_count`` is already the
    next cell's number inside a magic; the running cell's result record holds its own.
    """
    result = getattr(shell.displayhook, "exec_result", None)
    count = getattr(result, "execution_count", None)
    return count if isinstance(count, int) else shell.execution_count
