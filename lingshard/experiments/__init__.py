"""The evidence page's experiments (docs/RESULTS.md): `python -m
lingshard.experiments [--quick] [--only NAMES] [--page_only]` (reproduce.py
runs them; runs.py the trainer runs; page.py, sections.py, page_parts.py
and plots.py render the page)."""
