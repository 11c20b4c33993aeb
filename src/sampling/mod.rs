//! Sampling: turning logits into tokens (filled in by the engine work).
