"""Consumer health: Burrow-grade partition statuses, time lag, expiry risk and offset resets."""
