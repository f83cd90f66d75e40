"""What a Python tool imports, against what its jail will have.

A tool's jail has Python's standard library, the tool's own file and the packages its
tool file lists: ``import requests`` in a tool without ``requests`` under ``packages``
passes every other check and fails at its first run. Upload warns about it (a warning,
not a refusal: a package may provide a module under a name this table does not know).
Never runs the tool's code.

JavaScript and TypeScript are checked in upload/code.py, from the toolchain's module
lexer: there an import of a package ``packages`` does not list is refused.
"""

from __future__ import annotations

import ast
import posixpath
import sys

from runnerd.model import Problem
from runnerd.upload.pins import pin_name

__all__ = ["import_warnings"]

# Packages whose import name is not their (normalized) distribution name. A package
# missing here provides its normalized name (``typing-extensions`` -> typing_extensions).
_PROVIDES: dict[str, tuple[str, ...]] = {
    "attrs": ("attr", "attrs"),
    "beautifulsoup4": ("bs4",),
    "dnspython": ("dns",),
    "faiss-cpu": ("faiss",),
    "google-api-python-client": ("googleapiclient",),
    "grpcio": ("grpc",),
    "opencv-contrib-python": ("cv2",),
    "opencv-python": ("cv2",),
    "opencv-python-headless": ("cv2",),
    "pdfminer-six": ("pdfminer",),
    "pillow": ("PIL",),
    "protobuf": ("google",),
    "psycopg2-binary": ("psycopg2",),
    "pycryptodome": ("Crypto",),
    "pycryptodomex": ("Cryptodome",),
    "pyjwt": ("jwt",),
    "pymupdf": ("fitz", "pymupdf"),
    "pyopenssl": ("OpenSSL",),
    "pyserial": ("serial",),
    "python-dateutil": ("dateutil",),
    "python-docx": ("docx",),
    "python-dotenv": ("dotenv",),
    "python-json-logger": ("pythonjsonlogger",),
    "python-magic": ("magic",),
    "python-multipart": ("multipart", "python_multipart"),
    "python-pptx": ("pptx",),
    "python-slugify": ("slugify",),
    "pyyaml": ("yaml",),
    "pyzmq": ("zmq",),
    "ruamel-yaml": ("ruamel",),
    "scikit-image": ("skimage",),
    "scikit-learn": ("sklearn",),
    "setuptools": ("setuptools", "pkg_resources", "_distutils_hack"),
    "websocket-client": ("websocket",),
}

# Handlers that make an import optional: ``try: import ujson except ImportError: ...``.
_OPTIONAL = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _provided(packages: tuple[str, ...]) -> set[str]:
    """The top-level module names (lower case) the packages provide."""
    names: set[str] = set()
    for pin in packages:
        dist = pin_name(pin).lower()
        if dist.startswith("google-"):  # google-cloud-storage and the like: google.*
            names.add("google")
        names.update(m.lower() for m in _PROVIDES.get(dist, ()))
        names.add(dist.replace("-", "_").replace(".", "_"))
    return names


def _optional(handlers: list[ast.ExceptHandler]) -> bool:
    for handler in handlers:
        caught = handler.type
        if caught is None:
            return True
        kinds = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        if any(isinstance(k, ast.Name) and k.id in _OPTIONAL for k in kinds):
            return True
    return False


def _imports(tree: ast.AST) -> list[tuple[str, int]]:
    """Every absolute import's top-level module and line, at any depth (in functions,
    classes, branches), except those in a ``try`` that handles ImportError."""
    found: list[tuple[str, int]] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno))
        if isinstance(node, ast.Try | ast.TryStar) and _optional(node.handlers):
            stack += [*node.handlers, *node.orelse, *node.finalbody]  # not the body
            continue
        stack.extend(ast.iter_child_nodes(node))
    return sorted(found, key=lambda f: f[1])


def import_warnings(
    path: str, source: str, packages: tuple[str, ...], app_modules: frozenset[str] = frozenset()
) -> list[Problem]:
    """A warning for each module ``source`` (a Python tool's, at ``path``) imports that
    is neither in the standard library, nor the tool's own module, nor provided by one
    of ``packages`` (normalized pins): once per module, at its first line. A module
    among ``app_modules`` (the app's other Python files) is named as such: the jail
    receives only the tool's own file. A source that does not parse gets none (code.py
    reports it)."""
    own = posixpath.splitext(posixpath.basename(path))[0]
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    provided = _provided(packages)
    warned: set[str] = set()
    out: list[Problem] = []
    for module, line in _imports(tree):
        if (
            module in warned
            or module in sys.stdlib_module_names
            or module == own
            or module.lower() in provided
        ):
            continue
        warned.add(module)
        if module in app_modules:
            why = (
                f"imports {module!r}, another file of the app: the sandbox receives only "
                "the tool's own file, so the import fails when the tool runs"
            )
        else:
            why = (
                f"imports {module!r}, which neither Python's standard library nor a "
                "package under `packages` provides: the import fails when the tool runs "
                "(list the package that provides it)"
            )
        out.append(Problem(path, why, line))
    return out
