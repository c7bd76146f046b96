"""The docs' measured tables are rendered from the committed result files
(benchmarks/readme_tables.py): docs/results.md is made whole from them, and README.md's and
docs/gpu.md's table blocks in place. A figure changed by hand, or a result file rewritten
without re-rendering, fails here."""
import glob
import os
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import readme_tables  # noqa: E402


def test_the_docs_match_their_result_files(capsys):
    assert readme_tables.main(["--check"]) == 0, capsys.readouterr().err


def test_every_table_is_shown_somewhere():
    doc = readme_tables.results_doc()
    blocks = set()
    for page in readme_tables.pages():
        with open(page) as f:
            blocks |= {m.group("name") for m in readme_tables.BLOCK.finditer(f.read())}
    unshown = [name for name, table in readme_tables.TABLES.items()
               if name not in blocks and table() not in doc]
    assert not unshown, f"tables in neither docs/results.md nor a page's block: {unshown}"


def test_a_figure_edited_by_hand_in_a_page_is_found():
    with open(readme_tables.README) as f:
        text = f.read()
    table = readme_tables.suite_versus_native()
    ratio = re.search(r"\| ([\d.]+)x \|$", table, re.M).group(1)
    edited = text.replace(f"| {ratio}x |", f"| {float(ratio) + 0.01:.2f}x |", 1)
    assert edited != text
    fixed, changed = readme_tables.rendered(edited)
    assert changed == ["suite-versus-native"] and fixed == text


def test_an_edited_results_doc_fails_the_check_and_is_rewritten(tmp_path, monkeypatch, capsys):
    copy = tmp_path / "results.md"
    shutil.copy(readme_tables.RESULTS_DOC, copy)
    rows = readme_tables.load("diverging_lm.json")["rows"]
    shown = f"| {rows['quant2']['last_loss']:.3f} |"
    text = copy.read_text()
    assert shown in text
    copy.write_text(text.replace(shown, f"| {rows['quant2']['last_loss'] + 0.001:.3f} |", 1))
    monkeypatch.setattr(readme_tables, "RESULTS_DOC", str(copy))
    monkeypatch.setattr(readme_tables, "pages", lambda: [])
    assert readme_tables.main(["--check"]) == 1
    assert "docs/results.md" in capsys.readouterr().err
    assert readme_tables.main([]) == 0
    assert copy.read_text() == readme_tables.results_doc()


def test_every_date_in_the_results_doc_comes_from_a_result_file():
    sources = ""
    for path in (glob.glob(os.path.join(readme_tables.RESULTS, "**", "*"), recursive=True)
                 + [os.path.join(ROOT, "codecs", "cuda", "traffic_16MiB.tsv"),
                    os.path.join(ROOT, "runtime", "testdata", "host_waits.txt")]):
        if os.path.isfile(path) and not path.endswith(".svg"):
            sources += os.path.basename(path) + "\n"
            with open(path, errors="replace") as f:
                sources += f.read()
    with open(readme_tables.RESULTS_DOC) as f:
        dates = set(re.findall(r"\b20\d\d-\d\d-\d\d\b", f.read()))
    assert dates, "docs/results.md names no date at all"
    assert not [d for d in dates if d not in sources]
