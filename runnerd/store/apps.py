"""Apps, immutable versions, publishing and installs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from runnerd.errors import VersionExists
from runnerd.ids import new_id, utc_now
from runnerd.limits import DEFAULT_PAGE_ENTRY
from runnerd.model import Bundle, Tool
from runnerd.store.audit import AuditStore
from runnerd.store.records import AppRecord, InstallRecord, ToolRecord, VersionRecord


class AppsStore(AuditStore):
    # --- Apps and versions ------------------------------------------------------------------

    def add_version(
        self,
        bundle: Bundle,
        *,
        workspace_id: str | None = None,
        user_id: str | None = None,
        key_id: str | None = None,
        check_app: Callable[[AppRecord], object] | None = None,
        git: tuple[str, str | None] | None = None,
    ) -> VersionRecord:
        """Store ``bundle`` as a new immutable version of its app (created on first upload,
        owned by ``workspace_id``); ``git``: the commit and ref of a Git deploy.

        The version string is the manifest's, else the next number in order. Raises
        VersionExists when the app already has that version string; then nothing changes.
        ``check_app``: called in the same transaction with the app, when it exists
        already (the rule of who may add to it: govern/apps.py); what it raises refuses
        the version, and nothing changes either. The app it sees is the one the version
        is added to: no other deploy comes between."""
        manifest = bundle.manifest
        now = utc_now()
        with self._write():
            app = self._app_row(manifest.slug)
            if app is not None and check_app is not None:
                check_app(_app_record(app))
            if app is None:
                app = {
                    "id": new_id("app"),
                    "slug": manifest.slug,
                    "name": manifest.name,
                    "created_at": now,
                    "workspace_id": workspace_id,
                }
                self.db.insert("apps", app)
            elif app["name"] != manifest.name:
                self.db.execute("UPDATE apps SET name = ? WHERE id = ?", [manifest.name, app["id"]])
            seq = self._next_seq(app["id"])
            version = manifest.version or self._free_version_string(app["id"], seq)
            if self._version_taken(app["id"], version):
                raise VersionExists(manifest.slug, version)
            version_id = new_id("ver")
            self.db.insert(
                "app_versions",
                {
                    "id": version_id,
                    "app_id": app["id"],
                    "version": version,
                    "seq": seq,
                    "manifest": manifest.text,
                    "content_hash": bundle.content_hash,
                    "created_at": now,
                    "egress": json.dumps(list(manifest.egress)),
                    "page_entry": _page_entry(bundle),
                    "git_commit": git[0] if git else None,
                    "git_ref": git[1] if git else None,
                },
            )
            self.db.insert_all("tools", [_tool_row(version_id, t) for t in bundle.tools])
            self.db.insert_all(
                "app_pages",
                [
                    {
                        "version_id": version_id,
                        "path": page.path,
                        "content": page.content,
                        "content_type": page.content_type,
                        "sha256": page.sha256,
                    }
                    for page in bundle.pages
                ],
            )
            self._append_audit(
                "app.deploy",
                workspace_id=workspace_id,
                actor_user_id=user_id,
                actor_key_id=key_id,
                version_id=version_id,
                detail={
                    "appSlug": manifest.slug,
                    "version": version,
                    "contentHash": bundle.content_hash,
                    "tools": [t.name for t in bundle.tools],
                    **({"commit": git[0], "ref": git[1]} if git else {}),
                },
            )
        return VersionRecord(
            id=version_id,
            app_id=app["id"],
            app_slug=manifest.slug,
            version=version,
            seq=seq,
            content_hash=bundle.content_hash,
            tool_names=tuple(t.name for t in bundle.tools),
            created_at=now,
            egress=manifest.egress,
            commit=git[0] if git else None,
            ref=git[1] if git else None,
        )

    def _app_row(self, slug: str) -> dict[str, Any] | None:
        rows = list(self.db.query("SELECT * FROM apps WHERE slug = ?", [slug]))
        return rows[0] if rows else None

    def _next_seq(self, app_id: str) -> int:
        row = self.db.execute(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM app_versions WHERE app_id = ?", [app_id]
        ).fetchone()
        return int(row[0])

    def _version_taken(self, app_id: str, version: str) -> bool:
        row = self.db.execute(
            "SELECT 1 FROM app_versions WHERE app_id = ? AND version = ?", [app_id, version]
        ).fetchone()
        return row is not None

    def _free_version_string(self, app_id: str, seq: int) -> str:
        """The sequence number as a string, or the next free number after it."""
        candidate = seq
        while self._version_taken(app_id, str(candidate)):
            candidate += 1
        return str(candidate)

    def get_app(self, slug: str) -> AppRecord | None:
        row = self._app_row(slug)
        return _app_record(row) if row else None

    def list_apps(self) -> list[AppRecord]:
        return [_app_record(r) for r in self.db.query("SELECT * FROM apps ORDER BY slug")]

    def version_of_commit(self, workspace_id: str, slug: str, commit: str) -> VersionRecord | None:
        """The newest version deployed from Git ``commit`` of the app ``slug``, when
        ``workspace_id`` owns the app; None otherwise."""
        row = self.db.execute(
            "SELECT v.id FROM app_versions v JOIN apps a ON a.id = v.app_id "
            "WHERE a.slug = ? AND a.workspace_id = ? AND v.git_commit = ? "
            "ORDER BY v.seq DESC LIMIT 1",
            [slug, workspace_id, commit],
        ).fetchone()
        return self.get_version(row[0]) if row else None

    def find_version(self, app_id: str, version: str) -> VersionRecord | None:
        row = self.db.execute(
            "SELECT id FROM app_versions WHERE app_id = ? AND version = ?", [app_id, version]
        ).fetchone()
        return self.get_version(row[0]) if row else None

    # --- Publishing and installs ------------------------------------------------------------

    def publish(
        self,
        version_id: str,
        user_id: str | None,
        *,
        workspace_id: str | None = None,
        key_id: str | None = None,
    ) -> str:
        """Mark a version published (once; publishing again keeps the first time)."""
        with self._write():
            cur = self.db.execute(
                "INSERT INTO publications VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                [version_id, user_id, utc_now()],
            )
            if cur.rowcount:
                self._append_audit(
                    "app.publish",
                    workspace_id=workspace_id,
                    actor_user_id=user_id,
                    actor_key_id=key_id,
                    version_id=version_id,
                )
        row = self.db.execute(
            "SELECT published_at FROM publications WHERE version_id = ?", [version_id]
        ).fetchone()
        return str(row[0])

    def published_at(self, version_id: str) -> str | None:
        row = self.db.execute(
            "SELECT published_at FROM publications WHERE version_id = ?", [version_id]
        ).fetchone()
        return str(row[0]) if row else None

    def create_install(
        self,
        workspace_id: str,
        app_id: str,
        version_id: str,
        user_id: str | None,
        *,
        key_id: str | None = None,
    ) -> InstallRecord:
        """Install a version of an app into a workspace; one install per app and workspace
        (installing again switches the existing one)."""
        now = utc_now()
        with self._write():
            row = self.db.execute(
                "SELECT id FROM installs WHERE workspace_id = ? AND app_id = ?",
                [workspace_id, app_id],
            ).fetchone()
            if row is None:
                install_id = new_id("inst")
                granted = self._requested_egress(version_id)
                self.db.execute(
                    """INSERT INTO installs (id, workspace_id, app_id, version_id,
                       previous_version_id, created_by, created_at, updated_at, egress)
                       VALUES (?, ?, ?, ?, NULL, ?, ?, ?, ?)""",
                    [install_id, workspace_id, app_id, version_id, user_id, now, now, granted],
                )
                self._append_audit(
                    "app.install",
                    workspace_id=workspace_id,
                    install_id=install_id,
                    version_id=version_id,
                    actor_user_id=user_id,
                    actor_key_id=key_id,
                    detail={"egress": json.loads(granted)},
                )
            else:
                install_id = row[0]
                self._switch(install_id, version_id, now, user_id, key_id)
        found = self.get_install(install_id)
        assert found is not None
        return found

    def _switch(
        self,
        install_id: str,
        version_id: str,
        now: str,
        user_id: str | None,
        key_id: str | None,
        action: str = "app.switch",
    ) -> None:
        granted = self._requested_egress(version_id)
        cur = self.db.execute(
            """UPDATE installs SET previous_version_id = version_id, version_id = ?,
               updated_at = ?, egress = ? WHERE id = ? AND version_id != ?""",
            [version_id, now, granted, install_id, version_id],
        )
        if cur.rowcount:
            ws = self.db.execute(
                "SELECT workspace_id FROM installs WHERE id = ?", [install_id]
            ).fetchone()[0]
            self._append_audit(
                action,
                workspace_id=ws,
                install_id=install_id,
                version_id=version_id,
                actor_user_id=user_id,
                actor_key_id=key_id,
                detail={"egress": json.loads(granted)},
            )

    def _requested_egress(self, version_id: str) -> str:
        """A version's egress list (JSON): what installing or switching to it grants."""
        row = self.db.execute(
            "SELECT egress FROM app_versions WHERE id = ?", [version_id]
        ).fetchone()
        return str(row[0]) if row else "[]"

    def requested_egress(self, version_id: str) -> tuple[str, ...]:
        """The destinations a stored version asks to reach."""
        return tuple(json.loads(self._requested_egress(version_id)))

    def narrow_egress(
        self,
        install_id: str,
        granted: tuple[str, ...],
        *,
        user_id: str | None = None,
        key_id: str | None = None,
    ) -> InstallRecord:
        """Set an install's grant (the caller has checked it stays within what its
        version asks for), and audit it."""
        with self._write():
            self.db.execute(
                "UPDATE installs SET egress = ?, updated_at = ? WHERE id = ?",
                [json.dumps(list(granted)), utc_now(), install_id],
            )
            found = self.get_install(install_id)
            assert found is not None
            self._append_audit(
                "install.egress",
                workspace_id=found.workspace_id,
                install_id=install_id,
                version_id=found.version_id,
                actor_user_id=user_id,
                actor_key_id=key_id,
                detail={"egress": list(granted)},
            )
        return found

    def switch_install(
        self,
        install_id: str,
        version_id: str,
        *,
        user_id: str | None = None,
        key_id: str | None = None,
    ) -> InstallRecord:
        """Point the install at another version, in one transaction: every call after it
        resolves the new version; runs already started finish on theirs."""
        with self._write():
            self._switch(install_id, version_id, utc_now(), user_id, key_id)
        found = self.get_install(install_id)
        assert found is not None
        return found

    def rollback_install(
        self, install_id: str, *, user_id: str | None = None, key_id: str | None = None
    ) -> InstallRecord | None:
        """Swap the install back to its previous version; None if it has none."""
        with self._write():
            row = self.db.execute(
                "SELECT previous_version_id FROM installs WHERE id = ?", [install_id]
            ).fetchone()
            if row is None or row[0] is None:
                return None
            self._switch(install_id, row[0], utc_now(), user_id, key_id, "app.rollback")
        return self.get_install(install_id)

    def get_install(self, install_id: str) -> InstallRecord | None:
        rows = list(self.db.query(_INSTALL_SQL + " WHERE i.id = ?", [install_id]))
        return _install_record(rows[0]) if rows else None

    def list_installs(self, workspace_id: str) -> list[InstallRecord]:
        rows = self.db.query(
            _INSTALL_SQL + " WHERE i.workspace_id = ? ORDER BY a.slug", [workspace_id]
        )
        return [_install_record(r) for r in rows]

    def install_of_app(self, workspace_id: str, app_slug: str) -> InstallRecord | None:
        rows = list(
            self.db.query(
                _INSTALL_SQL + " WHERE i.workspace_id = ? AND a.slug = ?", [workspace_id, app_slug]
            )
        )
        return _install_record(rows[0]) if rows else None

    def installed_tools(
        self, workspace_id: str, install_id: str | None = None
    ) -> list[tuple[InstallRecord, ToolRecord]]:
        """The tools of the version each install of the workspace runs."""
        installs = self.list_installs(workspace_id)
        if install_id is not None:
            installs = [i for i in installs if i.id == install_id]
        return [(i, t) for i in installs for t in self.get_tools(i.version_id)]

    def _versions_sql(self) -> str:
        """Versions with their app's slug and their tools' names (a JSON list, sorted)."""
        return (
            "SELECT v.*, a.slug AS app_slug, "
            f"{self.db.sorted_json_list('name', 'tools', 'version_id = v.id')} AS tool_names "
            "FROM app_versions v JOIN apps a ON a.id = v.app_id"
        )

    def list_versions(self, app_id: str) -> list[VersionRecord]:
        rows = self.db.query(
            self._versions_sql() + " WHERE v.app_id = ? ORDER BY v.seq",
            [app_id],
        )
        return [_version_record(r) for r in rows]

    def get_version(self, version_id: str) -> VersionRecord | None:
        rows = list(
            self.db.query(
                self._versions_sql() + " WHERE v.id = ?",
                [version_id],
            )
        )
        return _version_record(rows[0]) if rows else None

    def get_tools(self, version_id: str) -> list[ToolRecord]:
        rows = self.db.query("SELECT * FROM tools WHERE version_id = ? ORDER BY name", [version_id])
        return [_tool_record(r) for r in rows]

    def tools_with_packages(self) -> list[tuple[VersionRecord, ToolRecord]]:
        """Every stored tool that lists packages, with its version (for env bookkeeping)."""
        rows = self.db.query("SELECT * FROM tools WHERE packages != '[]' ORDER BY version_id")
        found = []
        for row in rows:
            version = self.get_version(row["version_id"])
            assert version is not None
            found.append((version, _tool_record(row)))
        return found

    # --- Pages (served on the apps origin: daemon/apps_origin.py) ---------------------------

    def page_count(self, version_id: str) -> int:
        row = self.db.execute(
            "SELECT count(*) FROM app_pages WHERE version_id = ?", [version_id]
        ).fetchone()
        return int(row[0])

    def page_entry(self, version_id: str) -> str | None:
        """The page a frame of this version opens; None when it has no pages."""
        row = self.db.execute(
            "SELECT page_entry FROM app_versions WHERE id = ?", [version_id]
        ).fetchone()
        return str(row[0]) if row and row[0] is not None else None

    def installed_page(self, install_id: str, path: str) -> tuple[bytes, str, str] | None:
        """The page ``path`` of the version the install runs now, as (content, content
        type, sha256); None when there is no such install or page. One query: a switch
        or rollback changes what the next call finds."""
        row = self.db.execute(
            """SELECT p.content, p.content_type, p.sha256 FROM installs i
               JOIN app_pages p ON p.version_id = i.version_id
               WHERE i.id = ? AND p.path = ?""",
            [install_id, path],
        ).fetchone()
        return (bytes(row[0]), str(row[1]), str(row[2])) if row else None

    def get_tool(self, version_id: str, name: str) -> ToolRecord | None:
        rows = list(
            self.db.query(
                "SELECT * FROM tools WHERE version_id = ? AND name = ?", [version_id, name]
            )
        )
        return _tool_record(rows[0]) if rows else None


