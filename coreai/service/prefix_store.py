"""`PrefixStore`: the prefix cache's newest entries kept on disk, so that a restarted server starts
with the KV cache of the prompts it had (an agent's long system prompt and tools, its conversation):
its first request after the restart prefills only what is new, as a later turn does.

Each entry is one mlx-lm prompt-cache file (`mlx_lm.models.cache.save_prompt_cache`: the layers'
KV arrays in safetensors, the prompt's token ids in its metadata), named `<key>-<tokens>.safetensors`:
`<key>` the model's `fingerprint` (16 hex digits), `<tokens>` a hash of the token ids.

The key (`key_parts`) is what decides the KV of a token: the weights' content (the SHA-256 of each
`model*.safetensors` file mlx-lm reads, not the folder's path), the config, the compute dtypes, the
tokenizer's files, the chat template and this store's `FORMAT`. Hashing the weights reads them
(2.2 s for the default model's 1.26 GB on these machines), so each file's digest is memoized in the
folder (`MEMO`) by its path, size, mtime, ctime and inode (0.02 s then); a file changed within
`SETTLED_NS` of being hashed is not memoized (a rewrite in the same clock tick could keep its times).
Each file's metadata holds the key's parts, checked on load: a file whose parts differ (another
model's, copied or renamed) is foreign.

Files are written whole or not at all: to `.tmp-<pid>-<nonce>-<name>` in the same folder, synced, then
renamed into place; a write that fails leaves the file kept before, and leftover temporary files of
processes gone are removed at start. A file that cannot be read (truncated, corrupt) or is foreign
is skipped with one warning naming it and why; the server starts regardless.

`keep` writes the newest entries when the service stops (not while it serves: writing hundreds of MB
would stall the batch); `restore` reads them back into the prefix cache at start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import LRUPromptCache, load_prompt_cache, save_prompt_cache

log = logging.getLogger("coreai.service")

FORMAT = "2"  # this store's file layout and metadata; a file of another format is foreign
SUFFIX = ".safetensors"
TEMP = ".tmp-"  # `.tmp-<pid>-<nonce>-<name>`: a file being written, renamed into place once whole
MEMO = "weights-sha256.json"  # the weight files' digests, by path and stat (`weights_sha256`)
SETTLED_NS = 2_000_000_000  # a weight file changed less than this before it is hashed is not memoized
WEIGHTS = "model*.safetensors"  # the files mlx-lm's `load_model` reads the weights from
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


class ForeignFile(Exception):
    """A prompt-cache file whose metadata names another key (model, tokenizer, template, format)."""


class MalformedFile(Exception):
    """A prompt-cache file that loads but lacks what this store writes (its metadata, its token ids)."""


def sha256_file(path: Path) -> str:
    """The SHA-256 (hex) of the bytes of `path`, read in 4 MB blocks. Raises OSError."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def weights_sha256(folder: Path, memo_folder: Path | None = None) -> str:
    """The SHA-256 (hex) of the weight files of the model folder `folder` (`WEIGHTS`, by name and
    content). With `memo_folder`, each file's digest is memoized in `memo_folder / MEMO` by its
    resolved path and (size, mtime_ns, ctime_ns, inode), and read from there while those agree; a
    damaged memo is ignored; a memo that cannot be written is not kept. Raises OSError for an
    unreadable weight file."""
    memo_path = memo_folder / MEMO if memo_folder is not None else None
    memo: dict[str, Any] = {}
    if memo_path is not None and memo_path.is_file():
        try:
            memo = json.loads(memo_path.read_text())
            memo = memo if isinstance(memo, dict) else {}
        except (OSError, ValueError):
            memo = {}
    parts, changed = [], False
    for path in sorted(folder.glob(WEIGHTS)):
        real = path.resolve()
        st = real.stat()
        seen = memo.get(str(real))
        if isinstance(seen, dict) and seen.get("stat") == _stat_key(st) and isinstance(seen.get("sha256"), str):
            digest = seen["sha256"]
        else:
            digest = sha256_file(real)
            after = real.stat()
            if _stat_key(after) == _stat_key(st) and time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > SETTLED_NS:
                memo[str(real)] = {"stat": _stat_key(st), "sha256": digest}
                changed = True
        parts.append([path.name, digest])
    if changed and memo_path is not None:
        memo = {k: v for k, v in memo.items() if os.path.exists(k)}  # files gone are forgotten
        try:
            memo_path.parent.mkdir(parents=True, exist_ok=True)
            temp = memo_path.with_name(_temp_name(MEMO))
            temp.write_text(json.dumps(memo, indent=1))
            os.replace(temp, memo_path)
        except OSError as exc:
            log.info("prefix cache: the weights' digests not memoized in %s: %s", memo_path, exc)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def key_parts(model, memo_folder: Path | None = None) -> dict[str, str]:
    """What the KV cache of a token depends on, each part a string (most a SHA-256): the store's
    `FORMAT`, the weights' content (`weights_sha256`, memoized in `memo_folder`), the config, the
    compute dtypes of the parameters, the tokenizer's files in the model folder and the chat template.
    Raises OSError for an unreadable weight or tokenizer file."""
    folder = Path(model.path)
    weights: list[tuple[str, Any]] = tree_flatten(model.network.parameters())  # type: ignore[assignment]
    tokenizer = hashlib.sha256()
    for name in TOKENIZER_FILES:
        if (folder / name).is_file():
            tokenizer.update(f"{name}\0{sha256_file(folder / name)}\0".encode())
    template = getattr(getattr(model.tokenizer, "hf", None), "chat_template", None)
    return {
        "format": FORMAT,
        "weights": weights_sha256(folder, memo_folder),
        "config": _sha256_text(json.dumps(model.config, sort_keys=True, default=str)),
        "dtype": ",".join(sorted({str(v.dtype) for _, v in weights})),
        "tokenizer": tokenizer.hexdigest(),
        "template": _sha256_text(json.dumps(template, sort_keys=True)),
    }


