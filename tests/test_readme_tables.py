"""The README's measured tables are rendered from the committed result files
(benchmarks/readme_tables.py): a figure changed in the README, or a result file rewritten without
re-rendering, fails here."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import readme_tables  # noqa: E402


def test_the_readme_tables_match_their_result_files(capsys):
    assert readme_tables.main(["--check"]) == 0, capsys.readouterr().err
    with open(readme_tables.README) as f:
        text = f.read()
    assert {m.group("name") for m in readme_tables.BLOCK.finditer(text)} == set(readme_tables.TABLES)


def test_a_figure_edited_by_hand_is_found():
    with open(readme_tables.README) as f:
        text = f.read()
    # quant2's last loss, as its row shows it, changed by one in the last digit.
    rows = readme_tables.load("diverging_lm.json")["rows"]
    shown = f"| {rows['quant2']['last_loss']:.3f} |"
    edited = text.replace(shown, f"| {rows['quant2']['last_loss'] + 0.001:.3f} |", 1)
    assert edited != text
    fixed, changed = readme_tables.rendered(edited)
    assert changed == ["diverging-lm"] and fixed == text
