#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""docs/environment.md lists every KFT_* environment variable the code reads, and nothing else.

    environment_doc.py REPO_ROOT

What counts as a read, in include/, tools/, examples/ and bench/ (tests/ is not scanned: its
programs read what their own scripts set them, and any variable a user sets is read by the code
above too):

  C++ (.hpp .cpp .h .cu .cuh)  a string literal that is exactly a name: "KFT_X" (env.get("KFT_X"),
                               env.has("KFT_X"), std::getenv("KFT_X"), a name kftrun sets for its
                               workers, a helper taking the name); not a name inside a longer text
  Python (.py)                 a string literal that is exactly a name: os.environ.get("KFT_X"),
                               os.environ["KFT_X"], "KFT_X" in os.environ, os.getenv('KFT_X')
  shell (.sh)                  $KFT_X, ${KFT_X...}
  CMake (CMakeLists.txt .cmake) $ENV{KFT_X}

Macros (#if KFT_WITH_MPI) and CMake cache variables (KFT_WITH_*, KFT_BUILD_*) are not environment
variables and are not read this way. A literal that ends in "_" ("KFT_SHM_" + name) builds names
by concatenation: the test fails until the names it builds are listed in CONCATENATED below (and
documented).

Documented: a `KFT_X` in backticks in the first cell of a table row of docs/environment.md.
Fails when the code reads a variable the page does not list, or the page lists one nothing reads.
"""
import os
import re
import sys

SCANNED = ("include", "tools", "examples", "bench")
NAME = r"KFT_[A-Z0-9_]*[A-Z0-9]"
CPP_LITERAL = re.compile(r'"(KFT_[A-Z0-9_]+)"')
PY_LITERAL = re.compile(r'''(["'])(KFT_[A-Z0-9_]+)\1''')
SH_READ = re.compile(r"\$\{?(" + NAME + r")\b")
CMAKE_READ = re.compile(r"\$ENV\{(" + NAME + r")\}")
DOC_ROW = re.compile(r"^\|\s*`(" + NAME + r")`")

# Prefix literal -> the names the code builds from it (none today; see the docstring).
CONCATENATED = {}


def kind_of(path):
    base = os.path.basename(path)
    ext = os.path.splitext(base)[1]
    if ext in (".hpp", ".cpp", ".h", ".cu", ".cuh"):
        return "cpp"
    if ext == ".py":
        return "py"
    if ext == ".sh":
        return "sh"
    if base == "CMakeLists.txt" or ext == ".cmake":
        return "cmake"
    return None


def reads_in(text, kind):
    """(name, how) for every read in one file's text; a name ending in '_' is a prefix."""
    if kind == "cpp":
        return [(m.group(1), "literal") for m in CPP_LITERAL.finditer(text)]
    if kind == "py":
        return [(m.group(2), "literal") for m in PY_LITERAL.finditer(text)]
    if kind == "sh":
        return [(m.group(1), "$") for m in SH_READ.finditer(text)]
    if kind == "cmake":
        return [(m.group(1), "$ENV") for m in CMAKE_READ.finditer(text)]
    return []


def scan(root):
    """name -> sorted files that read it; prefix -> files, for literals ending in '_'."""
    found, prefixes = {}, {}
    for top in SCANNED:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if not x.startswith("."))
            for f in sorted(files):
                path = os.path.join(d, f)
                kind = kind_of(path)
                if kind is None:
                    continue
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                rel = os.path.relpath(path, root)
                for name, _ in reads_in(text, kind):
                    if name.endswith("_"):
                        prefixes.setdefault(name, set()).add(rel)
                        for built in CONCATENATED.get(name, ()):
                            found.setdefault(built, set()).add(rel)
                    else:
                        found.setdefault(name, set()).add(rel)
    return found, prefixes


def documented(path):
    names = {}
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            m = DOC_ROW.match(line)
            if m:
                names.setdefault(m.group(1), []).append(n)
    return names


def self_test():
    """The patterns catch the reads they are meant to, and not names inside longer text."""
    cases = [
        ('auto v = env.get("KFT_NEW_ONE");', "cpp", {"KFT_NEW_ONE"}),
        ('if (const char* t = std::getenv("KFT_NEW_TWO")) {}', "cpp", {"KFT_NEW_TWO"}),
        ('env.has("KFT_NEW_THREE") && x', "cpp", {"KFT_NEW_THREE"}),
        ('throw error("set KFT_NOT_A_READ to one value");', "cpp", set()),
        ('#if KFT_WITH_MPI', "cpp", set()),
        ('s = env.get("KFT_SHM_" + name);', "cpp", {"KFT_SHM_"}),
        ('x = os.environ.get("KFT_PY_ONE", "1")', "py", {"KFT_PY_ONE"}),
        ("y = os.environ['KFT_PY_TWO']", "py", {"KFT_PY_TWO"}),
        ('if "KFT_PY_THREE" in os.environ: pass', "py", {"KFT_PY_THREE"}),
        ('print("KFT_PY_NOT a read")', "py", set()),
        ('ranks=${KFT_SH_ONE:-4}; echo "$KFT_SH_TWO"', "sh", {"KFT_SH_ONE", "KFT_SH_TWO"}),
        ('KFT_SH_SET=1 ./prog', "sh", set()),
        ('set(x $ENV{KFT_CMAKE_ONE})', "cmake", {"KFT_CMAKE_ONE"}),
        ('option(KFT_WITH_MPI "MPI" OFF)', "cmake", set()),
    ]
    bad = []
    for text, kind, want in cases:
        got = {n for n, _ in reads_in(text, kind)}
        if got != want:
            bad.append(f"{kind}: {text!r}: found {sorted(got)}, expected {sorted(want)}")
    rows = ["| `KFT_DOC_ONE` | 1 | x |", "|`KFT_DOC_TWO`|", "| see `KFT_NOT_FIRST` | x |", "prose `KFT_PROSE`"]
    got = {m.group(1) for r in rows for m in [DOC_ROW.match(r)] if m}
    if got != {"KFT_DOC_ONE", "KFT_DOC_TWO"}:
        bad.append(f"documented rows: found {sorted(got)}")
    return bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    problems = [f"scanner self-test: {b}" for b in self_test()]
    found, prefixes = scan(root)
    for p, files in sorted(prefixes.items()):
        if p not in CONCATENATED:
            problems.append(f'"{p}" in {", ".join(sorted(files))} builds variable names by concatenation: list the '
                            f"names it builds in CONCATENATED (tests/repo/environment_doc.py) and in docs/environment.md")
    doc_path = os.path.join(root, "docs", "environment.md")
    docs = documented(doc_path)
    for name, lines in sorted(docs.items()):
        if len(lines) > 1:
            problems.append(f"docs/environment.md lists {name} more than once (lines {', '.join(map(str, lines))})")
    for name in sorted(set(found) - set(docs)):
        problems.append(f"{name} is read by {', '.join(sorted(found[name]))} but docs/environment.md does not list it")
    for name in sorted(set(docs) - set(found)):
        problems.append(f"docs/environment.md lists {name} (line {docs[name][0]}), but nothing in "
                        f"{', '.join(SCANNED)} reads it: remove the row, or the scanner misses its read")
    if len(found) < 20:
        problems.append(f"only {len(found)} variables found: the scanner is broken")
    for p in problems:
        print("FAIL", p)
    print(f"environment_doc: {len(found)} variables read, {len(docs)} documented, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
