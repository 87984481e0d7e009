"""report.html: report.md as one self-contained page to share (tables, plots, runs, flags, provenance).

The page is report.md rendered by markdown-it (CommonMark and its tables; raw HTML in the text is shown
as text, never run) with every plot inlined as a data: URI, a contents list of its sections and a small
style sheet: no script, no file or address outside it, so it opens the same anywhere (a mail
attachment, a browser without network). Deterministic like report.md: the same inputs give the same bytes.
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


def render(markdown_text: str, folder: Path) -> str:
    """The page of `markdown_text`, whose images are PNG files in `folder`."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(markdown_text)
    taken: List[str] = []
    sections: List[Tuple[str, str]] = []
    title = "dlaunch report"
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            text = tokens[i + 1].content
            token.attrSet("id", slug(text, taken))
            if token.tag == "h1":
                title = text
            elif token.tag == "h2":
                sections.append((str(token.attrGet("id")), text))
        for child in token.children or ():
            if child.type == "image":
                child.attrSet("src", inline_image(folder, str(child.attrGet("src"))))
    body = md.renderer.render(tokens, md.options, {})
    contents = "".join('<li><a href="#%s">%s</a></li>' % (anchor, html.escape(text)) for anchor, text in sections)
    body = body.replace("</h1>\n", "</h1>\n<nav><ul>%s</ul></nav>\n" % contents, 1)  # the contents under the title
    return ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            "<title>%s</title>\n<style>\n%s</style>\n</head>\n<body>\n<main>\n%s</main>\n</body>\n</html>\n"
            % (html.escape(title), STYLE, body))


def write_page(folder: Path) -> Path:
    """`folder`/report.html from `folder`/report.md and its plots, written atomically."""
    page = folder / PAGE
    write_atomic(page, render((folder / "report.md").read_text(encoding="utf-8"), folder))
    return page
