"""The role vocabulary (REASONING / TOOL / PAD_ROLE) and the router ψ: the bottom layer every other
layer may import (adapters route by it, checkpoints record its convention, the sampler and the
trainer both call it)."""
