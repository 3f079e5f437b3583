#!/usr/bin/env python3
"""docs_check.py [--emit DIR] - the pages of README.md, DESIGN.md and docs/
hold to two rules:

  1. every shell block (```sh, ```bash, ```console) of README.md and docs/
     is run by a test: either by tests/docs/run_blocks.sh (a block with no
     marker), or by the test a `<!-- run-by: NAME -->` line just before it
     names (NAME must be a registered ctest), or it says on that line why it cannot run here:
     `<!-- not-run: needs a GPU -->`;
  2. every relative link between pages leads to a file that exists, and its
     #anchor to a heading of that page (GitHub's slugs).

With --emit DIR it also writes, for run_blocks.sh, one script a page
(DIR/NN-<page>.sh, in reading order) of the page's runnable blocks, each
after an `echo` of its page and line."""
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHELL = {"sh", "bash", "console", "shell"}
MARK = re.compile(r"^<!--\s*(not-run|run-by):\s*(.*?)\s*-->\s*$")
# The order a reader meets the pages in: later pages may use what earlier
# ones made (models/tiny from docs/checkpoints.md, for instance).
ORDER = ["README.md", "docs/getting-started.md", "docs/checkpoints.md", "docs/job-spec.md",
         "docs/data.md", "docs/training.md", "docs/observability.md", "docs/server.md",
         "docs/rest-api.md", "docs/grpc-api.md", "docs/web.md", "docs/security.md",
         "docs/recovery.md", "docs/troubleshooting.md", "docs/gpu.md", "docs/slurm.md"]


def pages():
    docs = sorted("docs/" + f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    known = [p for p in ORDER if p in docs or p == "README.md"]
    return known + [p for p in docs if p not in known]


def blocks(text):
    """(info, first line number, body lines, the line before) of each fenced block."""
    lines = text.split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(2), m.group(3).lower(), i
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        before = lines[start - 1].strip() if start > 0 else ""
        out.append((info, start + 1, lines[start + 1:j], before))
        i = j + 1
    return out


def slug(heading, seen):
    s = re.sub(r"[`*_]|<[^>]+>", "", heading.strip()).lower()
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"[^\w\- ]", "", s).replace(" ", "-")
    n = seen.get(s, 0)
    seen[s] = n + 1
    return s if n == 0 else "%s-%d" % (s, n)


def anchors(path):
    text = open(path, encoding="utf-8").read()
    fenced = {n for _, first, body, _ in blocks(text) for n in range(first, first + len(body) + 2)}
    seen, out = {}, set()
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and n not in fenced:
            out.add(slug(m.group(1), seen))
    out |= set(re.findall(r'<a (?:name|id)="([^"]+)"', text))
    return out


def tests_known():
    names = set()
    for d in (os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "cmake")):
        for f in os.listdir(d):
            if f.endswith(".cmake") or f == "CMakeLists.txt":
                names |= set(re.findall(r"add_test\(NAME\s+(\S+)", open(os.path.join(d, f)).read()))
    return names


def main():
    emit = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--emit" else None
    problems, known, counts = [], tests_known(), {"run": 0, "run-by": 0, "not-run": 0}
    cache = {}
    for k, page in enumerate(pages() + ["DESIGN.md"]):
        path = os.path.join(ROOT, page)
        text = open(path, encoding="utf-8").read()
        script = []
        # DESIGN.md's links are checked; its blocks are pictures, not commands.
        for info, first, body, before in blocks(text) if page != "DESIGN.md" else []:
            if info not in SHELL:
                continue
            m = MARK.match(before)
            where = "%s:%d" % (page, first)
            if m and m.group(1) == "not-run":
                if not m.group(2):
                    problems.append(where + ": not-run without a reason")
                counts["not-run"] += 1
                continue
            if m:
                test = m.group(2)
                if test not in known:
                    problems.append("%s: run-by %s, which is no registered test" % (where, test))
                counts["run-by"] += 1
                continue
            counts["run"] += 1
            if info == "console":
                body = [l[2:] for l in body if l.startswith("$ ")]
            script.append("echo '== %s' >&2\n%s\n" % (where, "\n".join(body)))
        if emit and script:
            name = "%02d-%s.sh" % (k, page.replace("/", "_")[:-3])
            with open(os.path.join(emit, name), "w") as f:
                f.write("".join(script))
        for m in re.finditer(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)",
                             strip_code(text)):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                problems.append("%s: link to %s: no such file" % (page, target))
                continue
            if anchor and dest.endswith(".md"):
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    problems.append("%s: link to %s: no heading with that anchor" % (page, target))
    for p in problems:
        print("docs:", p)
    print("docs: %d blocks run by run_blocks.sh, %d by other tests, %d marked not runnable; %d "
          "problems" % (counts["run"], counts["run-by"], counts["not-run"], len(problems)))
    return 1 if problems else 0


def strip_code(text):
    """The text with fenced blocks and inline code blanked (links there are not links)."""
    text = re.sub(r"(?ms)^(\s*)(```+|~~~+).*?^\s*\2\s*$", "", text)
    return re.sub(r"`[^`\n]*`", "", text)


if __name__ == "__main__":
    sys.exit(main())
