"""Hugging Face repo ids as export sources: the local hub cache first, then the hub.

Only the files an export reads are fetched (config, safetensors, tokenizer, chat template), so a
repo's other formats (`original/`, `*.pth`, GGUFs) are never downloaded.
"""

from __future__ import annotations

from pathlib import Path

from .errors import SourceError

# What `export` reads from a checkpoint folder (`recipes.hf_source.TOKENIZER_FILES` and the weights).
ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt", "*.tiktoken"]


def is_repo_id(source: str) -> bool:
    """`org/name` with exactly one slash, not an existing path."""
    parts = source.split("/")
    return len(parts) == 2 and all(parts) and not Path(source).exists()


def fetch(repo_id: str, gated: bool = False) -> Path:
    """The local snapshot folder of Hugging Face repo `repo_id`, downloaded when missing.

    Raises SourceError (one line) when the repo is neither cached nor downloadable: the hub is
    unreachable (offline), the repo does not exist, or it is gated and no token was accepted. The
    message names the repo and the command to fetch it on a connected machine.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS, local_files_only=True))
    except (OSError, ValueError):
        pass  # not cached: try the hub
    include = " ".join(f"'{p}'" for p in ALLOW_PATTERNS)
    hint = (
        f"download it where the hub is reachable (`hf download {repo_id} --include {include} --local-dir DIR`) "
        "and pass DIR as SOURCE (or --from DIR after a preset name)"
    )
    try:
        return Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS))
    except GatedRepoError:
        raise SourceError(
            f"{repo_id}: gated repository; accept its licence on huggingface.co and set HF_TOKEN, or {hint}"
        ) from None
    except RepositoryNotFoundError:
        raise SourceError(f"{repo_id}: no such Hugging Face repository (or it is private)") from None
    except (OSError, HfHubHTTPError, ValueError) as exc:
        # LocalEntryNotFoundError (hub unreachable or HF_HUB_OFFLINE) is an OSError.
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        gate = " (gated: accept its licence and set HF_TOKEN)" if gated else ""
        raise SourceError(
            f"{repo_id}: not in the Hugging Face cache and the hub is unreachable ({reason}); {hint}{gate}"
        ) from None
