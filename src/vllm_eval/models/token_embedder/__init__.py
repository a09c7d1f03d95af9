"""Multi-vector (late-interaction, ColBERT-style) embedders: one vector per token, scored by MaxSim."""
