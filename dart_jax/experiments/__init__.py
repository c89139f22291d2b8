"""The studies, the top layer: each drives training, sampling and evaluation through the library as
resumable stages over one output directory and hands its numbers to analysis/ — CEA (cea_run), gradient
alignment (grad_run, grad_sample, grad_roles) and the method comparison (methods_run, methods_report);
stage_log records each stage's wall time."""
