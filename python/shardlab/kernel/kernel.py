"""``ShardlabKernel``: an IPython kernel with per-cell modes, hooks and a status comm.

Everything it adds lives in :class:`~shardlab.kernel.session.ShardlabSession`, wired into the
shell by :func:`~shardlab.kernel.register.register` (which ``%load_ext shardlab`` calls in a
stock kernel too); the kernel adds what only a kernel can do: it sees each execute request's
cell metadata (JupyterLab sends it; ``{"shardlab": {"mode": ...}}`` chooses the cell's mode)
and puts the effective mode (and a graph cell's converted control flow) into each
execute_reply's metadata. It also notes the request it runs (``last_cell.py``), so that a
kernel that dies below Python is named, cell and all, by the kernel that replaces it.
"""

from __future__ import annotations

import sys
from typing import Any

from ipykernel.ipkernel import IPythonKernel

from shardlab._version import __version__
from shardlab.cluster.manager import sweep_leftovers
from shardlab.kernel.last_cell import LastCell, note_path
from shardlab.kernel.register import register


class ShardlabKernel(IPythonKernel):
    """The shardlab Jupyter kernel."""

    implementation = "shardlab"
    implementation_version = __version__

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        assert self.shell is not None
        self.session_state = register(self.shell)
        self._finished_mode: Any = None
        sweep_leftovers()  # folders (with keys) of clusters whose kernel was killed
        self.last_cell = LastCell(note_path(getattr(self.parent, "abs_connection_file", None)))
        predecessor = self.last_cell.take_predecessor()
        # said in the kernel's log now, and above the first cell's output (the front end
        # may not be listening yet)
        self._predecessor_notice = predecessor.notice() if predecessor is not None else None
        if self._predecessor_notice:
            self.log.warning(self._predecessor_notice)

    @property
    def banner(self) -> str:  # type: ignore[override]
        return (
            super().banner or ""
        ) + f"\nshardlab {__version__}: %mode, %%graph, %release, %devices\n"

    async def do_execute(  # type: ignore[override]
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict[str, Any] | None = None,
        cell_id: str | None = None,
    ) -> dict[str, Any]:
        if self._predecessor_notice and not silent:
            print(self._predecessor_notice, file=sys.stderr, flush=True)
            self._predecessor_notice = None
        assert self.shell is not None
        self.last_cell.begin(
            code, execution_count=self.shell.execution_count, cell_id=cell_id, silent=silent
        )
        self.session_state.begin_cell(code, cell_meta, silent=silent)
        try:
            return await super().do_execute(
                code,
                silent,
                store_history=store_history,
                user_expressions=user_expressions,
                allow_stdin=allow_stdin,
                cell_meta=cell_meta,
                cell_id=cell_id,
            )
        finally:
            self._finished_mode = self.session_state.end_cell()
            self.last_cell.end()

    def do_shutdown(self, restart: bool) -> Any:  # type: ignore[override]
        self.last_cell.end()  # shut down on purpose, even mid-cell: not a death
        return super().do_shutdown(restart)

    def finish_metadata(
        self, parent: dict[str, Any], metadata: dict[str, Any], reply_content: dict[str, Any]
    ) -> dict[str, Any]:
        metadata = super().finish_metadata(parent, metadata, reply_content)
        finished, self._finished_mode = self._finished_mode, None
        if finished is not None:
            metadata["shardlab"] = {
                "mode": finished.mode,
                "mode_source": finished.source,
                "mode_error": finished.error,
            }
            conversions = self.session_state.conversions
            if conversions is not None:  # a graph cell's converted control flow
                metadata["shardlab"]["conversions"] = conversions
        return metadata
