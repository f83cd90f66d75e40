"""Git deploys: per app of a workspace, the repository a Git server's push webhook deploys
from (admins set it), and the webhook itself.

``POST /api/v2/apps/{appSlug}/git-webhook?workspaceId=…`` carries no key: it is signed
(``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>``, GitHub's and Gitea's
header) with the Git deploy's secret, which is kept sealed by the vault. A push of a ref
the Git deploy follows deploys the pushed commit (the body's ``after``) of the CONFIGURED
repository, never a URL from the body, as a new version that records the commit and ref.
A missing or bad signature is 401 and changes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
from urllib.parse import quote, urlsplit

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from runnerd import limits as L
from runnerd.api.apps import store_version, version_info
from runnerd.api.auth import workspace_admin
from runnerd.api.bodies import (
    GitDeployBody,
    GitDeployInfo,
    GitDeployList,
    GitPushEvent,
    GitPushResult,
    WebhookDeleted,
)
from runnerd.api.ops import WORKSPACE, Op, Param, json_response, query_param
from runnerd.api.reading import read_body
from runnerd.api.state import AppState
from runnerd.errors import (
    BodyTooLarge,
    BundleRejected,
    GitDeployNotFound,
    GitSourceInvalid,
    InvalidBody,
    RequestTimeout,
    WebhookSignatureInvalid,
)
from runnerd.govern.apps import check_owner
from runnerd.govern.notify import new_webhook_secret
from runnerd.limits import MANIFEST_NAME, MAX_SLUG_CHARS, MAX_SMALL_BODY_BYTES
from runnerd.model import Bundle, Problem
from runnerd.store import GitDeployRow
from runnerd.store.git_deploys import git_deploy_sealed_name
from runnerd.upload.deploy import check_upload
from runnerd.upload.git import clean_subdir, is_local, read_git_app, ref_matches

__all__ = ["OPS"]

_log = logging.getLogger("runnerd")

MAX_PUSH_BODY_BYTES = L.MAX_PUSH_BODY_BYTES
_OBJECT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_SLUG = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")  # schemas/agentserve.app.schema.json's slug


def _webhook_url(state: AppState, workspace_id: str, slug: str) -> str:
    return (
        f"{state.settings.public_base}/api/v2/apps/{quote(slug)}/git-webhook"
        f"?workspaceId={quote(workspace_id)}"
    )


def _info(state: AppState, row: GitDeployRow, secret: str | None = None) -> GitDeployInfo:
    return GitDeployInfo(
        app_slug=row.app_slug,
        repository=row.repository,
        ref=row.ref_pattern,
        path=row.path,
        webhook_url=_webhook_url(state, row.workspace_id, row.app_slug),
        created_at=row.created_at,
        updated_at=row.updated_at,
        secret=secret if secret is not None else msgspec.UNSET,
    )


def _repository(url: str, state: AppState) -> str:
    """The repository a push deploys from, as the daemon may fetch it: an http(s):// or
    git:// URL with a host and no user or password (the URL is shown and audited), or,
    when git_deploy_allow_local is on, a local path or file://."""
    url = url.strip()
    if is_local(url):
        if not state.settings.git_deploy_allow_local:
            raise GitSourceInvalid(
                "repository",
                "a local path or file:// repository needs the setting git_deploy_allow_local: "
                "git_deploy_allow_local = true in the daemon's config file (runnerd.toml), or "
                "RUNNERD_GIT_DEPLOY_ALLOW_LOCAL=1 in its environment, then restart it; or "
                "serve the repository with git daemon on 127.0.0.1 and give its git:// URL",
            )
        return url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "git") or not parts.hostname:
        raise GitSourceInvalid(
            "repository", "the daemon fetches only http(s):// and git:// URLs with a host"
        )
    if parts.username is not None or parts.password is not None:
        raise GitSourceInvalid(
            "repository",
            "a repository URL carries no user or password (it is shown and audited); "
            "the daemon fetches repositories it can read without credentials",
        )
    return parts.geturl()  # the scheme in lower case (HTTPS:// is https://)


def _ref_pattern(ref: str) -> str:
    if ref.startswith("-") or any(c.isspace() or c in "\\~^:?[" for c in ref) or ".." in ref:
        raise GitSourceInvalid("ref", f"{ref!r} is not a ref or ref pattern (refs/heads/main)")
    return ref


def _slug_param(request: Request) -> str:
    slug = str(request.path_params["appSlug"])
    if not _SLUG.fullmatch(slug):  # the manifest's rule: no app can have another slug
        raise InvalidBody(f"appSlug: {slug[:80]!r} is not an app slug (a-z, 0-9 and -)")
    return slug