_INSTALL_SQL = """SELECT i.id, i.workspace_id, i.app_id, a.slug AS app_slug, i.version_id,
       v.version, i.previous_version_id, i.created_at, i.updated_at, i.egress, v.page_entry
FROM installs i JOIN apps a ON a.id = i.app_id JOIN app_versions v ON v.id = i.version_id"""


def _app_record(row: dict[str, Any]) -> AppRecord:
    return AppRecord(
        id=row["id"],
        slug=row["slug"],
        name=row["name"],
        created_at=row["created_at"],
        workspace_id=row.get("workspace_id"),
    )


def _page_entry(bundle: Bundle) -> str | None:
    if not bundle.pages:
        return None
    return bundle.manifest.entry or DEFAULT_PAGE_ENTRY


def _tool_row(version_id: str, tool: Tool) -> dict[str, Any]:
    return {
        "version_id": version_id,
        "name": tool.name,
        "description": tool.description,
        "effect": tool.effect,
        "timeout_ms": tool.timeout_ms,
        "language": tool.language,
        "input_schema": json.dumps(tool.input_schema),
        "output_schema": json.dumps(tool.output_schema),
        "packages": json.dumps(list(tool.packages)),
        "yaml_path": tool.yaml_path,
        "yaml_text": tool.yaml_text,
        "source_path": tool.source_path,
        "source": tool.source,
        "compiled_js": tool.compiled_js,
        "module_format": tool.module_format,
    }


def _tool_record(row: dict[str, Any]) -> ToolRecord:
    return ToolRecord(
        **{
            **row,
            "input_schema": json.loads(row["input_schema"]),
            "output_schema": json.loads(row["output_schema"]),
            "packages": tuple(json.loads(row["packages"])),
        }
    )


def _install_record(row: dict[str, Any]) -> InstallRecord:
    return InstallRecord(**{**row, "egress": tuple(json.loads(row["egress"]))})


def _version_record(row: dict[str, Any]) -> VersionRecord:
    return VersionRecord(
        id=row["id"],
        app_id=row["app_id"],
        app_slug=row["app_slug"],
        version=row["version"],
        seq=row["seq"],
        content_hash=row["content_hash"],
        tool_names=tuple(json.loads(row["tool_names"])),
        created_at=row["created_at"],
        egress=tuple(json.loads(row["egress"])),
        commit=row.get("git_commit"),
        ref=row.get("git_ref"),
    )
