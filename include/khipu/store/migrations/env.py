"""Alembic environment for the Khipu store. Run through ``khipu.store.Store.migrate()``.

The caller hands over an open connection in ``config.attributes["connection"]``, so database
URLs (and their passwords) never pass through Alembic's ini interpolation or its logs.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from khipu.store.schema import metadata

config = context.config


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is None:  # `alembic` run by hand with -x url=...
        url = context.get_x_argument(as_dictionary=True).get("url")
        if not url:
            raise RuntimeError("pass the store URL: alembic -x url=sqlite:///path/khipu.db upgrade head")
        with create_engine(url).connect() as own:
            _configure_and_run(own)
            own.commit()
        return
    _configure_and_run(connection)


def _configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=True,  # SQLite alters tables by copying them
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
