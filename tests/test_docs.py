"""The docs keep up with the code: every ACTPACK_CONF key and every actpack.budget() argument
has a row in docs/guide.md's tables (the names read from the code, not listed here), and every
relative link in README.md, CONTRIBUTING.md and docs/*.md points at a file that exists (and,
with a #fragment into a markdown file, at a heading there)."""
import glob
import inspect
import os
import re

import pytest

from actpack import _env
import actpack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "guide.md")
PAGES = sorted([os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CONTRIBUTING.md")]
               + glob.glob(os.path.join(ROOT, "docs", "*.md")))
# [text](target) and ![alt](target), not inside inline code; the target up to a space or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _section(text, heading):
    """The text under a `## heading` line, up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"docs/guide.md has no section '## {heading}'"
    return match.group(1)


def _table_names(section):
    """The names in the first column of a section's tables: | `name` | ..."""
    return set(re.findall(r"^\| `([A-Za-z_]\w*)` \|", section, re.M))


def _guide():
    with open(GUIDE) as f:
        return f.read()


def test_every_budget_argument_has_a_row_in_the_guide():
    arguments = [name for name, p in inspect.signature(actpack.budget).parameters.items()
                 if not name.startswith("_")
                 and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    assert "max_rel_rms" in arguments and "limit" in arguments  # the signature was read
    documented = _table_names(_section(_guide(), "`actpack.budget()`"))
    missing = [name for name in arguments if name not in documented]
    assert not missing, f"actpack.budget() arguments without a row in docs/guide.md: {missing}"
    unknown = sorted(documented - set(arguments))
    assert not unknown, f"docs/guide.md documents budget() arguments that do not exist: {unknown}"


def test_every_actpack_conf_key_has_a_row_in_the_guide():
    keys = list(_env.KEYS)
    assert "budget" in keys and "max_rel_rms" in keys  # the parser's key table was read
    documented = _table_names(_section(_guide(), "`ACTPACK_CONF`"))
    missing = [key for key in keys if key not in documented]
    assert not missing, f"ACTPACK_CONF keys without a row in docs/guide.md: {missing}"
    unknown = sorted(documented - set(keys))
    assert not unknown, f"docs/guide.md documents ACTPACK_CONF keys that do not exist: {unknown}"


def _anchors(path):
    """GitHub's anchors for a markdown file's headings."""
    with open(path) as f:
        text = f.read()
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(anchor)
    return anchors


def _links(path):
    with open(path) as f:
        text = f.read()
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # code blocks
    text = re.sub(r"`[^`\n]*`", "", text)                       # inline code
    return LINK.findall(text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_points_at_a_file_that_exists(page):
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(resolved):
            broken.append(f"{target} (no {os.path.relpath(resolved, ROOT)})")
        elif fragment and resolved.endswith(".md") and fragment not in _anchors(resolved):
            broken.append(f"{target} (no heading #{fragment} in {os.path.relpath(resolved, ROOT)})")
    assert not broken, f"{os.path.relpath(page, ROOT)}: broken links: {broken}"


def test_the_pages_are_found():
    names = {os.path.relpath(p, ROOT) for p in PAGES}
    assert {"README.md", "CONTRIBUTING.md", "docs/guide.md", "docs/results.md",
            "docs/gpu.md", "docs/design.md"} <= names


def test_the_readme_stays_short():
    with open(os.path.join(ROOT, "README.md")) as f:
        assert len(f.read().splitlines()) <= 250