async def put_git_deploy(request: Request, state: AppState) -> Response:
    """Set an app's Git deploy; a new one (or ``newSecret``) gets a new signing secret,
    in this answer only, kept sealed by the vault."""
    caller, workspace_id = await workspace_admin(request, state, "apps:write")
    slug = _slug_param(request)
    body = await read_body(request, GitDeployBody, MAX_SMALL_BODY_BYTES)
    repository = _repository(body.repository, state)
    ref = _ref_pattern(body.ref)
    path = clean_subdir(body.path)
    store = state.store
    app = await store.io(store.get_app, slug)
    if app is not None:
        check_owner(app, workspace_id)  # another workspace's app: none of its deploys
    current = await store.io(store.git_deploy, workspace_id, slug)
    secret = new_webhook_secret() if current is None or body.new_secret else None
    sealed = (
        None
        if secret is None
        else state.governor.vault.seal(
            workspace_id, git_deploy_sealed_name(workspace_id, slug), secret
        )
    )
    row = await store.io(
        store.set_git_deploy,
        workspace_id,
        slug,
        repository=repository,
        ref_pattern=ref,
        path=path,
        sealed=sealed,
        actor_user_id=caller.user_id,
        actor_key_id=caller.key.id,
    )
    return json_response(_info(state, row, secret))


async def list_git_deploys(request: Request, state: AppState) -> Response:
    _, workspace_id = await workspace_admin(request, state, "api:read")
    rows = await state.store.io(state.store.git_deploys, workspace_id)
    return json_response(GitDeployList(data=[_info(state, r) for r in rows]))


async def delete_git_deploy(request: Request, state: AppState) -> Response:
    caller, workspace_id = await workspace_admin(request, state, "apps:write")
    deleted = await state.store.io(
        state.store.delete_git_deploy,
        workspace_id,
        _slug_param(request),
        actor_user_id=caller.user_id,
        actor_key_id=caller.key.id,
    )
    if not deleted:
        raise GitDeployNotFound
    return json_response(WebhookDeleted(deleted=True))


class _Push(msgspec.Struct):
    """The fields of a push event runnerd reads (GitHub, Gitea, Forgejo, GitLab alike);
    every other field, ``repository.clone_url`` among them, is not used."""

    ref: str | None = None
    after: str | None = None


async def _signed_body(request: Request, state: AppState, row: GitDeployRow | None) -> bytes:
    """The request's body when its X-Hub-Signature-256 signs it with the Git deploy's
    secret; WebhookSignatureInvalid (401) when it does not, or there is no Git deploy."""
    given = request.headers.get("x-hub-signature-256", "")
    if row is None or not given.startswith("sha256="):
        raise WebhookSignatureInvalid  # before a byte of the body is read
    data = bytearray()
    try:
        async with asyncio.timeout(L.PUSH_BODY_TIMEOUT_S):  # a drip-fed body: cut short
            async for chunk in request.stream():
                data += chunk
                if len(data) > MAX_PUSH_BODY_BYTES:
                    raise BodyTooLarge(MAX_PUSH_BODY_BYTES)
    except TimeoutError:
        raise RequestTimeout from None
    secret = state.governor.vault.open(
        row.workspace_id,
        git_deploy_sealed_name(row.workspace_id, row.app_slug),
        row.secret_kid,
        row.secret_nonce,
        row.secret_sealed,
    )
    want = hmac.new(secret.encode(), bytes(data), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, given[len("sha256=") :].strip().lower()):
        raise WebhookSignatureInvalid
    return bytes(data)


async def push(request: Request, state: AppState) -> Response:
    workspace_id = query_param(request, WORKSPACE)
    assert workspace_id is not None
    slug = _slug_param(request)
    row = await state.store.io(state.store.git_deploy, workspace_id, slug)
    body = await _signed_body(request, state, row)
    assert row is not None
    event = request.headers.get("x-github-event") or request.headers.get("x-gitea-event")
    if event == "ping":
        return json_response(GitPushResult(deployed=False, ignored="ping"))
    try:
        pushed = msgspec.json.decode(body, type=_Push)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InvalidBody(f"invalid push event: {exc}") from None
    if not isinstance(pushed.ref, str) or not pushed.ref.startswith("refs/"):
        raise InvalidBody("a push event names its ref (ref: refs/heads/…)")
    if not isinstance(pushed.after, str) or not _OBJECT.fullmatch(pushed.after):
        raise InvalidBody("a push event names the commit pushed (after: its object name)")
    if set(pushed.after) == {"0"}:
        return json_response(GitPushResult(deployed=False, ignored=f"{pushed.ref} was deleted"))
    if not ref_matches(row.ref_pattern, pushed.ref):
        why = f"{pushed.ref} is not a ref this Git deploy follows ({row.ref_pattern})"
        return json_response(GitPushResult(deployed=False, ignored=why))
    commit = pushed.after
    return await _deploy_push(state, row, workspace_id, commit, pushed.ref)


