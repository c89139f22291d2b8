"""Supervised warm start (SFT) on protocol-following trajectories: demonstrations and the loop."""
