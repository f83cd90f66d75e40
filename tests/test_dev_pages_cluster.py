"""Dev pages (``runnerd app dev``, api/dev_pages.py) in a cluster: two real `runnerd serve`
nodes on one throwaway PostgreSQL, as a round-robin balancer spreads a person's requests.
The pages PUT on one node are what the other answers and serves on its apps origin
(``/d/<token>/<path>``), to that person's token only; a PUT or a DELETE on either is what
both see next; their hour is judged by the database's clock; the store's bound on their
bytes holds across nodes; and ``runnerd admin copy`` leaves them behind."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from conftest import run_cli
from daemon import Daemon, running_daemon, running_nodes
from pg_cluster import PgCluster
from runnerd import limits
from runnerd.ids import stamp
from runnerd.store import Store
from runnerd.upload.pages import content_type
from test_governance import gov_app

pytestmark = pytest.mark.jail

PAGE = '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{0}</title></head>'
PAGE += "<body><h1>{0}</h1></body></html>\n"


@pytest.fixture(scope="module")
def nodes(
    pg: PgCluster, toolchain_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Daemon, Daemon, str]]:
    with running_nodes(toolchain_dir, pg.new_database()) as (a, b):
        yield a, b, str(a.ship(gov_app(tmp_path_factory.mktemp("gov")))["installId"])


def _path(install_id: str) -> str:
    return f"/api/v2/apps/installs/{install_id}/dev-pages"


def _put(node: Daemon, install_id: str, key: str, title: str) -> httpx.Response:
    files = {
        "index.html": base64.b64encode(PAGE.format(title).encode()).decode(),
        "app.js": base64.b64encode(f"// {title}\n".encode()).decode(),
    }
    return node.call("PUT", _path(install_id), key, json={"files": files})


def _origin(node: Daemon) -> str:
    return f"http://localhost:{node.env['RUNNERD_APPS_PORT']}"


def _page(node: Daemon, token: str, path: str = "") -> httpx.Response:
    """The dev page ``path`` (none: the entry) at ``node``'s apps origin."""
    with httpx.Client(timeout=10) as client:
        return client.get(f"{_origin(node)}/d/{token}/{path}")


def test_pages_put_on_one_node_are_answered_and_served_by_the_other(
    nodes: tuple[Daemon, Daemon, str],
) -> None:
    a, b, iid = nodes
    put = _put(a, iid, a.admin_key, "Put on A")
    assert put.status_code == 200, put.text
    assert put.json()["revision"] == 1 and put.json()["url"].startswith(_origin(a) + "/d/")
    # B answers the Manage page's poll, with a frame of B's apps origin, and serves them.
    got = b.call("GET", _path(iid), b.admin_key)
    assert got.status_code == 200, got.text
    info = got.json()
    assert info["revision"] == 1 and info["files"] == 2 and info["url"].startswith(_origin(b))
    with httpx.Client(timeout=10) as client:
        page = client.get(info["url"])
    assert page.status_code == 200 and "Put on A" in page.text
    assert page.headers["content-type"] == content_type("index.html")
    assert "connect-src 'none'" in page.headers["content-security-policy"]
    # A's token, from the PUT's answer, opens them on B too: the frame's next request may
    # land on either node.
    for node in (a, b):
        assert _page(node, put.json()["token"], "app.js").text == "// Put on A\n"
        assert "Put on A" in _page(node, put.json()["token"]).text
    # A PUT on B is the revision A answers next, and the page A serves.
    again = _put(b, iid, b.admin_key, "Put on B")
    assert again.json()["revision"] == 2
    assert a.call("GET", _path(iid), a.admin_key).json()["revision"] == 2
    assert "Put on B" in _page(a, info["token"]).text
    # A DELETE on B: A holds none and serves none.
    assert b.call("DELETE", _path(iid), b.admin_key).json()["deleted"] is True
    gone = a.call("GET", _path(iid), a.admin_key)
    assert gone.status_code == 404 and gone.json()["error"]["details"]["code"] == "NO_DEV_PAGES"
    assert _page(a, info["token"]).status_code == 404
    assert _page(b, put.json()["token"], "app.js").status_code == 404