def fingerprint(parts: dict[str, str]) -> str:
    """A short hash (16 hex digits) of the key's `parts` (`key_parts`): the files' name prefix."""
    return _sha256_text(json.dumps(parts, sort_keys=True))[:16]


class KeptPromptCache(LRUPromptCache):
    """mlx-lm's `LRUPromptCache` that remembers the token ids of its newest insertions (at most
    `newest`), for `PrefixStore.keep`."""

    def __init__(self, max_bytes: int, newest: int = 4):
        super().__init__(max_size=1 << 30, max_bytes=max_bytes)  # bounded by bytes only
        self.newest: deque[tuple[Any, tuple[int, ...]]] = deque(maxlen=newest)

    def insert_cache(self, model, tokens, prompt_cache, *, cache_type: str = "assistant"):
        super().insert_cache(model, tokens, prompt_cache, cache_type=cache_type)
        key = (model, tuple(tokens))
        if key in self.newest:
            self.newest.remove(key)
        self.newest.append(key)


def _temp_name(name: str) -> str:
    """The name of a temporary file for `name`: this process's, unique to this call."""
    return f"{TEMP}{os.getpid()}-{os.urandom(4).hex()}-{name}"


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process, or no such call: alive for all we know
        return False
    return False


class PrefixStore:
    """The folder `folder` of prompt-cache files for the model whose key is `parts` (`key_parts`); at
    most `max_bytes` of KV arrays are written (the newest entries first). Temporary files left by
    processes gone are removed here."""

    def __init__(self, folder: str | Path, parts: dict[str, str], max_bytes: int):
        self.folder, self.parts, self.max_bytes = Path(folder), dict(parts), max_bytes
        self.model_key = fingerprint(self.parts)
        for temp in self.folder.glob(f"{TEMP}*"):
            pid = temp.name[len(TEMP) :].split("-", 1)[0]
            if pid.isdigit() and _process_gone(int(pid)):
                with contextlib.suppress(OSError):
                    temp.unlink()

    def files(self) -> list[Path]:
        """This model's files in the folder, oldest first (by mtime)."""
        stamped = []
        for path in self.folder.glob(f"{self.model_key}-*{SUFFIX}"):
            with contextlib.suppress(OSError):  # gone meanwhile
                stamped.append((path.stat().st_mtime_ns, path))
        return [path for _, path in sorted(stamped)]

    def read(self, path: Path) -> tuple[list[int], list]:
        """The token ids and KV layers of the file `path`, evaluated on this thread (MLX streams are
        per thread). Raises ForeignFile when its metadata names another key, MalformedFile when it
        lacks the store's metadata, any other exception when it cannot be read (MLX raises
        RuntimeError for a truncated or corrupt file)."""
        layers, metadata = load_prompt_cache(str(path), return_metadata=True)
        if not isinstance(metadata, dict):
            raise MalformedFile("no metadata")
        differ = [name for name, value in self.parts.items() if metadata.get(name) != value]
        if differ:
            raise ForeignFile(f"its {', '.join(differ)} differ{'s' if len(differ) == 1 else ''} from this model's")
        tokens = json.loads(metadata["tokens"])
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise MalformedFile("its tokens are not a list of ids")
        mx.eval([c.state for c in layers])
        return tokens, layers

    def restore(self, cache: LRUPromptCache, key: Any) -> int:
        """Insert the kept entries into `cache` under `key` (oldest first, so the newest stays most
        recent). Returns the prompt tokens restored; a file that cannot be read or is foreign is
        skipped with one warning naming it and why."""
        restored = 0
        for path in self.files():
            try:
                tokens, layers = self.read(path)
            except ForeignFile as exc:
                log.warning("prefix cache file %s skipped, foreign: %s", path, exc)
                continue
            except Exception as exc:  # truncated, corrupt: whatever MLX or mlx-lm raise for it
                log.warning("prefix cache file %s skipped, unreadable: %s: %s", path, type(exc).__name__, exc)
                continue
            cache.insert_cache(key, tokens, layers)
            restored += len(tokens)
        if restored:
            log.info("prefix cache: %d prompt tokens restored from %s", restored, self.folder)
        return restored

    def write(self, path: Path, layers: list, tokens: list[int]) -> None:
        """Write one entry to `path` whole or not at all: to a temporary file in the same folder,
        synced, then renamed over `path`. Raises what the write raises (OSError for a full disk);
        the temporary file is then removed and `path` left as it was."""
        temp = path.with_name(_temp_name(path.name))
        try:
            save_prompt_cache(str(temp), layers, {**self.parts, "tokens": json.dumps(tokens)})
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        with contextlib.suppress(OSError):  # the rename itself made durable, where the system allows
            fd = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def keep(self, cache: KeptPromptCache) -> int:
        """Write `cache`'s newest entries (newest first, none that is a prefix of one written, at most
        `max_bytes`), replacing the files kept before; if one cannot be written (a warning names it),
        the files kept before stay. Returns the files written."""
        chosen: list[tuple[tuple[int, ...], list]] = []
        total = 0
        for key, tokens in reversed(cache.newest):
            if any(held[: len(tokens)] == tokens for held, _ in chosen):
                continue
            layers, rest = cache.fetch_nearest_cache(key, list(tokens))
            if layers is None:
                continue
            size = sum(c.nbytes for c in layers)
            if total + size > self.max_bytes:
                break
            chosen.append((tokens[: len(tokens) - len(rest)], layers))
            total += size
        written, failed = [], False
        for held, layers in reversed(chosen):  # the newest written last: restored last, most recent
            name = hashlib.sha256(json.dumps(held).encode()).hexdigest()[:16]
            path = self.folder / f"{self.model_key}-{name}{SUFFIX}"
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                self.write(path, layers, list(held))
            except Exception as exc:
                log.warning("prefix cache file %s not written: %s: %s", path, type(exc).__name__, exc)
                failed = True
                continue
            written.append(path)
        if not failed:
            for old in self.files():
                if old not in written:
                    with contextlib.suppress(OSError):
                        old.unlink()
        log.info("prefix cache: %d entries (%d bytes) kept in %s", len(written), total, self.folder)
        return len(written)
