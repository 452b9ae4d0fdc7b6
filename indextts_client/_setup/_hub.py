"""The checkpoints and the auxiliary models, from the Hugging Face hub (or ``HF_ENDPOINT``).

huggingface_hub does the work: resumable downloads (an interrupted file continues from its
``.incomplete`` part), ``HF_ENDPOINT``, ``HF_TOKEN``, ``HF_HOME`` and ``HF_HUB_OFFLINE`` as it
reads them.  The auxiliary models go where the adapter looks for them
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
from typing import Any, NamedTuple, Union

from ._build import SetupError

__all__ = ["AUX_MODELS", "DEFAULT_MODELS", "AuxModel", "download_aux", "download_model", "hub_errors"]

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
#: Where partial downloads live (huggingface_hub's ``.incomplete`` files, resumed on the next run).
STAGING = ".download"


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
    except (errors.LocalEntryNotFoundError, errors.HfHubHTTPError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise SetupError(
                f"the disk under {where} is full: free space there (a partial download resumes on the next run), "
                "or put the models elsewhere with --model-dir DIR or INDEXTTS_HOME"
            ) from None
        if (
            isinstance(exc, errors.HfHubHTTPError)
            and exc.response is not None
            and exc.response.status_code
            in (
                401,
                403,
            )
        ):
            raise SetupError(
                f"{_endpoint()} refused {repo_id} ({exc.response.status_code}): set HF_TOKEN to a token with access "
                "(accept the model's terms on its page first if it is gated)"
            ) from None
        if isinstance(exc, OSError) and not _is_network(exc):
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


def _sizes(repo_id: str, allow: Union[list[str], None], local_dir: Path) -> int:
    """Bytes still to download (huggingface_hub's dry run, which compares with what is on disk)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils.tqdm import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()  # the dry run's own bar says nothing worth showing
    try:
        plan = snapshot_download(repo_id, local_dir=str(local_dir), allow_patterns=allow, dry_run=True)
    finally:
        if not was_disabled:
            enable_progress_bars()
    return sum(int(f.file_size or 0) for f in plan if f.will_download)


def download_model(repo_id: str, model_dir: Path, bar: Callable[[str], Any]) -> Path:
    """The whole repository ``repo_id`` into ``model_dir`` (resumed where a run stopped)."""
    from huggingface_hub import snapshot_download

    with hub_errors(repo_id, model_dir):
        model_dir.mkdir(parents=True, exist_ok=True)
        check_space(_sizes(repo_id, None, model_dir), model_dir)
        snapshot_download(repo_id, local_dir=str(model_dir), tqdm_class=bar(repo_id), max_workers=4)
    return model_dir


def download_aux(model_dir: Path, version: str, bar: Callable[[str], Any]) -> None:
    """The auxiliary models upstream would fetch at load, into ``<model_dir>/hf_cache`` as the adapter reads them."""
    from huggingface_hub import hf_hub_download

    cache = model_dir / "hf_cache"
    for model in AUX_MODELS:
        if model.v2_only and version != "2":
            continue
        wanted = [(remote, cache / local) for remote, local in model.files if not (cache / local).is_file()]
        if not wanted:
            continue
        staging = cache / STAGING / model.repo_id.replace("/", "--")
        with hub_errors(model.repo_id, cache):
            staging.mkdir(parents=True, exist_ok=True)
            check_space(_sizes(model.repo_id, [remote for remote, _ in wanted], staging), cache)
            for remote, target in wanted:
                path = hf_hub_download(model.repo_id, remote, local_dir=str(staging), tqdm_class=bar(model.label))
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
    shutil.rmtree(cache / STAGING, ignore_errors=True)