def test_another_persons_token_finds_none_of_them_on_any_node(
    nodes: tuple[Daemon, Daemon, str],
) -> None:
    a, b, iid = nodes
    other = a.person("dev-cluster-other@example.com")
    assert _put(a, iid, a.admin_key, "Ada's").status_code == 200
    try:
        theirs = b.call("GET", _path(iid), other)
        assert theirs.status_code == 404, theirs.text
        framed = b.call("POST", f"/api/v2/apps/installs/{iid}/frame", other)
        # gov_app ships no pages: no frame of its own, but a frame token comes with a PUT.
        assert framed.status_code == 404, framed.text
        own = _put(b, iid, other, "Theirs").json()
        for node in (a, b):
            for path in ("", "index.html", "app.js"):
                answer = _page(node, own["token"], path)
                assert answer.status_code == 200 and "Ada's" not in answer.text, path
        assert b.call("DELETE", _path(iid), other).json()["deleted"] is True
        for node in (a, b):  # theirs gone; Ada's untouched
            assert _page(node, own["token"]).status_code == 404
            assert node.call("GET", _path(iid), node.admin_key).status_code == 200
    finally:
        a.call("DELETE", _path(iid), a.admin_key)


def test_their_hour_is_the_databases_clock_on_every_node(
    nodes: tuple[Daemon, Daemon, str],
) -> None:
    a, b, iid = nodes
    put = _put(a, iid, a.admin_key, "An hour ago").json()
    store = a.store()
    try:
        past = stamp(store.db_now() - timedelta(seconds=limits.DEV_PAGES_TTL_S + 1))
        with store.db.write():
            store.db.execute(
                "UPDATE dev_pages SET updated_at = ? WHERE install_id = ?", [past, iid]
            )
    finally:
        store.close()
    for node in (a, b):
        assert node.call("GET", _path(iid), node.admin_key).status_code == 404
        assert _page(node, put["token"]).status_code == 404
    store = a.store()
    try:  # what a sweep drops (the next PUT does too: tests/test_app_dev.py)
        assert store.drop_stale_dev_pages(limits.DEV_PAGES_TTL_S) == 1
        assert store.db.execute("SELECT count(*) FROM dev_page_files").fetchone()[0] == 0
    finally:
        store.close()
    # The next PUT, on either node, starts again (revision 1).
    assert _put(b, iid, b.admin_key, "Now").json()["revision"] == 1
    assert "Now" in _page(a, put["token"]).text
    assert b.call("DELETE", _path(iid), b.admin_key).json()["deleted"] is True


def test_the_bound_on_their_bytes_is_the_stores_not_a_nodes(
    nodes: tuple[Daemon, Daemon, str],
) -> None:
    """Ada's pages PUT through node A, another person's through node B, then theirs
    written again to the same database with a bound that leaves room for theirs only:
    Ada's (the older) go, on both nodes."""
    a, b, iid = nodes
    assert _put(a, iid, a.admin_key, "Older").status_code == 200
    other = a.person("dev-cluster-bound@example.com")
    newer = _put(b, iid, other, "Newer").json()
    assert a.call("GET", _path(iid), a.admin_key).status_code == 200  # both fit, by default
    store = a.store()
    try:
        user = store.find_user("dev-cluster-bound@example.com")
        assert user is not None
        content = PAGE.format("Newest").encode()
        store.put_dev_pages(
            iid, user.id, "index.html",
            {"index.html": (content, content_type("index.html"), "0" * 64)},
            ttl_s=limits.DEV_PAGES_TTL_S, max_bytes=len(content) + newer["bytes"] - 1,
        )  # fmt: skip
    finally:
        store.close()
    for node in (a, b):
        assert node.call("GET", _path(iid), node.admin_key).status_code == 404  # the oldest
        assert node.call("GET", _path(iid), other).json()["revision"] == 2
        assert "Newest" in _page(node, newer["token"]).text
    b.call("DELETE", _path(iid), other)


def test_admin_copy_leaves_dev_pages_behind(
    pg: PgCluster, toolchain_dir: Path, tmp_path: Path
) -> None:
    """They live an hour: `runnerd admin copy` copies everything else, and the copy has
    none of them (`runnerd app dev` sends them again)."""
    with running_daemon(toolchain_dir) as single:
        iid = str(single.ship(gov_app(tmp_path))["installId"])
        assert _put(single, iid, single.admin_key, "Not copied").status_code == 200
        url = pg.new_database()
        source = f"sqlite:///{single.data_dir / 'runnerd.db'}"
        copied = run_cli("admin", "copy", "--from", source, "--to", url, "--json",
                         env=single.client_env())  # fmt: skip
        assert copied.returncode == 0, copied.stderr
        rows = json.loads(copied.stdout)["rows"]
        assert rows["installs"] == 1 and "dev_pages" not in rows and "dev_page_files" not in rows
        target = Store(url, migrate=False)
        try:
            for table in ("dev_pages", "dev_page_files"):
                assert target.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0
        finally:
            target.close()
