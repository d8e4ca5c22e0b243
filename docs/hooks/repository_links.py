"""MkDocs hook: links from the documentation to files of the repository outside docs/.

The pages link to the repository's own files (committed results, examples, tests) with
relative links such as ``../benchmarks/results/cpu-2026-11-23/results.md``, which work when
the Markdown is read on a code host. MkDocs only knows the files under docs/, so this hook
adds every repository file a page links to (and, for a linked Markdown file, what it links to
in turn) to the site under ``repository/<path>``: Markdown files become pages outside the
navigation, other files are copied as they are. The links are rewritten to those copies.

A link to a repository path that does not exist, or to a folder, fails the build: the site
is built with ``--strict`` in CI, so a moved results file cannot leave a dead link behind.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files, InclusionLevel

PREFIX = "repository"
# A Markdown link or image target: ](target) or ](target "title"); code is masked first.
LINK = re.compile(r"(\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def _docs(config) -> Path:
    return Path(config.docs_dir).resolve()


def _masked(markdown: str) -> str:
    """``markdown`` with code blocks and spans blanked (same length), so no link is found
    inside them."""
    for pattern in (FENCE, CODE_SPAN):
        markdown = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), markdown)
    return markdown


def _relative_targets(markdown: str) -> list[tuple[int, int, str, str]]:
    """(start, end, path, anchor) of each relative link target in ``markdown``."""
    found = []
    for match in LINK.finditer(_masked(markdown)):
        start, end = match.span(2)
        target = markdown[start:end]
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "/")):
            continue
        path, _, anchor = target.partition("#")
        found.append((start, end, path, anchor))
    return found


def _resolve(page: Path, path: str, root: Path, source: str) -> Path:
    """The repository file ``path`` (relative to ``page``) names; PluginError if none."""
    target = (page.parent / path).resolve()
    if root not in target.parents:
        raise PluginError(f"{source}: the link {path!r} leaves the repository")
    if not target.is_file():
        what = "a folder (link a file in it)" if target.is_dir() else "not a file in the repository"
        raise PluginError(f"{source}: the link {path!r} names {what}")
    return target


def on_files(files: Files, config) -> Files:
    """Add the repository files the pages link to, following linked Markdown files."""
    root, docs = _root(config), _docs(config)
    queue = [Path(f.abs_src_path) for f in files.documentation_pages()]
    seen = set(queue)
    while queue:
        page = queue.pop()
        source = page.relative_to(root).as_posix()
        for _, _, path, _ in _relative_targets(page.read_text(encoding="utf-8")):
            if not path:
                continue
            target = _resolve(page, path, root, source)
            if docs in target.parents or target in seen:
                continue
            seen.add(target)
            uri = posixpath.join(PREFIX, target.relative_to(root).as_posix())
            files.append(
                File.generated(
                    config, uri, abs_src_path=str(target), inclusion=InclusionLevel.NOT_IN_NAV
                )
            )
            if target.suffix == ".md":
                queue.append(target)
    return files


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    """Point each link at a repository file to that file's copy on the site."""
    root, docs = _root(config), _docs(config)
    real = Path(page.file.abs_src_path).resolve()
    here = posixpath.dirname(page.file.src_uri)
    out, last = [], 0
    for start, end, path, anchor in _relative_targets(markdown):
        if not path:
            continue
        target = _resolve(real, path, root, page.file.src_uri)
        if docs in target.parents:
            uri = target.relative_to(docs).as_posix()
        else:
            uri = posixpath.join(PREFIX, target.relative_to(root).as_posix())
        new = posixpath.relpath(uri, here or ".") + (f"#{anchor}" if anchor else "")
        out += [markdown[last:start], new]
        last = end
    out.append(markdown[last:])
    return "".join(out)
