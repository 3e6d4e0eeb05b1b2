"""The verdicts beyond a single judgement: what they add up to (per-minute metrics, :mod:`.metrics`), where the
plain DELIVERED ones are kept (the verdict archive, :mod:`.archive`), and a message's verdicts read from the
SQL store and the archive together (:mod:`.read`)."""
