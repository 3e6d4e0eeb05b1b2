"""The verdict and everything about verdicts that is not one judge's: the model (:mod:`.model`: what a verdict
says), how a new judgement combines with the stored one (:mod:`.settle`), the book that stores them with their
history (:mod:`.book`), what they add up to (per-minute metrics, :mod:`.metrics`), where the plain DELIVERED ones
are kept (the verdict archive, :mod:`.archive`), and a message's verdicts read from the SQL store and the archive
together (:mod:`.read`).

The judges (the streaming detector, reconciliation, the resend task) sit above this package and all write
through it; the view, the API and the exporter read through it."""
