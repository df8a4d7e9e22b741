"""What XLA:CPU holds in temp at its peak, read from an ``--xla_dump_to`` directory.

The counterpart of the memory model's own peak (``cost/memory/``) when they disagree:
compile with ``XLA_FLAGS=--xla_dump_to=DIR`` (``plan.verify()`` does the compiling), then

    python tools/xla_peak.py DIR [module-name-part]

It takes the scheduled entry computation (``*after_optimizations.txt``, in schedule order)
and the values of the preallocated temp allocation (``*buffer-assignment.txt``), gives each
value the live range from its instruction to its last reader (through
``get-tuple-element`` and ``bitcast``), and prints the peak of their sum with the values
live there, largest first. The sum matches ``memory_analysis().temp_size_in_bytes`` to
within about 1% on the corpus models here (XLA's heap also fragments).
"""

from __future__ import annotations

import collections
import glob
import re
import sys


def _entry(text: str) -> tuple[list[str], dict[str, tuple[list[str], str]]]:
    entry = text[text.index("\nENTRY") :]
    entry = entry[: entry.index("\n}")]
    order: list[str] = []
    operands: dict[str, tuple[list[str], str]] = {}
    for line in entry.splitlines()[1:]:
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (.*)", line)
        if not m:
            continue
        name, rest = m.groups()
        args = re.search(r"\b[\w\-]+\((.*?)\)(?:, |$)", rest)
        operands[name] = (re.findall(r"%([\w.\-]+)", args.group(1)) if args else [], rest)
        order.append(name)
    return order, operands


def main() -> None:
    folder = sys.argv[1]
    part = sys.argv[2] if len(sys.argv) > 2 else "planned"
    assignment = sorted(glob.glob(f"{folder}/*{part}*after_optimizations-buffer-assignment.txt"))
    if not assignment:
        sys.exit(f"no *{part}*after_optimizations-buffer-assignment.txt in {folder}")
    hlo = assignment[-1].replace("-buffer-assignment.txt", ".txt")
    order, operands = _entry(open(hlo).read())
    position = {n: i for i, n in enumerate(order)}
    alias = {
        n: ops[0]
        for n, (ops, rest) in operands.items()
        if ops and re.search(r"\b(get-tuple-element|bitcast)\(", rest)
    }

    def root(n: str) -> str:
        while n in alias:
            n = alias[n]
        return n

    last: dict[str, int] = collections.defaultdict(int)
    for n in order:
        for o in operands[n][0]:
            last[root(o)] = max(last[root(o)], position[n])
            last[o] = max(last[o], position[n])
    values = []
    in_temp = False
    for line in open(assignment[-1]):
        if line.startswith("allocation"):
            in_temp = "preallocated-temp" in line
            continue
        m = in_temp and re.match(
            r"\s*value: <\d+ ([\w.\-]+)(\{[\d,]*\})? @\d+> \(size=(\d+),offset=\d+\): (.*)", line
        )
        if m and m.group(1) in position:
            name, index, size, shape = m.groups()
            start = position[name]
            values.append(
                (start, max(last.get(name, start), start), int(size), name + (index or ""), shape)
            )
    live = [0] * (len(order) + 1)
    for start, end, size, _, _ in values:
        for p in range(start, end + 1):
            live[p] += size
    peak = max(range(len(order)), key=live.__getitem__)
    print(f"peak {live[peak]:,} B at {peak} of {len(order)}: {order[peak]}")
    for start, end, size, name, shape in sorted(values, key=lambda v: -v[2]):
        if start <= peak <= end:
            print(f"  {size:>9,} {name:40s} {shape[:40]:40s} [{start},{end}]")


if __name__ == "__main__":
    main()
