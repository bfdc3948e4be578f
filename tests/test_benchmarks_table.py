"""BENCHMARKS.md's current-figures table and archive are what benchmarks/benchmarks_table.py writes, so the table
cannot drift from benchmarks/results/*.json."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _table_module():
    spec = importlib.util.spec_from_file_location("benchmarks_table", ROOT / "benchmarks" / "benchmarks_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmarks_md_is_what_the_table_script_writes():
    table = _table_module()
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert table.render(text, table.bench_reports()) == text, \
        "BENCHMARKS.md is stale: run python benchmarks/make_record.py && python benchmarks/benchmarks_table.py"


def test_every_row_links_to_a_section_in_the_file():
    table = _table_module()
    text = (ROOT / "BENCHMARKS.md").read_text()
    anchors = {table.anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}
    rows, stems = table.current_rows(table.bench_reports())
    assert rows and all(table.anchor(stem) in anchors for stem in stems)
