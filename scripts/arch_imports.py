"""Rule 5 of scripts/check_architecture.py, on its own so that a test can run it on a crate it
makes: which files of a crate import, from its root, an item the root defines itself."""
import re

ROOT_ITEM = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+)?(?:extern\s+\"C\"\s+)?"
                       r"(?:fn|struct|enum|trait|const|type|static|union|macro_rules!)\s+(\w+)", re.M)


def code_of(text):
    """`text` without comments and without its `#[cfg(test)]` modules (from the first on)."""
    code = "\n".join(line.split("//", 1)[0] for line in text.splitlines())
    return code.split("#[cfg(test)]")[0]


def upward_imports(src):
    """(file, what) for each import, in a crate whose sources are under `src`, of an item its root
    (lib.rs or main.rs) defines itself."""
    root = next((src / n for n in ("lib.rs", "main.rs") if (src / n).exists()), None)
    if root is None:
        return []
    defined = set(ROOT_ITEM.findall(code_of(root.read_text())))
    found = []
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src).as_posix()
        if f == root or rel == "tests.rs" or rel.endswith("/tests.rs") or rel.startswith("bin/"):
            continue
        code = code_of(f.read_text())
        hits = {f"crate::{m}" for m in re.findall(r"\bcrate::(\w+)", code) if m in defined}
        for group in re.findall(r"\bcrate::\{([^}]*)\}", code):
            hits |= {f"crate::{n}" for n in (g.strip().split("::")[0] for g in group.split(","))
                     if n in defined}
        if "/" not in rel:  # right below the root: `super` is the root
            hits |= {f"super::{m}" for m in re.findall(r"\bsuper::(\w+)", code) if m in defined}
            hits |= {"super::*" for _ in re.findall(r"\bsuper::\*", code)}
            for group in re.findall(r"\bsuper::\{([^}]*)\}", code):
                hits |= {f"super::{n}" for n in (g.strip().split("::")[0] for g in group.split(","))
                         if n in defined or n == "*"}
        found += [(f, h) for h in sorted(hits)]
    return found
