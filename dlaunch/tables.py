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
from typing import List, Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

# Between two columns: one cell of collapsed padding and the box's (blank) vertical separator.
COLUMN_GAP = 2


def longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


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


def stacked(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> RenderableType:
    """Each row as two lines: its first cell, then `header: value; ...` for the others that are set."""
    lines = [Text(title, style="bold")]
    for row in rows:
        lines.append(Text(row[0]))
        pairs = ["%s: %s" % (h, v) for h, v in zip(headers[1:], row[1:]) if v and v != "-"]
        lines.append(Text("  " + "; ".join(pairs)))
    return Group(*lines)


def fit_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], width: int,
              leave_out: Sequence[str] = (), one_line: Sequence[str] = ()) -> RenderableType:
    """A table of `rows` for a console `width` wide; `leave_out` names the headers that may be left
    out, first first, while the columns' longest words do not fit side by side, or, while a `one_line`
    column (which must be among them) is kept, while the whole cells do not; stacked rows when even
    the others do not fit (print them with soft wrapping, as the dlaunch consoles do)."""
    kept = list(range(len(headers)))

    def minimum(i: int) -> int:
        return max([longest_word(headers[i])] + [longest_word(row[i]) for row in rows])

    def natural(i: int) -> int:
        return max([cell_len(headers[i])] + [cell_len(row[i]) for row in rows])

    def needed(columns: List[int]) -> int:
        width_of = natural if any(headers[i] in one_line for i in columns) else minimum
        return sum(width_of(i) for i in columns) + COLUMN_GAP * (len(columns) - 1)

    dropped = []
    for header in leave_out:
        if needed(kept) <= width:
            break
        kept.remove(headers.index(header))
        dropped.append(header)
    if needed(kept) > width:
        return stacked(title, headers, rows)
    widths = fit_widths([natural(i) for i in kept], [minimum(i) for i in kept], width - COLUMN_GAP * (len(kept) - 1))
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True,
                  caption="left out at %d columns: %s" % (width, ", ".join(dropped)) if dropped else None)
    for i, column_width in zip(kept, widths):
        table.add_column(headers[i], width=column_width, overflow="fold")
    for row in rows:
        table.add_row(*(row[i] for i in kept))
    return table


def markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table (`|` in cells escaped)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def counted(n: int, noun: str, plural: str = "") -> str:
    """`1 job`, `2 jobs`: a count with its noun in the number it takes (`plural` where it is not noun + s)."""
    return "%d %s" % (n, noun if n == 1 else plural or noun + "s")
