"""Console tables that never cut a name or a path, at any width (80-column terminals, pipes).

Rich shrinks a table that is too wide by narrowing its widest columns and then cuts words with "…"
(`juwels-boo…`). Here every column is at least as wide as its longest word, so cells wrap only at
spaces; when the longest words do not fit side by side, the least important columns are left out
(named in the caption): one run or site per row for grep, whole paths for copying. A `one_line`
column (a description) is shown only where the whole table fits unwrapped: it never fills many lines.
When even the first column and the columns that must stay do not fit (a very long run name), the rows
are stacked instead: the first cell on a line of its own, the others as `header: value` pairs on the
next line, each line whole (a terminal wraps what is wider than itself; nothing is cut or broken).
"""

import functools
import re
from typing import TYPE_CHECKING, List, NamedTuple, Optional, Sequence

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.segment import Segment, Segments
from rich.text import Text

if TYPE_CHECKING:
    from rich.table import Table

# Between two columns: one cell of collapsed padding and the box's (blank) vertical separator.
COLUMN_GAP = 2
WORD = re.compile(r"\s*\S+\s*")  # a word with the whitespace around it, as rich wraps text


def longest_word(text: str) -> int:
    return max(map(len if text.isascii() and text.isprintable() else cell_len, text.split()), default=0)


def fit_widths(natural: Sequence[int], minimum: Sequence[int], available: int) -> List[int]:
    """Column widths summing to at most `available`: the natural widths when they fit, else the
    widest columns narrowed first, none below its minimum; only when the minimums do not fit either,
    the widest columns go below theirs (their cells fold)."""
    widths = list(natural)
    for floor in (minimum, [1] * len(widths)):
        while sum(widths) > available:
            narrowable = [i for i, w in enumerate(widths) if w > floor[i]]
            if not narrowable:
                break
            widths[max(narrowable, key=widths.__getitem__)] -= 1
    return widths


EMPTY_CELLS = ("", "-")  # a cell without a value


def stacked(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> RenderableType:
    """Each row as two lines: its first cell, then `header: value; ...` for the others that are set."""
    lines = [Text(title, style="bold")]
    for row in rows:
        lines.append(Text(row[0]))
        pairs = ["%s: %s" % (h, v) for h, v in zip(headers[1:], row[1:]) if v not in EMPTY_CELLS]
        lines.append(Text("  " + "; ".join(pairs)))
    return Group(*lines)


class Fitted(NamedTuple):
    """The columns of a table that fit a console: their indexes, widths, and the headers left out."""

    kept: List[int]
    widths: List[int]
    dropped: List[str]
    empty: List[str]  # those of `dropped` without a value in any row


def fit_columns(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    leave_out: Sequence[str] = (),
    one_line: Sequence[str] = (),
) -> Optional[Fitted]:
    """The columns of fit_table's table (None: the rows are stacked)."""
    kept = list(range(len(headers)))

    @functools.cache
    def minimum(i: int) -> int:
        return max([longest_word(headers[i])] + [longest_word(row[i]) for row in rows])

    @functools.cache
    def natural(i: int) -> int:
        return max([cell_len(headers[i])] + [cell_len(row[i]) for row in rows])

    def needed(columns: List[int]) -> int:
        width_of = natural if any(headers[i] in one_line for i in columns) else minimum
        return sum(width_of(i) for i in columns) + COLUMN_GAP * (len(columns) - 1)

    leave_out = [h for h in leave_out if h in headers]  # a caller's list may name columns this table lacks
    empty = [h for h in leave_out if all(row[headers.index(h)] in EMPTY_CELLS for row in rows)]
    dropped = []
    for header in empty + [h for h in leave_out if h not in empty]:  # a column with no value in any row goes first
        if needed(kept) <= width:
            break
        kept.remove(headers.index(header))
        dropped.append(header)
    if needed(kept) > width:
        return None
    widths = fit_widths([natural(i) for i in kept], [minimum(i) for i in kept], width - COLUMN_GAP * (len(kept) - 1))
    return Fitted(kept, widths, dropped, [h for h in dropped if h in empty])


def _table(title: str, headers: Sequence[str], fitted: Fitted, caption: Optional[str]) -> "Table":
    from rich import box
    from rich.table import Table  # not for `counted` and `markdown` (`run --dry-run` counts nodes)

    table = Table(
        title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, caption=caption
    )
    for i, column_width in zip(fitted.kept, fitted.widths):
        table.add_column(headers[i], width=column_width, overflow="fold")
    return table


def _caption(width: int, fitted: Fitted) -> Optional[str]:
    """What was left out, the columns without a value in any row named apart."""
    full = [h for h in fitted.dropped if h not in fitted.empty]
    parts = ([", ".join(full)] if full else []) + (["%s (no values)" % ", ".join(fitted.empty)] if fitted.empty else [])
    return "left out at %d columns: %s" % (width, "; ".join(parts)) if parts else None


def fit_table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    leave_out: Sequence[str] = (),
    one_line: Sequence[str] = (),
) -> RenderableType:
    """A table of `rows` for a console `width` wide; `leave_out` names the headers that may be left
    out, first first, while the columns' longest words do not fit side by side, or, while a `one_line`
    column (which must be among them) is kept, while the whole cells do not; stacked rows when even
    the others do not fit (print them with soft wrapping, as the dlaunch consoles do)."""
    fitted = fit_columns(headers, rows, width, leave_out, one_line)
    if fitted is None:
        return stacked(title, headers, rows)
    table = _table(title, headers, fitted, _caption(width, fitted))
    for row in rows:
        table.add_row(*(row[i] for i in fitted.kept))
    return table


