"""An app folder as a commit holds it: the bundle a Git deploy uploads.

``read_git_app`` resolves a ref (a branch, a tag, a commit; default the repository's
HEAD) to one commit, writes that commit's tree under the app folder into a fresh
temporary folder (never a working tree: uncommitted changes are not in a commit) and reads
it with walk.read_app_dir, so the bundle is exactly what ``app deploy DIR`` would give on a
checkout of that commit: the manifest's tools globs, the sources beside them, the pages.

It runs git itself (``/usr/bin/git`` or the one on PATH): no Python Git library is needed,
and git speaks every protocol and credential setup a builder already uses. A repository is
read in place when it is a local folder, else fetched into a temporary bare repository
(only the commit's history, ``--depth 1`` where the server allows).

On the daemon (``daemon=True``, the push webhook) git runs with no system or global
config, no prompt, no redirects, and only the protocols http, https and git (file and
local paths only when ``allow_local``): it reaches only the configured repository.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runnerd import limits as L
from runnerd.errors import GitSourceInvalid
from runnerd.upload.walk import read_app_dir

__all__ = ["GitApp", "clean_subdir", "git_binary", "is_local", "read_git_app", "ref_matches"]

_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_HEXISH = re.compile(r"[0-9a-fA-F]{4,64}")
_FILE_CAP = L.GIT_FILE_CAP_BYTES
_TREE_BYTES_CAP = L.GIT_TREE_CAP_BYTES
_GIT_TIMEOUT_S = L.GIT_TIMEOUT_S
_REPOSITORY_VARIABLES = frozenset(
    {"GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR",
     "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_SHALLOW_FILE", "GIT_PREFIX"}
)  # fmt: skip


@dataclass(frozen=True)
class GitApp:
    """The bundle of an app folder at one commit, with where it came from."""

    files: dict[str, bytes]
    commit: str  # the full object name
    ref: str | None  # the full ref name resolved (refs/heads/main), None for a bare commit


def git_binary() -> str:
    """The git program; GitSourceInvalid (field ``repository``) when there is none."""
    found = shutil.which("git") or ("/usr/bin/git" if os.access("/usr/bin/git", os.X_OK) else None)
    if found is None:
        raise GitSourceInvalid(
            "repository",
            "git is not installed on this machine (a Git deploy runs git): install it, "
            "for example `apt-get install git`, or deploy a folder with `app deploy DIR`",
        )
    return found


def is_local(source: str) -> bool:
    """Whether ``source`` names a repository on this machine (a path or file://)."""
    if source.startswith("file://"):
        return True
    return "://" not in source and not re.match(r"^[\w.-]+@[\w.-]+:", source)


def ref_matches(pattern: str, ref: str) -> bool:
    """Whether the full ref name ``ref`` matches ``pattern``: a full ref name where ``*``
    stands for any characters but ``/`` (``refs/heads/*``, ``refs/tags/v*``); a pattern
    without ``refs/`` names a branch (``main`` is ``refs/heads/main``)."""
    full = pattern if pattern.startswith("refs/") else f"refs/heads/{pattern}"
    body = "".join("[^/]*" if c == "*" else re.escape(c) for c in full)
    return re.fullmatch(body, ref) is not None


class _Git:
    """git, run with a fixed environment: the builder's own config on the CLI; on the
    daemon none, no prompt, no redirects and only the allowed protocols."""

    def __init__(self, *, daemon: bool, allow_local: bool) -> None:
        self.binary = git_binary()
        # The builder's own setup (ssh command, askpass, config) stays; what would point
        # git at another repository or index does not.
        env = {k: v for k, v in os.environ.items() if k not in _REPOSITORY_VARIABLES}
        env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C", GIT_OPTIONAL_LOCKS="0")
        self.config: list[str] = [
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
            "-c",
            "protocol.ext.allow=never",
        ]
        if daemon:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
            env.update(
                GIT_TERMINAL_PROMPT="0",
                GIT_CONFIG_NOSYSTEM="1",
                GIT_CONFIG_GLOBAL="/dev/null",
                GIT_ASKPASS="/bin/false",
                GIT_OPTIONAL_LOCKS="0",
                HOME="/nonexistent",
                GIT_ALLOW_PROTOCOL="http:https:git" + (":file" if allow_local else ""),
            )
            self.config += ["-c", "http.followRedirects=false", "-c", "credential.helper="]
        self.env = env

    def run(self, *args: str, cwd: Path | None = None, input: bytes | None = None) -> bytes:
        """git's standard output; subprocess.CalledProcessError (with its stderr) else."""
        done = subprocess.run(
            [self.binary, *self.config, *args],
            cwd=cwd,
            env=self.env,
            input=input,
            capture_output=True,
            timeout=_GIT_TIMEOUT_S,
            check=True,
        )
        return done.stdout

    def ok(self, *args: str, cwd: Path | None = None) -> str | None:
        """git's output as text, stripped, or None when it fails."""
        try:
            return self.run(*args, cwd=cwd).decode("utf-8", "replace").strip()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            return None


def _why(exc: subprocess.CalledProcessError | subprocess.TimeoutExpired) -> str:
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"git took more than {_GIT_TIMEOUT_S:.0f} s"
    err = (exc.stderr or b"").decode("utf-8", "replace").strip().splitlines()
    return err[-1] if err else f"git exited {exc.returncode}"


def _local_repo(git: _Git, source: str) -> Path:
    path = Path(source.removeprefix("file://")).expanduser()
    if not path.exists():
        raise GitSourceInvalid("repository", f"{source}: no such folder")
    top = git.ok("rev-parse", "--absolute-git-dir", cwd=path)
    if top is None:
        raise GitSourceInvalid("repository", f"{source} is not a Git repository")
    return Path(top)


def _resolve_local(git: _Git, repo: Path, ref: str | None) -> tuple[str, str | None]:
    """The commit ``ref`` names in the repository ``repo`` (a git dir), and its full ref
    name (None for a commit named by its object name)."""
    name = ref or "HEAD"
    if name.startswith("-"):
        raise GitSourceInvalid("ref", f"{name!r} is not a ref")
    commit = git.ok("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", cwd=repo)
    if not commit:
        raise GitSourceInvalid("ref", f"{name!r}: no branch, tag or commit of that name")
    full = git.ok("rev-parse", "--symbolic-full-name", name, cwd=repo)
    return commit, (full or None) if full != "HEAD" else None


def _fetch(git: _Git, url: str, ref: str | None, into: Path) -> tuple[str, str | None]:
    """Fetch the commit ``ref`` names from ``url`` into the bare repository ``into``: its
    commit and full ref name."""
    try:
        listed = git.run("ls-remote", "--symref", "--end-of-options", url).decode(
            "utf-8", "replace"
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise GitSourceInvalid("repository", f"{url}: cannot be read ({_why(exc)})") from None
    refs: dict[str, str] = {}
    head: str | None = None
    for line in listed.splitlines():
        left, _, name = line.partition("\t")
        if left.startswith("ref: ") and name == "HEAD":
            head = left[5:]
        elif name.endswith("^{}"):
            refs[name[:-3]] = left  # a tag's commit, peeled
        else:
            refs.setdefault(name, left)
    full: str | None
    if ref is None:
        full = head or ("HEAD" if "HEAD" in refs else None)
        if full is None or full not in refs:
            raise GitSourceInvalid("ref", f"{url} has no HEAD (an empty repository?); name a --ref")
    else:
        full = next(
            (
                n
                for n in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}")
                if n in refs and n != "HEAD"
            ),
            "HEAD" if ref == "HEAD" else None,
        )
    if full is not None:
        want = refs[full]
    elif ref is not None and _HEXISH.fullmatch(ref):
        want = ref.lower()
    else:
        raise GitSourceInvalid("ref", f"{ref!r}: no branch or tag of that name in {url}")
    tip = want in refs.values()
    try:
        if tip or _SHA.fullmatch(want):
            git.run(
                "fetch",
                "--quiet",
                "--no-tags",
                "--depth=1",
                "--end-of-options",
                url,
                want,
                cwd=into,
            )
    except subprocess.CalledProcessError:
        tip = False  # an object the server would not give by name: fetch its branches
    commit = git.ok("rev-parse", "--verify", "--quiet", f"{want}^{{commit}}", cwd=into)
    if not commit:
        try:
            git.run("fetch", "--quiet", "--end-of-options", url,
                    "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*", cwd=into)  # fmt: skip
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            raise GitSourceInvalid("repository", f"{url}: cannot be read ({_why(exc)})") from None
        commit = git.ok("rev-parse", "--verify", "--quiet", f"{want}^{{commit}}", cwd=into)
    if not commit:
        raise GitSourceInvalid("ref", f"{ref!r}: no branch, tag or commit of that name in {url}")
    return commit, full if full != "HEAD" else None


def clean_subdir(path: str | None) -> str:
    sub = (path or "").strip("/")
    while sub.startswith("./"):
        sub = sub[2:]
    if sub in ("", "."):
        return ""
    if any(seg in ("", ".", "..") for seg in sub.split("/")) or "\0" in sub:
        raise GitSourceInvalid("path", f"{path!r}: a folder of the repository, with no '..'")
    return sub


def _materialize(git: _Git, repo: Path, commit: str, sub: str, out: Path) -> None:
    """Write the tree of ``commit`` under ``sub`` into ``out``: its files and symlinks
    (the walk judges where a link leads), never a submodule."""
    treeish = f"{commit}:{sub}" if sub else f"{commit}^{{tree}}"
    kind = git.ok("cat-file", "-t", treeish, cwd=repo)
    if kind != "tree":
        raise GitSourceInvalid("path", f"{sub!r}: no such folder at commit {commit[:12]}")
    listing = git.run("ls-tree", "-r", "-z", "--long", "--full-tree", treeish, cwd=repo)
    entries: list[tuple[str, str, str]] = []
    total = 0
    for record in listing.split(b"\0"):
        if not record:
            continue
        meta, _, raw_name = record.partition(b"\t")
        mode, kind, obj, size = meta.decode().split()
        if kind != "blob":
            continue  # a submodule's commit: not in the bundle
        if len(entries) >= L.MAX_WALK_ENTRIES:
            raise GitSourceInvalid(
                "path", f"the folder holds more than {L.MAX_WALK_ENTRIES:,} files at that commit"
            )
        total += min(int(size), _FILE_CAP)
        if total > _TREE_BYTES_CAP:
            raise GitSourceInvalid(
                "path",
                f"the folder holds more than {_TREE_BYTES_CAP // L.MB:,} MB at that commit; "
                "point --path at the app folder",
            )
        entries.append(
            (
                mode,
                obj if int(size) < _FILE_CAP else "",
                raw_name.decode("utf-8", "surrogateescape"),
            )
        )
    if not any(name == L.MANIFEST_NAME for _, _, name in entries):
        where = f"{sub!r}" if sub else "the repository's root"
        raise GitSourceInvalid("path", f"no {L.MANIFEST_NAME} in {where} at commit {commit[:12]}")
    real_out = out.resolve()
    batch = "".join(f"{obj}\n" for _, obj, _ in entries if obj).encode()
    data = git.run("cat-file", "--batch", cwd=repo, input=batch) if batch else b""
    at = 0
    for mode, obj, name in entries:
        content = b""
        if obj:
            header_end = data.index(b"\n", at)
            length = int(data[at:header_end].split()[2])
            content = data[header_end + 1 : header_end + 1 + length]
            at = header_end + 1 + length + 1
        target = out / name
        if any(seg in ("", ".", "..") for seg in name.split("/")):
            continue  # git never stores one; refuse to write it anyway
        parent = target.parent.resolve()
        if parent != real_out and real_out not in parent.parents:
            continue  # under a link: git never stores a file below a symlink
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "120000":
            os.symlink(os.fsdecode(content), target)
        elif obj:
            target.write_bytes(content)
        else:  # larger than any bundle file may be: as large, unread (the checks say so)
            with target.open("wb") as f:
                f.truncate(_FILE_CAP)


def read_git_app(
    source: str,
    *,
    ref: str | None = None,
    path: str | None = None,
    daemon: bool = False,
    allow_local: bool = True,
) -> GitApp:
    """The bundle of the app folder ``path`` (default the root) of the commit ``ref``
    names (default HEAD) in the repository ``source`` (a local path, file://, http(s)://,
    git://, or on the CLI ssh). GitSourceInvalid naming the field (``repository``,
    ``ref``, ``path``) when it cannot be read; BundleRejected as read_app_dir raises it.
    Nothing is written outside a temporary folder, removed before it returns."""
    git = _Git(daemon=daemon, allow_local=allow_local)
    sub = clean_subdir(path)
    if ref is not None and (not ref or len(ref) > 256 or ref.startswith("-")):
        raise GitSourceInvalid("ref", f"{ref!r} is not a ref")
    local = is_local(source)
    if local and not allow_local:
        raise GitSourceInvalid(
            "repository",
            "a local path or file:// repository is refused here (the setting "
            "git_deploy_allow_local allows it)",
        )
    if daemon and not local and not re.match(r"^(https?|git)://", source, re.IGNORECASE):
        raise GitSourceInvalid("repository", "the daemon fetches only http(s):// and git:// URLs")
    with tempfile.TemporaryDirectory(prefix="runnerd-git-") as tmp:
        work = Path(tmp)
        if local:
            repo = _local_repo(git, source)
            commit, full = _resolve_local(git, repo, ref)
        else:
            repo = work / "repo.git"
            try:
                git.run("init", "--quiet", "--bare", str(repo))
            except subprocess.CalledProcessError as exc:
                raise GitSourceInvalid("repository", f"git init failed: {_why(exc)}") from None
            commit, full = _fetch(git, source, ref, repo)
        tree = work / "tree"
        tree.mkdir()
        try:
            _materialize(git, repo, commit, sub, tree)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            raise GitSourceInvalid(
                "repository", f"{source}: cannot be read ({_why(exc)})"
            ) from None
        files = read_app_dir(tree)
    return GitApp(files=files, commit=commit, ref=full)
