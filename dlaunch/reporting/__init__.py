"""The report: its data (`report.py`), report.md and the study's published-vs-this-run section (`document.py`),
report.html (`html.py`) and the plots (`plots.py`)."""
