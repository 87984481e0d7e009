"""report.html: report.md as one self-contained page to share (tables, plots, runs, flags, provenance).

The page is report.md rendered: its text by markdown-it (CommonMark; raw HTML in the text is shown as
text, never run), its tables (dlaunch/tables.py's `markdown`, one row per line) straight into HTML tables
(markdown-it parses a table cell by cell: 5,000 runs took it seconds), every plot inlined as a data: URI,
a contents list of its sections and a small style sheet: no script, no file or address outside it, so
it opens the same anywhere (a mail attachment, a browser without network). Deterministic like
report.md: the same inputs give the same bytes.
"""

import base64
import html
import re
from pathlib import Path
from typing import List, Tuple

from dlaunch.atomic import write_atomic

PAGE = "report.html"
STYLE = """\
body { font-family: system-ui, sans-serif; margin: 0; color: #1b1b1b; background: #fff; }
main { max-width: 1100px; margin: 0 auto; padding: 1rem 1.5rem 3rem; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.25rem; margin-top: 2.2rem; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; display: block; overflow-x: auto; font-size: 0.85rem; margin: 0.8rem 0; }
th, td { border: 1px solid #d0d0d0; padding: 0.2rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f2f2f2; } tr:nth-child(even) td { background: #fafafa; }
code { font-size: 0.85em; overflow-wrap: anywhere; }
img { max-width: 100%; height: auto; display: block; margin: 1rem 0; border: 1px solid #eee; }
nav ul { columns: 2; font-size: 0.9rem; }
"""


def slug(text: str, taken: List[str]) -> str:
    """An id for a heading: its words in lower case joined by '-', made unique among `taken`."""
    base = "-".join(re.findall(r"[a-z0-9]+", text.lower())) or "section"
    name, n = base, 1
    while name in taken:
        n += 1
        name = "%s-%d" % (base, n)
    taken.append(name)
    return name


def inline_image(folder: Path, src: str) -> str:
    """A PNG of the report folder as a data: URI (`src` as it was when it is no file of the folder)."""
    path = folder / src
    if "/" in src or not src.endswith(".png") or not path.is_file() or path.is_symlink():
        return src
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


TABLE_RULE = re.compile(r"\|(---\|)+")  # the line under a Markdown table's header
CELL_BORDER = re.compile(r"(?<!\\)\|")  # a `|` that is no escaped one (`\|` in a cell)


def blocks(markdown_text: str) -> List[Tuple[bool, str]]:
    """(whether it is a table, its text) in order: a table is a run of lines that start with `|`, its
    second line the header rule; the text between tables goes to markdown-it."""
    lines = markdown_text.split("\n")
    found: List[Tuple[bool, str]] = []
    text: List[str] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and TABLE_RULE.fullmatch(lines[i + 1]):
            end = i + 2
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            found += [(False, "\n".join(text))] if text else []
            found.append((True, "\n".join(lines[i:end])))
            text, i = [], end
        else:
            text.append(lines[i])
            i += 1
    return found + ([(False, "\n".join(text))] if text else [])


def cells(line: str) -> List[str]:
    r"""The cells of a table line, unescaped (`\|` -> `|`) and escaped for HTML."""
    return [html.escape(cell.strip().replace("\\|", "|")) for cell in CELL_BORDER.split(line.strip())[1:-1]]


def table_html(lines: List[str]) -> str:
    head, rows = cells(lines[0]), [cells(line) for line in lines[2:]]
    return "<table>\n<thead>\n<tr>%s</tr>\n</thead>\n<tbody>\n%s</tbody>\n</table>\n" % (
        "".join("<th>%s</th>" % c for c in head),
        "".join("<tr>%s</tr>\n" % "".join("<td>%s</td>" % c for c in row) for row in rows),
    )


def render(markdown_text: str, folder: Path) -> str:
    """The page of `markdown_text`, whose images are PNG files in `folder`."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False})
    taken: List[str] = []
    sections: List[Tuple[str, str]] = []
    title = "dlaunch report"
    parts = []
    for table, text in blocks(markdown_text):
        if table:
            parts.append(table_html(text.split("\n")))
            continue
        tokens = md.parse(text)
        for i, token in enumerate(tokens):
            if token.type == "heading_open":
                heading = tokens[i + 1].content
                token.attrSet("id", slug(heading, taken))
                if token.tag == "h1":
                    title = heading
                elif token.tag == "h2":
                    sections.append((str(token.attrGet("id")), heading))
            for child in token.children or ():
                if child.type == "image":
                    child.attrSet("src", inline_image(folder, str(child.attrGet("src"))))
        parts.append(md.renderer.render(tokens, md.options, {}))
    body = "".join(parts)
    contents = "".join('<li><a href="#%s">%s</a></li>' % (anchor, html.escape(text)) for anchor, text in sections)
    body = body.replace("</h1>\n", "</h1>\n<nav><ul>%s</ul></nav>\n" % contents, 1)  # the contents under the title
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        "<title>%s</title>\n<style>\n%s</style>\n</head>\n<body>\n<main>\n%s</main>\n</body>\n</html>\n"
        % (html.escape(title), STYLE, body)
    )


def write_page(folder: Path) -> Path:
    """`folder`/report.html from `folder`/report.md and its plots, written atomically."""
    page = folder / PAGE
    write_atomic(page, render((folder / "report.md").read_text(encoding="utf-8"), folder))
    return page
