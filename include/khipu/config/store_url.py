"""The store's URL (``KHIPU_STORE_URL``, or an Airflow connection's): the forms Khipu opens, and the SQLAlchemy URL
each one stands for.

Khipu installs one PostgreSQL driver, psycopg2. SQLAlchemy 2.1 takes ``postgresql://`` to mean psycopg 3, which is
not installed (a raw ``No module named 'psycopg'`` at the first connection), and does not know ``postgres://`` at
all: both are opened with psycopg2 here. A relative SQLite path is made absolute against the working directory of
the process that reads the setting, so the processes it hands the URL to (Airflow tasks, Spark's driver) open the
same file whatever their own working directory. Anything else is refused, naming what was given (its password
hidden) and what is accepted. Parsing only: nothing connects.
"""

from __future__ import annotations

from pathlib import Path

POSTGRESQL_DRIVER = "psycopg2"  # the driver requirements.txt installs
ACCEPTED = (
    "a store URL: sqlite:///<relative path> or sqlite:////<absolute path> (a file), or postgresql://, postgres:// "
    f"or postgresql+{POSTGRESQL_DRIVER}://<user>[:<password>]@<host>[:<port>]/<database> (opened with "
    f"{POSTGRESQL_DRIVER}, the PostgreSQL driver Khipu installs)"
)
POSTGRESQL_NAMES = ("postgresql", "postgres")
IN_MEMORY = ("", ":memory:")  # SQLAlchemy's SQLite in memory: no path to resolve


class StoreUrlError(ValueError):
    """A store URL Khipu cannot open: ``shown`` is what was given (its password hidden), ``problem`` what is wrong
    with it."""

    def __init__(self, shown: str, problem: str) -> None:
        super().__init__(f"store URL {shown!r}: expected {ACCEPTED}; {problem}")
        self.shown, self.problem = shown, problem


def store_url(raw: str, working_dir: Path) -> str:
    """The SQLAlchemy URL Khipu opens for the store URL ``raw``: ``postgresql://`` and ``postgres://`` with
    psycopg2, a relative SQLite path made absolute against ``working_dir``; raises :class:`StoreUrlError`
    for anything else. Opening the result again gives the same URL."""
    from sqlalchemy.engine import make_url  # the tracing library loads config without the store's packages
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):  # not <scheme>://..., or a port that is not a number
        raise StoreUrlError(_hidden(raw), "this one is not a URL") from None
    shown = url.render_as_string(hide_password=True)
    backend, _, driver = url.drivername.lower().partition("+")
    if backend in POSTGRESQL_NAMES:
        if driver not in ("", POSTGRESQL_DRIVER):
            which = "psycopg 3, which" if driver == "psycopg" else "a driver"
            problem = f"this one names the PostgreSQL driver {driver!r} ({which} Khipu does not install)"
            raise StoreUrlError(shown, problem)
        return url.set(drivername=f"postgresql+{POSTGRESQL_DRIVER}").render_as_string(hide_password=False)
    if backend == "sqlite":
        if driver not in ("", "pysqlite"):
            problem = f"this one names the SQLite driver {driver!r} (Khipu opens SQLite with pysqlite)"
            raise StoreUrlError(shown, problem)
        database = url.database or ""
        if database in IN_MEMORY or Path(database).is_absolute():
            return url.set(drivername="sqlite").render_as_string(hide_password=False)
        return url.set(drivername="sqlite", database=str(working_dir / database)).render_as_string(hide_password=False)
    raise StoreUrlError(shown, f"this one is for {backend!r}, a database the store does not support")


def _hidden(raw: str) -> str:
    """What did not parse as a URL, shown without what may be a password: everything before its last ``@``."""
    scheme, separator, rest = raw.partition("://")
    if "@" not in raw:
        return raw
    if not separator:
        return "***" + raw[raw.rindex("@") :]
    return f"{scheme}://***" + rest[rest.rindex("@") :]