def folded(text: str, width: int, console: Console) -> List[str]:
    """A cell's lines as rich's Table shows them (words wrapped at spaces, longer ones folded), each
    `width` cells wide. Printable ASCII is wrapped here, as rich does; other text by rich (on `console`)."""
    if width == 0:  # a column of a blank header and cells of no width (control characters): rich crops them away
        return [""]
    if not (text.isascii() and text.isprintable()):
        return [line.plain for line in Text(text).wrap(console, width, justify="left", overflow="fold")]
    if len(text) <= width:
        return [text.ljust(width)]
    breaks = []  # rich's divide_line: where each line starts
    offset = 0  # cells in the current line
    for match in WORD.finditer(text):
        start, word = match.start(), match.group(0)
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:  # the word fits no line: folded across lines of `width`
            pieces = [word[i : i + width] for i in range(0, len(word), width)]
            for piece in pieces[:-1]:
                if start:
                    breaks.append(start)
                start += len(piece)
            if start:
                breaks.append(start)
            offset = len(pieces[-1])
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    lines = []
    for begin, stop in zip([0] + breaks, breaks + [len(text)]):
        line = text[begin:stop]
        if len(line) > width:  # Text.rstrip_end: whitespace beyond the width goes
            line = line[: len(line) - min(len(line) - len(line.rstrip()), len(line) - width)]
        lines.append(line[:width].ljust(width))
    return lines


def print_lines(console: Console, lines: Sequence[str]) -> None:
    """Lines printed as they are, in one piece (no markup, emoji, highlighting or wrapping: a soft-wrapping
    console's lines); a `print` per line takes rich 30 us, this 2."""
    console.print(Segments([Segment(line) for line in lines], new_lines=True))


def print_table(
    console: Console,
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    leave_out: Sequence[str] = (),
    one_line: Sequence[str] = (),
    wrap_caption: bool = False,
) -> None:
    """fit_table's table printed on `console` (a soft-wrapping one, as dlaunch's), its rows written as lines
    of plain text in one piece: the same lines, in a fraction of the time rich takes for many rows (it lays
    out a cell at a time). Cells are shown as they are (rich's table turned `:name:` into emoji). The caption
    (what was left out) is one line, or with `wrap_caption` wrapped at spaces to the console's width."""
    fitted = fit_columns(headers, rows, console.width, leave_out, one_line)
    if fitted is None:
        console.print(stacked(title, headers, rows))
        return
    console.print(_table(title, headers, fitted, None))  # title, header and its rule
    if rows:
        lines, gap = [], " " * COLUMN_GAP
        for row in rows:
            cells = [folded(row[i], w, console) for i, w in zip(fitted.kept, fitted.widths)]
            height = max(len(c) for c in cells)
            cells = [c + [" " * w] * (height - len(c)) for c, w in zip(cells, fitted.widths)]
            lines += [gap.join(parts) for parts in zip(*cells)]
        print_lines(console, lines)
    caption = _caption(console.width, fitted)
    if caption:
        console.print(Text(caption, style="table.caption"), soft_wrap=not wrap_caption)


def markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (`|` in cells escaped)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def cell(value: Optional[float], fmt: str = "%.1f") -> str:
    """A figure as a table cell: `fmt % value`, "-" when it is not known."""
    return "-" if value is None else fmt % value


def counted(n: int, noun: str, plural: str = "") -> str:
    """`1 job`, `2 jobs`: a count with its noun in the number it takes (`plural` where it is not noun + s)."""
    return "%d %s" % (n, noun if n == 1 else plural or noun + "s")
