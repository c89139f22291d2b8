"""What a run is, shared by GRPO (rl/), the warm start (sft/), evaluation (eval/) and the analyses: the
policy on a mesh (base + warm start + adapters), the task's tool and data rows, the run directory
(checkpoints, records, fresh / resume / overwrite rules, metrics and plots) and held-out rollouts."""
