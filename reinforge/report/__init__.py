"""Run reports: PNG plots and a self-contained HTML page from a run directory's files."""
from reinforge.report.render import write_report

__all__ = ["write_report"]
