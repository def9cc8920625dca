#!/usr/bin/env python3
"""Checks that every target of Package.swift declares the modules it imports, and imports the ones it declares
(called by scripts/check-deploy.sh; needs only the Python standard library).

  check_imports.py [ROOT]     ROOT is the package directory (default: the one above this script)

A target's modules are the names in its `dependencies:` (a target's name, or a product's `name:`, which for
every package Herald uses is also its module's name). Its imports are the `import` lines of its .swift files,
with any attributes and access level (`@testable import`, `@preconcurrency import`, `public import`,
`internal import`, ...) and kind (`import struct M.T`). The toolchain's own modules (SYSTEM_MODULES) need no
declaration. A target with no .swift files (a C or system-library target) is not checked.

Prints one line per mismatch, naming the target and the module, and exits 1 if there was any.
"""
import os
import re
import sys

# Modules the toolchain or the platform provides: imported without a package dependency.
SYSTEM_MODULES = {
    "Foundation", "FoundationEssentials", "FoundationInternationalization", "FoundationNetworking",
    "CoreFoundation", "Glibc", "Musl", "Darwin", "Android", "WinSDK", "Synchronization", "Dispatch", "XCTest",
    "Testing", "Swift", "_Concurrency", "_StringProcessing", "RegexBuilder", "Observation", "Distributed",
}

# Products that hold more than one module: a dependency on the product lets a target import any of them.
PRODUCT_MODULES = {"Metrics": {"Metrics", "CoreMetrics"}}

TARGET_START = re.compile(r"\.(target|executableTarget|testTarget|systemLibrary|plugin|macro)\s*\(")
IMPORT_LINE = re.compile(
    r"^\s*(?:@\w+(?:\([^)]*\))?\s+)*"  # @testable, @preconcurrency, @_implementationOnly, @_spi(X)
    r"(?:(?:public|package|internal|fileprivate|private)\s+)?"
    r"import\s+(?:(?:struct|class|enum|protocol|typealias|func|var|let)\s+)?"
    r"([A-Za-z_][A-Za-z0-9_]*)")


def strip_comments(text):
    """Package.swift without // comments (outside strings) and /* */ blocks."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out = []
    for line in text.split("\n"):
        in_string = False
        cut = len(line)
        i = 0
        while i < len(line):
            c = line[i]
            if c == '"' and (i == 0 or line[i - 1] != "\\"):
                in_string = not in_string
            elif not in_string and line.startswith("//", i):
                cut = i
                break
            i += 1
        out.append(line[:cut])
    return "\n".join(out)


def call_body(text, open_paren):
    """The text between the parenthesis at `open_paren` and its match (strings taken into account)."""
    depth = 0
    in_string = False
    for i in range(open_paren, len(text)):
        c = text[i]
        if c == '"' and text[i - 1] != "\\":
            in_string = not in_string
        elif in_string:
            continue
        elif c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
            if depth == 0:
                return text[open_paren + 1:i]
    raise ValueError("unbalanced parentheses in Package.swift")


def top_level_argument(body, label):
    """The value of `label:` at the top level of a call's argument list, or None."""
    depth = 0
    in_string = False
    i = 0
    while i < len(body):
        c = body[i]
        if c == '"' and (i == 0 or body[i - 1] != "\\"):
            in_string = not in_string
        elif not in_string:
            if c in "([":
                depth += 1
            elif c in ")]":
                depth -= 1
            elif depth == 0 and re.match(r"\b%s\s*:" % label, body[i:]) and (i == 0 or not body[i - 1].isalnum()):
                rest = body[i + len(label):].lstrip()[1:].lstrip()
                if rest.startswith("["):
                    return "[" + call_body(rest, 0) + "]"
                m = re.match(r'"([^"]*)"', rest)
                return m.group(1) if m else rest
        i += 1
    return None


def dependency_modules(dependencies):
    """The module names of a `dependencies:` array: plain names, `.target(name:)`, `.product(name:)`,
    `.byName(name:)`."""
    modules = []
    inner = dependencies[1:-1]
    for m in re.finditer(r'\.(?:product|target|byName)\s*\(\s*name\s*:\s*"([^"]+)"[^)]*\)|"([^"]+)"', inner):
        modules.append(m.group(1) or m.group(2))
    return modules


def targets(root):
    """(kind, name, path, declared modules) for every target of ROOT/Package.swift."""
    with open(os.path.join(root, "Package.swift"), encoding="utf-8") as f:
        text = strip_comments(f.read())
    found = []
    for m in TARGET_START.finditer(text):
        kind = m.group(1)
        body = call_body(text, m.end() - 1)
        name = top_level_argument(body, "name")
        if name is None:
            continue
        path = top_level_argument(body, "path")
        if path is None:
            path = os.path.join("Tests" if kind == "testTarget" else "Sources", name)
        deps = top_level_argument(body, "dependencies")
        found.append((kind, name, path, dependency_modules(deps) if deps else []))
    return found


def imports(directory):
    """Every module imported by the .swift files below `directory` (not counting lines inside a multi-line
    string literal or a block comment, such as a Python script a test runs)."""
    modules = set()
    for base, _, files in os.walk(directory):
        for name in files:
            if not name.endswith(".swift"):
                continue
            with open(os.path.join(base, name), encoding="utf-8") as f:
                quoted = False
                commented = False
                for line in f:
                    if not quoted and not commented:
                        m = IMPORT_LINE.match(line)
                        if m:
                            modules.add(m.group(1))
                    if not commented:
                        quoted ^= line.count('"""') % 2 == 1
                    if not quoted:
                        if "/*" in line and "*/" not in line.split("/*")[-1]:
                            commented = True
                        elif commented and "*/" in line:
                            commented = False
    return modules


def has_swift(directory):
    return any(name.endswith(".swift") for _, _, files in os.walk(directory) for name in files)


def check(root):
    """The mismatches of the package at `root`, one line each."""
    problems = []
    for kind, name, path, declared in targets(root):
        directory = os.path.join(root, path)
        if kind in ("systemLibrary", "plugin") or not os.path.isdir(directory) or not has_swift(directory):
            continue
        imported = imports(directory) - SYSTEM_MODULES - {name}
        provided = {module: PRODUCT_MODULES.get(module, {module}) for module in declared}
        reachable = set().union(*provided.values()) if provided else set()
        for module in sorted(imported - reachable):
            problems.append(f"target {name} ({path}) imports {module} but does not declare it")
        for module in sorted(m for m, modules in provided.items() if not modules & imported):
            problems.append(f"target {name} ({path}) declares {module} but never imports it")
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    problems = check(root)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
