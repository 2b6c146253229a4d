"""A user's own Triton model repository (``--triton-model-repo DIR``).

Ordeal serves it as it is, on every replica, instead of the models it
generates (engines/triton/models.py), and drives one of its models (the
only one, or the one named with ``--served-model-name``) through Triton's
generate extension: ``POST /v2/models/NAME/generate`` and
``.../generate_stream``, with ``text_input`` in and ``text_output`` out.
That is the convention of Triton's LLM backends (the vLLM backend, the
TensorRT-LLM ensemble), so a team's real LLM repository is driven without
code of ours in it. engines/triton/generate_client.py is that client;
docs/examples/triton-model-repo/ is a repository made here that follows
the convention (the tests serve it).

Ordeal neither copies nor changes the repository; Triton's Python backend
itself writes ``__pycache__`` beside a Python model's ``model.py``, as it
does in any deployment (PYTHONDONTWRITEBYTECODE did not stop its embedded
interpreter), and the digest leaves caches out.

Read before anything starts: a repository that is missing, holds no model,
or holds several without ``--served-model-name`` naming one is refused with
what to do. Whether the model really speaks the convention is learnt from
the server at run start (its configuration's inputs and outputs).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ordeal.config import ConfigError

#: Directory names Triton itself never loads as models.
_NOT_MODELS = ("__pycache__",)


@dataclass(frozen=True)
class UserRepository:
    path: Path
    models: tuple[str, ...]  # every model directory in it, sorted
    model: str  # the one the workload drives
    digest: str  # sha256 over every file's relative path and bytes, 12 hex digits

    def describe(self) -> dict[str, object]:
        """What summary.json records of it."""
        return {"model_repository": str(self.path), "models": list(self.models),
                "driven_model": self.model, "repository_digest": self.digest,
                "protocol": "Triton generate extension (text_input -> text_output)"}


def model_dirs(path: Path) -> tuple[str, ...]:
    """The model directories of a repository: subdirectories with a
    ``config.pbtxt`` or a numeric version directory, as Triton loads them."""
    out = []
    for d in sorted(path.iterdir()):
        if not d.is_dir() or d.name.startswith(".") or d.name in _NOT_MODELS:
            continue
        if (d / "config.pbtxt").is_file() or any(v.is_dir() and v.name.isdigit()
                                                 for v in d.iterdir()):
            out.append(d.name)
    return tuple(out)


def repository_digest(path: Path) -> str:
    """A digest of everything Triton would read (caches left out): two runs
    with the same digest served the same repository."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()
                    and "__pycache__" not in p.parts):
        h.update(str(f.relative_to(path)).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def read_user_repository(path: str | Path, served_model_name: str | None) -> UserRepository:
    """Check the repository and choose the driven model (``served_model_name``
    None: the only model in it)."""
    where = f"--triton-model-repo {str(path)!r}"
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ConfigError(f"{where}: no such directory; give a Triton model repository "
                          "(a directory of MODEL/config.pbtxt and MODEL/1/...), e.g. "
                          "docs/examples/triton-model-repo")
    p = p.resolve()
    try:
        models = model_dirs(p)
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e})") from e
    if not models:
        raise ConfigError(f"{where}: holds no model (no subdirectory with a config.pbtxt or a "
                          "numeric version directory); point at the repository's top directory")
    if served_model_name is None:
        if len(models) > 1:
            raise ConfigError(f"{where} holds {len(models)} models ({', '.join(models)}): name "
                              "the one to drive with --served-model-name (it must take "
                              "text_input and answer text_output)")
        model = models[0]
    elif served_model_name not in models:
        raise ConfigError(f"{where}: no model {served_model_name!r} in it (it holds: "
                          f"{', '.join(models)}); fix --served-model-name")
    else:
        model = served_model_name
    return UserRepository(p, models, model, repository_digest(p))
