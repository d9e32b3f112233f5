"""The report of a run (summary.json, report.md, the plots) and the published tables of the reference runs."""
