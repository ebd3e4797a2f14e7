"""Reports: rich tables, JSON/CSV files and plots."""

from npujax.report.files import LAYER_COLUMNS as LAYER_COLUMNS
from npujax.report.files import write_json as write_json
from npujax.report.files import write_layers_csv as write_layers_csv
from npujax.report.plots import plot_breakdown as plot_breakdown
from npujax.report.plots import plot_layer_latency as plot_layer_latency
from npujax.report.plots import plot_measured_vs_modelled as plot_measured_vs_modelled
from npujax.report.plots import plot_roofline as plot_roofline
from npujax.report.sqnr import plot_layer_sqnr as plot_layer_sqnr
from npujax.report.sqnr import sqnr_markdown as sqnr_markdown
from npujax.report.sqnr import sqnr_table as sqnr_table
from npujax.report.sqnr import write_sqnr_report as write_sqnr_report
from npujax.report.tables import dataflow_table as dataflow_table
from npujax.report.tables import layer_table as layer_table
from npujax.report.tables import print_table as print_table

__all__ = [
    "layer_table",
    "print_table",
    "dataflow_table",
    "write_json",
    "write_layers_csv",
    "plot_layer_latency",
    "plot_breakdown",
    "plot_roofline",
    "plot_measured_vs_modelled",
    "LAYER_COLUMNS",
    "sqnr_table",
    "sqnr_markdown",
    "plot_layer_sqnr",
    "write_sqnr_report",
]
