"""The page of figures stays short and true to the tree: docs/performance.md is at most 250 lines,
neither it nor README.md names a commit id (figures come from results folders in the tree, not
from git history), and every relative link in either (with the heading its anchor names, as
GitHub makes anchors) and every `bench/...` path it names is a file or folder of this checkout.
In docs/performance.md a results folder named short (`dlrm-v2/offline/`, `trust/reload_aoti/`:
the first part a folder of bench/gpu/results/) must be there too; README.md's first table holds at
most 10 headline figures, each row with a link. No server needed."""
import glob
import os
import re

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PAGE = "docs/performance.md"
PAGES = [PAGE, "README.md"]
MAX_LINES = 250
RESULTS = os.path.join(ROOT, "bench", "gpu", "results")

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
BENCH_PATH = re.compile(r"(?<![\w./$-])bench/[\w./{},*-]*")
BACKTICKED = re.compile(r"`([^`\s]+)`")
HEX = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{7,40}(?![0-9A-Za-z])")


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def prose(text):
    """The text with fenced code blocks blanked (line numbers kept)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, `_`, `-`
    and spaces kept), spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return "".join(c for c in text if c.isalnum() or c in "_- ").replace(" ", "-")


def anchors(rel):
    """Every anchor the headings of a Markdown file give, duplicates numbered as GitHub does."""
    seen, out = {}, set()
    for line in prose(read(rel)).split("\n"):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def expand(path):
    """`a/{b,c}/d` as `a/b/d` and `a/c/d`."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [p for part in m.group(1).split(",") for p in expand(path[:m.start()] + part + path[m.end():])]


def exists(path):
    """Every path the braces make is there (a `*` matching at least one)."""
    return all(glob.glob(p) if any(c in p for c in "*?[") else os.path.exists(p) for p in expand(path))


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


@pytest.mark.parametrize("rel", PAGES)
def test_the_page_exists(rel):
    assert os.path.isfile(os.path.join(ROOT, rel)), rel


def test_the_page_of_figures_is_short():
    n = len(read(PAGE).splitlines())
    assert n <= MAX_LINES, f"{PAGE} has {n} lines; at most {MAX_LINES}: move details to the results folders' READMEs"


@pytest.mark.parametrize("rel", PAGES)
def test_no_commit_ids(rel):
    """A 7-40 character hex token with a digit and a letter reads as a commit id (or a build's
    md5): figures come from results folders in the tree, and those say which build ran."""
    text = read(rel)
    found = [(line_of(text, m.start()), m.group(0)) for m in HEX.finditer(text)
             if re.search(r"[a-f]", m.group(0)) and re.search(r"[0-9]", m.group(0))]
    assert not found, f"{rel} names commit ids (line, id): {found}"


@pytest.mark.parametrize("rel", PAGES)
def test_relative_links_resolve(rel):
    text = prose(read(rel))
    here = os.path.dirname(os.path.join(ROOT, rel))
    bad = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(here, path)) if path else os.path.join(ROOT, rel)
        where = f"line {line_of(text, m.start())}: {target}"
        if not full.startswith(ROOT) or not os.path.exists(full):
            bad.append(f"{where} (no such file or folder)")
        elif anchor and full.endswith(".md") and anchor not in anchors(os.path.relpath(full, ROOT)):
            bad.append(f"{where} (no heading makes '#{anchor}')")
    assert not bad, f"{rel}: links that do not resolve:\n" + "\n".join(bad)


@pytest.mark.parametrize("rel", PAGES)
def test_bench_paths_resolve(rel):
    text = read(rel)
    bad = []
    for m in BENCH_PATH.finditer(text):
        path = m.group(0).rstrip(".,")
        if not exists(os.path.join(ROOT, path)):
            bad.append(f"line {line_of(text, m.start())}: {path}")
    assert not bad, f"{rel}: paths that are not in the tree:\n" + "\n".join(bad)


def test_readme_opens_with_one_table_of_headline_figures():
    """README.md: what it is, the two commands, then one table of at most 10 figures, each row
    linking to its results folder or the section of the docs that holds it."""
    text = read("README.md")
    first_table = text.index("\n|")
    assert "bash scripts/demo.sh" in text[:first_table] and "bash scripts/test.sh" in text[:first_table]
    rows = []
    for line in text[first_table + 1:].split("\n"):
        if not line.startswith("|"):
            break
        rows.append(line)
    figures = rows[2:]  # the header and its rule
    assert 1 <= len(figures) <= 10, f"README.md's first table has {len(figures)} rows; at most 10"
    unlinked = [r[:60] for r in figures if not LINK.search(r)]
    assert not unlinked, f"README.md's headline rows without a link: {unlinked}"


def test_short_results_folders_resolve():
    """In the page of figures `dlrm-v2/offline/` means bench/gpu/results/dlrm-v2/offline/."""
    text = read(PAGE)
    tops = {e for e in os.listdir(RESULTS) if os.path.isdir(os.path.join(RESULTS, e))}
    bad = []
    for m in BACKTICKED.finditer(text):
        path = m.group(1)
        if "/" not in path or path.split("/")[0] not in tops:
            continue
        if not exists(os.path.join(RESULTS, path)):
            bad.append(f"line {line_of(text, m.start())}: {path}")
    assert not bad, f"{PAGE}: results folders that are not in bench/gpu/results/:\n" + "\n".join(bad)


def test_the_checks_can_fail():
    """The helpers catch what they are for: an anchor GitHub would not make, a missing folder,
    a commit id."""
    assert slug("MLPerf DLRM-v2 with 10% of the rows in the GPU cache") == \
        "mlperf-dlrm-v2-with-10-of-the-rows-in-the-gpu-cache"
    assert slug("Merlin HPS's four published points") == "merlin-hpss-four-published-points"
    assert slug("Measured (two H200s; `bench/gpu/results/recommenders/dlrm_two_gpus/`)") == \
        "measured-two-h200s-benchgpuresultsrecommendersdlrm_two_gpus"
    assert expand("a/{b,c}/d") == ["a/b/d", "a/c/d"]
    assert exists(os.path.join(RESULTS, "trust", "reload_{torch,onnx}"))
    assert not exists(os.path.join(RESULTS, "trust", "reload_{torch,nothing}"))
    assert [m.group(0) for m in HEX.finditer("ran at 1cc9dcc (commit), 16,384 pairs, 1.89e-2")] == ["1cc9dcc"]
    assert [m.group(0) for m in BENCH_PATH.finditer("see `bench/gpu/results/x/`, and $OUT/bench/y")] == \
        ["bench/gpu/results/x/"]
