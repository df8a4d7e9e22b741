"""``python -m benchmarks``'s output: one document, each generated section replaced in
place between its markers, hand-written parts kept."""

from __future__ import annotations

from benchmarks.__main__ import HEADER, _with_run_line, splice


def test_a_run_replaces_its_section_in_place_and_keeps_the_rest():
    old = (
        "# Benchmarks\n\nintro\n\n<!-- bench:kernel -->\n## Kernel\nold figures\n"
        "<!-- /bench:kernel -->\n\n## Hand-written\nkept as written\n\n"
        "<!-- bench:search -->\n## Search\nsearch figures\n<!-- /bench:search -->\n"
    )
    new = splice(old, {"kernel": "## Kernel\nnew figures", "budgets": "## Budgets\nb"})
    assert new.count("# Benchmarks") == 1 and "old figures" not in new
    assert new.index("new figures") < new.index("kept as written") < new.index("search figures")
    assert new.rstrip().endswith("<!-- /bench:budgets -->")  # a new section goes last
    assert splice(new, {"kernel": "## Kernel\nnew figures"}) == new  # idempotent


def test_an_empty_file_gets_the_header_and_a_section_its_run_line():
    body = _with_run_line("## Kernel\n\nfigures", "2026-12-07, 2 CPU cores", "kernel")
    assert body.splitlines()[2] == (
        "Run 2026-12-07, 2 CPU cores: `python -m benchmarks --only kernel`."
    )
    text = splice("", {"kernel": body})
    assert text.startswith(HEADER.strip().splitlines()[0]) and "<!-- bench:kernel -->" in text
