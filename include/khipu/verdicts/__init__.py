"""What the stored verdicts add up to: per-minute metrics of each stream and hop."""
