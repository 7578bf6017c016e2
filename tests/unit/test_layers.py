#!/usr/bin/env python3
"""The layering of daemon/, checked against the one place it is written:
the ```layers block of docs/architecture.md (top line first; a folder may
include the headers of its own folder and of the folders on lines below
its own, not of a folder on its line or above).

For every quoted #include of every .c, .h and .cu under daemon/, the header
is found the way the compiler finds it (the includer's folder first, then
the daemon's folders, then common/, proto/ and include/ovl/, which lie
below every layer); an include of a daemon folder above the includer's, or
beside it, fails, naming the file, the line and the two layers. A folder of
daemon/ that the block does not name fails too, and so does a core file
that includes a wire header (proto's *.pb-c.h or wire.h): the core sees
descriptors, never messages.

The checker is proved able to fail: it runs first on small made-up trees
with an include upwards, one sideways, a cycle and an unlisted folder, each
of which it must refuse. Usage: test_layers.py [SOURCE_DIR]
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
WIRE = re.compile(r'(\.pb-c\.h|^wire\.h)$')
OUTSIDE = ("common", "proto", os.path.join("include", "ovl"))


def read_layers(doc_text):
    """The ```layers block: a list of lines, each a list of folders (paths
    under daemon/, '.' for daemon/ itself), top first."""
    m = re.search(r"```layers\n(.*?)```", doc_text, re.S)
    if not m:
        raise ValueError("docs/architecture.md has no ```layers block")
    rows = []
    for line in m.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            rows.append(line.split())
    seen = set()
    for row in rows:
        for f in row:
            if f in seen:
                raise ValueError("layer %s named twice" % f)
            seen.add(f)
    return rows


def check(files, rows, outside_headers):
    """files: {path under daemon/ ('core/job.c'): text}. Returns a list of
    problems in words (empty: the tree keeps the layering)."""
    level = {f: i for i, row in enumerate(rows) for f in row}
    problems = []
    by_name = {}
    for path in files:
        by_name.setdefault(os.path.basename(path), []).append(path)

    def folder(path):
        return os.path.dirname(path) or "."

    for path in sorted(files):
        if folder(path) not in level:
            problems.append("%s: its folder %s is in no layer of docs/architecture.md" %
                            (path, folder(path)))
    for path in sorted(files):
        src = folder(path)
        if src not in level:
            continue
        text = files[path]
        for m in INCLUDE.finditer(text):
            name = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            here = os.path.normpath(os.path.join(src, name))
            if here in files:
                target = here
            elif len(by_name.get(os.path.basename(name), [])) == 1 and "/" not in name:
                target = by_name[name][0]
            elif len(by_name.get(os.path.basename(name), [])) > 1 and "/" not in name:
                problems.append("%s:%d: \"%s\" names %s: which one is meant?" %
                                (path, line, name, " and ".join(by_name[name])))
                continue
            elif os.path.basename(name) in outside_headers:
                if src == "core" and WIRE.search(os.path.basename(name)):
                    problems.append("%s:%d: the core includes the wire header %s" %
                                    (path, line, name))
                continue
            else:
                continue  # a system header in quotes, or a generated one
            dst = folder(target)
            if dst == src or dst not in level:
                continue
            if level[dst] == level[src]:
                problems.append("%s:%d: includes %s, beside it (layer %s and %s on one line)" %
                                (path, line, target, src, dst))
            elif level[dst] < level[src]:
                problems.append("%s:%d: includes %s, of layer %s above its own (%s)" %
                                (path, line, target, dst, src))
    return problems


def load_tree(root):
    files = {}
    base = os.path.join(root, "daemon")
    for d, _, names in os.walk(base):
        for n in names:
            if n.endswith((".c", ".h", ".cu")):
                p = os.path.join(d, n)
                with open(p, encoding="utf-8") as f:
                    files[os.path.relpath(p, base)] = f.read()
    outside = set()
    for o in OUTSIDE:
        for d, _, names in os.walk(os.path.join(root, o)):
            outside.update(n for n in names if n.endswith(".h"))
    outside.update(("ovl.pb-c.h", "peer.pb-c.h", "cluster.pb-c.h", "xfer.pb-c.h"))
    return files, outside


def self_test():
    rows = [["."], ["top"], ["mid", "side"], ["low"]]
    out = {"wire.h", "ovl.pb-c.h"}
    good = {"main.c": '#include "a.h"\n', "top/a.h": '#include "b.h"\n#include "ovl.h"\n',
            "mid/b.h": '#include "c.h"\n', "side/s.h": '#include "c.h"\n', "low/c.h": ""}
    assert check(good, rows, out) == [], check(good, rows, out)
    bad = {
        "upwards": dict(good, **{"low/c.h": '#include "b.h"\n'}),
        "sideways": dict(good, **{"mid/b.h": '#include "s.h"\n'}),
        "a cycle": dict(good, **{"low/c.h": '#include "a.h"\n'}),
        "an unlisted folder": dict(good, **{"other/x.c": ""}),
    }
    for what, tree in bad.items():
        assert check(tree, rows, out), "the checker let %s through" % what
    core_rows = [["core"]]
    assert check({"core/x.c": '#include "ovl.pb-c.h"\n'}, core_rows, out), \
        "the checker let the core include a wire header"
    assert check({"core/x.c": '#include "wire.h"\n'}, core_rows, out)
    print("PASS self-test: an include upwards, sideways, a cycle, an unlisted folder and a wire "
          "header in the core are each refused")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "OVL_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    self_test()
    with open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8") as f:
        rows = read_layers(f.read())
    files, outside = load_tree(root)
    problems = check(files, rows, outside)
    for p in problems:
        print("FAIL " + p)
    if problems:
        return 1
    print("PASS daemon/: %d files in %d layers (%s), no include upwards or sideways, no wire "
          "header in the core" % (len(files), len(rows),
                                  " > ".join("/".join(r) for r in rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
