"""``%%compare [--bisect]``: the cell run eager, in graph mode and as a float64 reference.

The work is :func:`shardlab.engine.compare.cell.compare_cell`; this magic gives it the
cell's source as IPython transformed it, a traceback filename IPython maps to ``In [n]``
(so lines read ``In [5], line 3``), and displays the record. It returns nothing, so the
output history (``Out``, ``_``) gains no entry: the namespace is left as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class

from shardlab.engine.compare.cell import bisect_cell, compare_cell

if TYPE_CHECKING:
    from shardlab.kernel.session import ShardlabSession


@magics_class
class CompareMagics(Magics):
    """``%%compare``, bound to one :class:`ShardlabSession`."""

    def __init__(self, shell: Any, *, session: ShardlabSession) -> None:
        super().__init__(shell)
        self.session = session

    @cell_magic
    def compare(self, line: str, cell: str) -> None:
        """Run the cell three ways and compare every array it binds: ``%%compare [--bisect]``.

        Eager (op by op), compiled (graph mode: the whole cell as one program) and an eager
        float64 reference (floating inputs upcast, the same PRNG keys), each on copies of
        what the cell reads: nothing is written into the namespace. Shows per output the
        max absolute and relative difference, both errors against float64, which side is
        closer and a verdict (docs/guide/compare.md states the tolerance rule). ``--bisect`` also
        finds the first equation whose compiled value diverges from eager.
        """
        from IPython.display import display

        options = line.split()
        unknown = [o for o in options if o != "--bisect"]
        if unknown:
            raise UsageError(f"%%compare: unknown option {unknown[0]!r}; use %%compare [--bisect]")
        shell = self.shell
        assert shell is not None
        code = shell.transform_cell(cell)  # inside a running cell: not routed again
        cell_text = f"%%compare {line}".rstrip() + "\n" + cell
        number = _cell_number(shell)
        filename = shell.compile.cache(cell_text, number)
        label = f"In [{number}]"
        report = compare_cell(
            code,
            shell.user_ns,
            filename=filename,
            line_offset=1,
            cell_text=cell_text,
            name=label,
            result_label=f"Out[{number}]",
        )
        display(report)
        if "--bisect" in options and report.failure is None:
            found = bisect_cell(
                code,
                shell.user_ns,
                filename=filename,
                line_offset=1,
                name=label,
                result_label=f"Out[{number}]",
            )
            display(found)


def _cell_number(shell: Any) -> int:
    """The number the user sees on this cell (``In [n]``). IPython 9 increments
    ``execution_count`` before the cell runs; the input history has the cell at its own
    index either way."""
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    if history and history[-1].lstrip().startswith("%%compare"):
        return len(history) - 1
    return int(shell.execution_count)
