"""The checkpoints and the auxiliary models, from the Hugging Face hub (or ``HF_ENDPOINT``).

huggingface_hub does the work (its hub API, its metadata request, its ``http_get`` with its
retries), reading ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HOME`` and ``HF_HUB_OFFLINE`` as it always
does; each file grows in ``<target>.part``, which the next run resumes with a ``Range`` request
after a Ctrl-C or a crash.  The auxiliary models go where the adapter looks for them
(``<model_dir>/hf_cache``, the layout of upstream's ``ensure_models_available``), so the
sidecar then runs with ``HF_HUB_OFFLINE=1``.  Every failure becomes a :class:`SetupError`
whose one line names the fix.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from ._build import SetupError

__all__ = ["AUX_MODELS", "DEFAULT_MODELS", "AuxModel", "check_model", "download_aux", "download_model", "hub_errors"]

W2V_FILES = ("config.json", "preprocessor_config.json", "model.safetensors")
DEFAULT_MODELS = {"indextts2": "IndexTeam/IndexTTS-2", "indextts2.5": "IndexTeam/IndexTTS-2.5"}


class AuxModel(NamedTuple):
    """One auxiliary model upstream fetches at its first load (indextts/utils/model_download.py)."""

    label: str
    repo_id: str
    #: Files in the repository -> where each goes, relative to ``<model_dir>/hf_cache``.
    files: tuple[tuple[str, str], ...]
    #: Only IndexTTS-2 reads it (2.5 has its own codec).
    v2_only: bool = False


AUX_MODELS = (
    AuxModel(
        "w2v-bert-2.0",
        "facebook/w2v-bert-2.0",
        tuple((name, f"w2v-bert-2.0/{name}") for name in W2V_FILES),
    ),
    AuxModel(
        "MaskGCT semantic codec",
        "amphion/MaskGCT",
        (("semantic_codec/model.safetensors", "semantic_codec_model.safetensors"),),
        v2_only=True,
    ),
    AuxModel("CAMPPlus", "funasr/campplus", (("campplus_cn_common.bin", "campplus_cn_common.bin"),)),
    AuxModel(
        "BigVGAN",
        "nvidia/bigvgan_v2_22khz_80band_256x",
        (("config.json", "bigvgan/config.json"), ("bigvgan_generator.pt", "bigvgan/bigvgan_generator.pt")),
    ),
)


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


@contextmanager
def hub_errors(repo_id: str, where: Path) -> Iterator[None]:
    """Turn huggingface_hub's and the disk's errors into one line naming the fix."""
    from huggingface_hub import errors

    try:
        yield
    except errors.GatedRepoError:
        raise SetupError(
            f"{repo_id} is gated on {_endpoint()}: accept its terms on its page there, then set HF_TOKEN "
            "(or run `hf auth login`) and run setup again"
        ) from None
    except errors.RepositoryNotFoundError:
        token = "" if os.environ.get("HF_TOKEN") else "; if it is private or gated, set HF_TOKEN"
        raise SetupError(
            f"no model {repo_id} on {_endpoint()}: check --model (e.g. IndexTeam/IndexTTS-2){token}"
        ) from None
    except errors.RevisionNotFoundError:
        raise SetupError(f"{repo_id} has no such revision on {_endpoint()}: check --revision") from None
    except errors.OfflineModeIsEnabled:
        raise SetupError(
            f"HF_HUB_OFFLINE is set and {repo_id} is not on disk: unset HF_HUB_OFFLINE, "
            "or pass --model-dir a directory that holds the checkpoints"
        ) from None
    except errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            raise SetupError(
                f"{_endpoint()} refused {repo_id} ({status}): set HF_TOKEN to a token with access "
                "(accept the model's terms on its page first if it is gated)"
            ) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SetupError(
            f"the hub at {_endpoint()} failed on {repo_id} ({first}): try again later, set HF_ENDPOINT to a "
            "mirror, or pass --model-dir a directory that holds the checkpoints"
        ) from None
    except (errors.LocalEntryNotFoundError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise SetupError(
                f"the disk under {where} is full: free space there (the partial download resumes on the next run), "
                "or put the models elsewhere with --model-dir DIR or INDEXTTS_HOME"
            ) from None
        if isinstance(exc, OSError) and not _is_network(exc) and not isinstance(exc, errors.LocalEntryNotFoundError):
            raise SetupError(f"cannot write under {where}: {exc.strerror or exc}") from None
        raise SetupError(
            f"cannot reach the hub at {_endpoint()} for {repo_id} ({type(exc).__name__}): check the network, "
            "set HF_ENDPOINT to a mirror you can reach, or pass --model-dir a directory that holds the checkpoints"
        ) from None
    except Exception as exc:
        if _is_network(exc):
            raise SetupError(
                f"cannot reach the hub at {_endpoint()} for {repo_id} ({type(exc).__name__}): check the network, "
                "set HF_ENDPOINT to a mirror you can reach, or pass --model-dir a directory that holds the checkpoints"
            ) from None
        raise


def _is_network(exc: BaseException) -> bool:
    """A connection that failed or dropped (httpx's errors, whatever module name it ships under)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"ConnectError", "TimeoutException", "NetworkError", "RemoteProtocolError", "ProtocolError"})


def check_space(needed: int, where: Path) -> None:
    """Refuse before downloading when ``needed`` bytes do not fit under ``where``."""
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise SetupError(
            f"the disk under {where} has {free / 1e9:.1f} GB free and the models need {needed / 1e9:.1f} GB: "
            "free space there, or put the models elsewhere with --model-dir DIR or INDEXTTS_HOME"
        )


class _Remote(NamedTuple):
    name: str
    size: int
    target: Path


def _listing(repo_id: str) -> tuple[str, dict[str, int]]:
    """The commit ``main`` points at, and every file of the repository with its size."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    api = HfApi()
    commit = api.model_info(repo_id).sha
    assert commit is not None
    files = {
        entry.path: int(entry.size)
        for entry in api.list_repo_tree(repo_id, recursive=True, revision=commit)
        if isinstance(entry, RepoFile)
    }
    return commit, files


def _fetch(repo_id: str, commit: str, remote: _Remote, bar: Any) -> None:
    """One file to ``remote.target``, resuming ``<target>.part`` from an earlier run.

    huggingface_hub's own ``hf_hub_download`` resumes a dropped connection within a run, but
    (since 1.x) starts every run on a fresh temporary file; here the partial file keeps its
    name, with the ETag it belongs to beside it, and its size becomes the ``Range`` asked for.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    headers = build_hf_headers()
    meta = get_hf_file_metadata(hf_hub_url(repo_id, remote.name, revision=commit), headers=headers)
    part = remote.target.with_name(remote.target.name + ".part")
    tag = remote.target.with_name(remote.target.name + ".part-etag")
    etag = meta.etag or ""
    resume = part.stat().st_size if part.exists() else 0
    if resume and (not tag.exists() or tag.read_text() != etag or (meta.size is not None and resume > meta.size)):
        part.unlink()  # a partial file of another version of the file: start again
        resume = 0
    remote.target.parent.mkdir(parents=True, exist_ok=True)
    tag.write_text(etag)
    with open(part, "ab") as out:
        http_get(
            meta.location,
            out,
            resume_size=resume,
            headers=headers,
            expected_size=meta.size,
            displayed_filename=remote.name,
            tqdm_class=bar,
        )
    os.replace(part, remote.target)
    tag.unlink()


def _plan(repo_id: str, wanted: dict[str, Path], where: Path) -> tuple[str, list[_Remote]]:
    """The commit and the files of ``repo_id`` still to fetch (``wanted`` empty: all of them, into
    ``where``), once the hub answered and the disk has room for them; raises inside :func:`hub_errors`."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise SetupError(
            f"HF_HUB_OFFLINE is set and {repo_id} is not on disk: unset HF_HUB_OFFLINE, "
            "or pass --model-dir a directory that holds the checkpoints"
        )
    commit, files = _listing(repo_id)
    if not wanted:
        wanted = {name: where / name for name in files}
    unknown = sorted(set(wanted) - set(files))
    if unknown:
        raise SetupError(f"{repo_id} has no {', '.join(unknown)}: check --model")
    todo = [_Remote(name, files[name], target) for name, target in wanted.items() if not target.is_file()]
    partial = sum(p.stat().st_size for p in (r.target.with_name(r.target.name + ".part") for r in todo) if p.exists())
    check_space(sum(r.size for r in todo) - partial, where)
    return commit, todo


def check_model(repo_id: str, model_dir: Path) -> None:
    """Before anything is built: the hub knows ``repo_id``, grants it, and the disk has room for it."""
    with hub_errors(repo_id, model_dir):
        _plan(repo_id, {}, model_dir)


def _download(repo_id: str, wanted: dict[str, Path], where: Path, bar: Callable[[str], Any], label: str) -> None:
    """The files of ``repo_id`` named in ``wanted`` (None: all of them, into ``where``) that are not on disk."""
    with hub_errors(repo_id, where):
        commit, todo = _plan(repo_id, wanted, where)
        for remote in todo:
            _fetch(repo_id, commit, remote, bar(f"{label}: {remote.name}"))


def download_model(repo_id: str, model_dir: Path, bar: Callable[[str], Any]) -> Path:
    """The whole repository ``repo_id`` into ``model_dir`` (resumed where a run stopped)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    _download(repo_id, {}, model_dir, bar, repo_id.rpartition("/")[2])
    return model_dir


def download_aux(model_dir: Path, version: str, bar: Callable[[str], Any]) -> None:
    """The auxiliary models upstream would fetch at load, into ``<model_dir>/hf_cache`` as the adapter reads them."""
    cache = model_dir / "hf_cache"
    for model in AUX_MODELS:
        if model.v2_only and version != "2":
            continue
        wanted = {remote: cache / local for remote, local in model.files if not (cache / local).is_file()}
        if wanted:
            _download(model.repo_id, wanted, cache, bar, model.label)
