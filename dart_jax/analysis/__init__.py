"""The studies' numbers, figures and reports from their outputs: numpy / scipy / matplotlib (and jax for
the gradient-angle maths) only; imports nothing from dart_jax outside analysis/, so any layer may use it.
CEA (cea, cea_report, cea_plots), gradient angles (grad_angles, grad_report, grad_plots), markdown
tables (tables)."""
