"""shardlab's magics: ``%mode``, ``%%eager``/``%%jit``/``%%graph``, ``%release``, ``%devices``.

Each :class:`ShardlabMagics` is given the session it acts on (``register.py`` wires them);
``session.py`` does not import this module.
"""

from __future__ import annotations

import ast
import linecache
import os
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from ..engine import memory
from ..engine.devices import (
    DeviceSpecError,
    check_cpu_device_count,
    parse_devices,
    switch_cpu_devices,
)
from ..engine.errors import GraphStagingError
from ..engine.graph import run_graph_cell
from ..engine.modes import ModeError, mode_context, parse_mode
from .release import release_shell

if TYPE_CHECKING:
    from .session import ShardlabSession

_OFFSET_FLAG = "--shardlab-line-offset="


@magics_class
class ShardlabMagics(Magics):
    """Magics bound to one :class:`ShardlabSession`."""

    def __init__(self, shell: Any, *, session: ShardlabSession) -> None:
        super().__init__(shell)
        self.session = session
        self._graph_sources: dict[tuple[str, int], tuple[str, str]] = {}

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
                    f"  [{item.execution_count}] {item.mode:<5} (from {item.source:<8}) "
                    f"{item.duration_s * 1e3:9.1f} ms"
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
        filename = shell.compile.cache(code, shell.execution_count)
        with mode_context(parse_mode(mode)):
            exec(compile(tree, filename, "exec"), shell.user_ns)
            if last is not None:
                return eval(compile(last, filename, "eval"), shell.user_ns)
        return None

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
        back after the program ran. ``print`` prints at run time, every run.
        """
        __tracebackhide__ = True
        shell = self.shell
        assert shell is not None
        offset = 1
        for token in line.split():
            if token.startswith(_OFFSET_FLAG):
                offset = int(token[len(_OFFSET_FLAG) :])
        code, filename = self._prepared(cell, offset)
        try:
            run = run_graph_cell(
                code,
                shell.user_ns,
                cache=self.session.graph_cache,
                filename=filename,
                line_offset=offset,
                cell_text=("%%graph\n" if offset else "") + cell,
            )
        except GraphStagingError as error:
            raise error.with_traceback(None) from None
        return run.result if run.has_result else None

    def _prepared(self, cell: str, offset: int) -> tuple[str, str]:
        """The cell's Python source and its traceback filename, cached: re-runs of a graph
        cell should cost the program, not IPython's tokenizer."""
        key = (cell, offset)
        cached = self._graph_sources.get(key)
        if cached is not None and cached[1] in linecache.cache:
            return cached
        shell = self.shell
        assert shell is not None
        with self.session.graph_body():
            code = shell.transform_cell(cell)
        cell_text = ("%%graph\n" if offset else "") + cell
        filename = shell.compile.cache(cell_text, shell.execution_count)
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
        self.session.graph_cache.clear()
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
        print(report.text())
        self.session.status.send()


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
