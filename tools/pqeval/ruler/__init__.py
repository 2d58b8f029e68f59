"""RULER's own generator for one published cell, vendored from NVIDIA/RULER
(Apache-2.0, LICENSE and README.md beside this file), to cross-check the
home-made tasks of pqeval.tasks. Importing this package loads nothing
heavy; pqeval.ruler.cell makes the cell's prompts as pqeval.tasks samples."""

# The evaluation's task name -> RULER's cell (scripts/synthetic.yaml).
CELLS = {"ruler_niah_single_1": "niah_single_1"}