async def _deploy_push(
    state: AppState, row: GitDeployRow, workspace_id: str, commit: str, ref: str
) -> Response:
    store = state.store
    done = await store.io(store.version_of_commit, workspace_id, row.app_slug, commit)
    if done is not None:  # a redelivery, a replay, or a branch moved back: no new version
        info = await store.io(version_info, store, done)
        why = f"{commit[:12]} is deployed already, as version {done.version}"
        return json_response(GitPushResult(deployed=False, version=info, ignored=why))
    settings, machine = state.settings, state.machine

    def check() -> Bundle:
        got = read_git_app(
            row.repository,
            ref=commit,
            path=row.path,
            daemon=True,
            allow_local=settings.git_deploy_allow_local,
        )
        bundle = check_upload(got.files, toolchain=machine.toolchain, envs=machine.envs)
        if bundle.manifest.slug != row.app_slug:
            raise BundleRejected(
                [
                    Problem(
                        MANIFEST_NAME,
                        f"slug: this Git deploy is for the app {row.app_slug!r}; the manifest "
                        f"at {commit[:12]} is the app {bundle.manifest.slug!r}",
                    )
                ]
            )
        return bundle

    # Fetching, reading, compiling and checking: off the event loop.
    try:
        bundle = await asyncio.to_thread(check)
    except GitSourceInvalid as exc:
        # The commit is the body's after, not a ref the Git deploy names.
        field = "after" if exc.field == "ref" else exc.field
        _log.warning("git push of %s/%s at %s: %s", workspace_id, row.app_slug, commit[:12], exc)
        raise GitSourceInvalid(field, str(exc)) from None
    except BundleRejected as exc:
        _log.warning(
            "git push of %s/%s at %s refused: %s",
            workspace_id, row.app_slug, commit[:12], "; ".join(str(p) for p in exc.problems[:5]),
        )  # fmt: skip
        raise
    info, warnings = await store_version(
        state, bundle, workspace_id=workspace_id, user_id=None, key_id=None,
        git=(commit, ref),
    )  # fmt: skip
    return json_response(GitPushResult(deployed=True, version=info, warnings=warnings), 201)


_WORKSPACE_PATH = Param(
    "workspaceId", "The workspace.", required=True, max_length=128, where="path"
)
_APP_SLUG = Param("appSlug", "The app.", required=True, max_length=MAX_SLUG_CHARS, where="path")
_GIT_DEPLOYS = "/api/v2/workspaces/{workspaceId}/git-deploys"

OPS = [
    Op(
        "GET",
        _GIT_DEPLOYS,
        "listGitDeploys",
        "The workspace's Git deploys (admins); never their secrets",
        list_git_deploys,
        GitDeployList,
        params=(_WORKSPACE_PATH,),
    ),
    Op(
        "PUT",
        _GIT_DEPLOYS + "/{appSlug}",
        "putGitDeploy",
        "Set an app's Git deploy (admins); a new signing secret is in this answer only",
        put_git_deploy,
        GitDeployInfo,
        body=GitDeployBody,
        params=(_WORKSPACE_PATH, _APP_SLUG),
        description="The repository a push webhook deploys from (http(s):// or git://, no "
        "credentials; a local path or file:// only with git_deploy_allow_local), the refs "
        "it follows and the app's folder. 400 GIT_SOURCE_INVALID names the field. "
        "docs/TOOL-FILES.md.",
    ),
    Op(
        "DELETE",
        _GIT_DEPLOYS + "/{appSlug}",
        "deleteGitDeploy",
        "Remove an app's Git deploy (admins)",
        delete_git_deploy,
        WebhookDeleted,
        params=(_WORKSPACE_PATH, _APP_SLUG),
    ),
    Op(
        "POST",
        "/api/v2/apps/{appSlug}/git-webhook",
        "gitPushWebhook",
        "A Git server's push event: deploys the pushed commit (signed, no key)",
        push,
        GitPushResult,
        status=201,
        body=GitPushEvent,
        params=(WORKSPACE, _APP_SLUG),
        errors=(400, 401, 403, 409, 429, 500),
        authenticated=False,
        description="Signed with X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body, "
        "keyed with the Git deploy's secret>; 401 when missing or wrong, or no Git deploy "
        "is set, and nothing changes (with no header, or no Git deploy, before the body is "
        "read); the body must arrive within 10 s (else 400 REQUEST_TIMEOUT) and hold at "
        "most 4 MB (400 BODY_TOO_LARGE). Reads ref and after (the pushed commit); a ref the "
        "Git deploy does not follow, a deleted branch or a ping answers 200 deployed: "
        "false, and so does a commit the app has a version of already (a redelivery or a "
        "replay: that version, no new one). Otherwise the commit of the configured "
        "repository is fetched and deployed (201, the version with its commit and ref).",
    ),
]
