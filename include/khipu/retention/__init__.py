"""Retention: how long each kind of Khipu's data is kept, and the run that removes the rest.

:mod:`khipu.retention.policy` holds the limits and turns them into cutoffs (pure); :mod:`khipu.retention.run`
applies them to the store and the archives (a local folder or an object store); :mod:`khipu.retention.usage` says
what the archives hold.
"""
