"""The table fitter (dlaunch/tables.py): what a table leaves out at a narrow console, and that it says so."""
import io

from rich.console import Console

from dlaunch.tables import fit_columns, print_table

HEADERS = ["run", "GPUs", "images/s", "images/s range", "pred. E_G", "comm %"]
ROWS = [["runs/exp/g1", "1", "35.1", "34.0-36.2", "-", "-"],
        ["runs/exp/g2", "2", "61.8", "60.1-63.0", "-", "-"]]
OPTIONAL = ["images/s range", "pred. E_G", "comm %"]


def test_a_column_without_any_value_is_left_out_before_one_with_values():
    width = sum(len(h) for h in ["run", "GPUs", "images/s", "images/s range"]) + 8  # room for one optional column
    fitted = fit_columns(HEADERS, [[c for c in row] for row in ROWS], width + 3, OPTIONAL)
    assert [HEADERS[i] for i in fitted.kept] == ["run", "GPUs", "images/s", "images/s range"]
    assert fitted.dropped == ["pred. E_G", "comm %"] and fitted.empty == ["pred. E_G", "comm %"]


def test_the_caption_names_the_empty_columns_apart():
    console = Console(file=io.StringIO(), width=34, soft_wrap=True, markup=False)
    print_table(console, "runs", HEADERS, ROWS, leave_out=OPTIONAL)
    text = console.file.getvalue()
    assert "left out at 34 columns: images/s range; pred. E_G, comm % (no values)" in text, text
    assert "60.1-63.0" not in text and "61.8" in text


def test_a_wide_console_leaves_out_nothing_even_if_empty():
    fitted = fit_columns(HEADERS, ROWS, 200, OPTIONAL)
    assert fitted.dropped == [] and len(fitted.kept) == len(HEADERS)


def test_a_leave_out_list_may_name_columns_the_table_lacks():
    fitted = fit_columns(HEADERS, ROWS, 30, ["overhead s"] + OPTIONAL)
    assert "overhead s" not in fitted.dropped and fitted.dropped[:2] == ["pred. E_G", "comm %"]
