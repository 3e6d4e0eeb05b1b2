"""The view's hostile-input property (tests/unit/plugins/test_view_hostile.py) over the store on PostgreSQL, which
refuses what SQLite takes (a NUL in a text, an integer past 64 bits): still no answer is a server error."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.integration.store.conftest import _postgres_database
from tests.unit.plugins.test_view_hostile import assert_no_server_error, built_client, check_every_route

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with _postgres_database() as url:
        yield built_client(url, tmp_path_factory.mktemp("hostile-postgres"))


def test_no_generated_query_value_makes_any_route_answer_a_server_error_on_postgresql(client: TestClient) -> None:
    check_every_route(client)


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/v1/messages/a%00b", {}),  # PostgreSQL: "A string literal cannot contain NUL (0x00) characters"
        ("/api/v1/verdicts", {"since": "99999999999999999999"}),  # past bigint
        ("/lost", {"cursor": "WzE3OTUwMDAwMDAwMDAsICJhXHUwMDAwYiIsICJoXHUwMDAwIl0"}),  # a NUL in a forged cursor
        ("/api/v1/search", {"q": "a\x00b"}),
    ],
)
def test_what_postgresql_refuses_is_a_400_before_it_gets_there(
    client: TestClient, path: str, params: dict[str, str]
) -> None:
    assert_no_server_error(client, path, list(params.items()))
    assert client.get(path, params=params).status_code == 400
