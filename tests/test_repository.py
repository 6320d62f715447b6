"""The repository holds only what the project wrote, and refers only to itself.

No third-party archive (a wheel, a tarball) is committed, and every document the code,
tests or docs name (``docs/hardware.md``, ``traces/README.md``) and every relative link
in the Markdown files is a file of the repository: a reader of a clone can follow each.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ARCHIVES = (".whl", ".tar.gz", ".tgz", ".zip", ".egg", ".tar", ".so", ".dylib", ".dll")
MENTION = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout ({e}): the repository's files are those git tracks")
    return [p for p in out.splitlines() if (REPO / p).is_file()]


def test_no_third_party_archive_is_committed():
    assert [p for p in tracked() if p.endswith(ARCHIVES)] == []


def test_every_document_named_is_in_the_repository():
    files = tracked()
    names = {Path(p).name for p in files if p.endswith(".md")}
    missing = []
    for path in files:
        if not path.endswith((".py", ".md", ".toml", ".ipynb", ".cfg", ".txt")) and not path.startswith(".ci/"):
            continue
        text = (REPO / path).read_text(errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if "tmp_path" in line:   # a test's own document, made under its temporary folder
                continue
            for name in MENTION.findall(line):
                if Path(name).name not in names and not (REPO / Path(path).parent / name).is_file():
                    missing.append(f"{path}:{n}: {name}")
    assert missing == [], "documents named but not in the repository:\n" + "\n".join(missing)


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for path in tracked():
        if not path.endswith(".md"):
            continue
        for n, line in enumerate((REPO / path).read_text().splitlines(), 1):
            for target in LINK.findall(line):
                if "://" in target or not re.fullmatch(r"[\w./-]*\w[\w./-]*", target):
                    continue   # a web address, or code that looks like a link: kernel[grid](*args)
                if not (REPO / Path(path).parent / target).exists():
                    broken.append(f"{path}:{n}: {target}")
    assert broken == [], "links to files the repository does not have:\n" + "\n".join(broken)
