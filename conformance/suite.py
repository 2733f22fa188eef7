"""JSON Schema Test Suite and MaskBench conformance: compile each schema (defaults, lenient, and
strict=False to see what our strict default changes), feed every test instance through the matcher
as the Qwen tokenizer tokenizes its compact serialization, and compare with the expected validity
and with llguidance's own baselines on the same cases."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

from conformance.common import (
    BASELINES,
    DRAFT_URI,
    MASKBENCH,
    SUITE,
    accepts,
    bundle_remotes,
    compile_status,
    serialize,
    tokenize,
    validates,
)

CONFIGS = {"default": {}, "lenient": {"lenient": True}, "nonstrict": {"strict": False}}
LLG_MAP = {
    "pass": "pass",
    "false_positive": "fp",
    "false_negative": "fn",
    "skip_compile": "refused",
    "compile_error_valid": "error",
    "compile_error_all_invalid": "error",
}


def suite_files(drafts=("draft2020-12", "draft7")):
    """[(draft, file key as in the baselines e.g. "allOf" / "optional/format/date", path)], sorted."""
    out = []
    for draft in drafts:
        root = SUITE / "tests" / draft
        for path in sorted(root.rglob("*.json")):
            out.append((draft, str(path.relative_to(root).with_suffix("")), path))
    return out


def _outcome(status: str, accepted: bool | None, valid: bool) -> str:
    if status == "unsatisfiable":  # refusing a schema no value satisfies rejects every instance
        return "fn" if valid else "pass"
    if status != "compiled":
        return status  # refused / error
    if accepted == valid:
        return "pass"
    return "fp" if accepted else "fn"


def run_case_group(schema, tests, info, hf, draft: str | None = None, full_nonstrict: bool = True) -> dict:
    """Compile `schema` under each config and judge each test {"data", "valid"}.

    Returns {"compile": {config: [status, detail, seconds]}, "remotes": n,
             "cases": [{"valid", config: outcome, config + "_final": outcome after the jsonschema check}]}.
    outcome: pass / fp / fn / refused / error. "_final" counts an accepted instance that `jsonschema`
    rejects as rejected (what `ConstrainedSession` reports: valid=False), so a final fp is a real path
    to invalid output.
    """
    remotes = 0
    if draft is not None:
        schema, remotes = bundle_remotes(schema, draft)
        if isinstance(schema, dict) and "$schema" not in schema:
            schema = {"$schema": DRAFT_URI[draft], **schema}
    compiled, comp = {}, {}
    texts = [serialize(t["data"]) for t in tests]
    token_lists = [tokenize(hf, info, text)[0] for text in texts]

    def compile_config(name):
        status, detail, grammar, seconds = compile_status(schema, info, **CONFIGS[name])
        comp[name] = [status, detail, round(seconds, 5)]
        compiled[name] = grammar

    compile_config("default")
    verdicts = {"default": [accepts(compiled["default"], t) if compiled["default"] else None for t in token_lists]}
    # Lenient only differs from the default when the default refuses (no keyword left unenforced,
    # the same grammar); strict=False only matters where the default rejects an instance.
    if comp["default"][0] == "compiled":
        comp["lenient"], compiled["lenient"], verdicts["lenient"] = (
            comp["default"],
            compiled["default"],
            verdicts["default"],
        )
    else:
        compile_config("lenient")
        verdicts["lenient"] = [accepts(compiled["lenient"], t) if compiled["lenient"] else None for t in token_lists]
    # full_nonstrict=False (MaskBench, for time): only where a valid instance is rejected, so an invalid
    # instance that strict mode happens to reject is not counted as "changed by strict" there.
    rejected = [not v for v, t in zip(verdicts["default"], tests, strict=False) if full_nonstrict or t["valid"]]
    if comp["default"][0] == "compiled" and not any(rejected):
        comp["nonstrict"], verdicts["nonstrict"] = comp["default"], verdicts["default"]
    else:
        compile_config("nonstrict")
        verdicts["nonstrict"] = [
            accepts(compiled["nonstrict"], t) if compiled["nonstrict"] else None for t in token_lists
        ]
    cases = []
    for i, test in enumerate(tests):
        valid = bool(test["valid"])
        case = {"valid": valid}
        for name in CONFIGS:
            accepted = verdicts[name][i]
            case[name] = _outcome(comp[name][0], accepted, valid)
            final = validates(test["data"], schema) if accepted else accepted
            case[name + "_final"] = _outcome(comp[name][0], final, valid)
        # A valid instance our final check rejects (e.g. a leap second: jsonschema's RFC 3339 check refuses
        # it) can never be a valid=True output, so the grammar rejecting it is by design.
        case["check_rejects"] = case["default"] == "fn" and not validates(test["data"], schema)
        cases.append(case)
    return {"compile": comp, "remotes": remotes, "cases": cases}


def run_suite(info, hf, sample: int | None = None, drafts=("draft2020-12", "draft7")) -> dict:
    """Every group of every Test Suite file (or, with `sample`, the first `sample` groups of each file)."""
    baselines = json.loads((BASELINES / "expected_json_schema_test_suite.json").read_text())
    results = []
    for draft, key, path in suite_files(drafts):
        groups = json.loads(path.read_text())
        base = baselines.get(draft, {}).get(key.replace("optional/format/", "optional/format/"), {})
        for group in groups[:sample] if sample else groups:
            r = run_case_group(group["schema"], group["tests"], info, hf, draft)
            base_group = base.get(group["description"], {})
            for test, case in zip(group["tests"], r["cases"], strict=False):
                case["description"] = test["description"]
                llg = base_group.get(test["description"])
                case["llguidance"] = LLG_MAP.get(llg) if llg else None
            results.append({"draft": draft, "file": key, "group": group["description"], **r})
    return {"groups": results}


def suite_rows(results: dict) -> tuple[list[list], dict]:
    """Per-file rows and totals (per draft) for the markdown table."""
    per = defaultdict(Counter)
    for g in results["groups"]:
        c = per[(g["draft"], g["file"])]
        for case in g["cases"]:
            c["cases"] += 1
            c[case["default"]] += 1
            c["lenient_" + case["lenient_final"]] += 1
            c["lenient_matcher_fp"] += case["lenient"] == "fp"
            c["final_fp"] += case["default_final"] == "fp"
            c["strict_changed"] += case["default"] != case["nonstrict"]
            c["fn_check"] += case.get("check_rejects", False)
            if case.get("llguidance"):
                c["llg_cases"] += 1
                c["llg_" + case["llguidance"]] += 1
    totals = defaultdict(Counter)
    rows = []
    for (draft, key), c in per.items():
        totals[draft].update(c)
        rows.append([draft, key, *_cols(c)])
    for draft, c in totals.items():
        rows.append([f"**{draft}**", "**total**", *_cols(c)])
    return rows, {d: dict(c) for d, c in totals.items()}


SUITE_HEADER = [
    "draft",
    "file",
    "cases",
    "pass",
    "FP",
    "FN",
    "refused",
    "error",
    "changed by strict",
    "FN the final check rejects too",
    "FP after check",
    "lenient pass",
    "lenient FP (matcher)",
    "lenient FP after check",
    "llg pass",
    "llg FP",
    "llg FN",
    "llg refused",
    "llg error",
]


def _cols(c: Counter) -> list:
    llg = [c["llg_pass"], c["llg_fp"], c["llg_fn"], c["llg_refused"], c["llg_error"]] if c["llg_cases"] else ["-"] * 5
    return [
        c["cases"],
        c["pass"],
        c["fp"],
        c["fn"],
        c["refused"],
        c["error"],
        c["strict_changed"],
        c["fn_check"],
        c["final_fp"],
        c["lenient_pass"],
        c["lenient_matcher_fp"],
        c["lenient_fp"],
        *llg,
    ]


# -- MaskBench ---------------------------------------------------------------------------------------


def maskbench_subset(name: str) -> str:
    if "---" in name:
        return name.split("---")[0]
    return name.rsplit("_", 1)[0]


def maskbench_files(sample: int | None = None):
    files = sorted(p for p in MASKBENCH.rglob("*.json"))
    if sample:  # the first `sample` files of each subset
        seen = Counter()
        kept = []
        for p in files:
            sub = maskbench_subset(p.name)
            if seen[sub] < sample:
                kept.append(p)
                seen[sub] += 1
        files = kept
    return files


_worker_state: dict = {}


def _maskbench_one(path):
    info, hf, baselines = _worker_state["info"], _worker_state["hf"], _worker_state["baselines"]
    case = json.loads(path.read_text())
    r = run_case_group(case["schema"], case.get("tests", []), info, hf, full_nonstrict=False)
    base = baselines.get(path.name)
    llg = None if base is None else ("ok" if not base else "err" if "json_error" in base else "verr")
    return {"file": path.name, "subset": maskbench_subset(path.name), "llguidance": llg, **r}


def parallel_map(fn, items, jobs: int, progress=None, label: str = ""):
    """`[fn(x) for x in items]`, in `jobs` forked processes when jobs > 1 (order kept). The workers
    inherit the parent's tokenizer and engine state through fork (`_worker_state`)."""
    import multiprocessing as mp

    out = []
    if jobs <= 1:
        it = map(fn, items)
        pool = None
    else:
        pool = mp.get_context("fork").Pool(jobs)
        it = pool.imap(fn, items, chunksize=4)
    try:
        for i, r in enumerate(it):
            out.append(r)
            if progress and i and i % 500 == 0:
                progress(f"{label} {i}/{len(items)}")
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return out


def run_maskbench(info, hf, sample: int | None = None, progress=None, jobs: int = 1) -> dict:
    _worker_state.update(info=info, hf=hf, baselines=json.loads((BASELINES / "expected_maskbench.json").read_text()))
    files = maskbench_files(sample)
    return {"files": parallel_map(_maskbench_one, files, jobs, progress, "maskbench")}


def _file_verdict(f: dict, config: str, final: bool = False) -> str:
    status = f["compile"][config][0]
    if status not in ("compiled", "unsatisfiable"):  # unsatisfiable: judged by its cases (all invalid: ok)
        return status
    outs = [c[config + ("_final" if final else "")] for c in f["cases"]]
    return "ok" if all(o == "pass" for o in outs) else "verr"


def maskbench_rows(results: dict) -> tuple[list[list], dict]:
    per = defaultdict(Counter)
    for f in results["files"]:
        c = per[f["subset"]]
        c["files"] += 1
        c[_file_verdict(f, "default")] += 1
        c["lenient_" + _file_verdict(f, "lenient", final=True)] += 1
        c["nonstrict_" + _file_verdict(f, "nonstrict")] += 1
        for case in f["cases"]:
            c["fp"] += case["default"] == "fp"
            c["fn"] += case["default"] == "fn"
            c["final_fp"] += case["default_final"] == "fp"
            c["fn_strict"] += case["default"] == "fn" and case["nonstrict"] == "pass"
            c["fn_check"] += case.get("check_rejects", False)
            c["lenient_matcher_fp"] += case["lenient"] == "fp"
        c["llg_" + (f["llguidance"] or "none")] += 1
    rows, total = [], Counter()
    for sub in sorted(per):
        total.update(per[sub])
        rows.append([sub, *_mb_cols(per[sub])])
    rows.append(["**total**", *_mb_cols(total)])
    return rows, dict(total)


MASKBENCH_HEADER = [
    "subset",
    "files",
    "ok",
    "refused",
    "error",
    "wrong verdict",
    "FP",
    "FN",
    "FN from strict",
    "FN the final check rejects too",
    "FP after check",
    "strict=False ok",
    "lenient ok",
    "lenient FP (matcher)",
    "llg ok",
    "llg refused",
    "llg wrong verdict",
]


def _mb_cols(c: Counter) -> list:
    return [
        c["files"],
        c["ok"],
        c["refused"],
        c["error"],
        c["verr"],
        c["fp"],
        c["fn"],
        c["fn_strict"],
        c["fn_check"],
        c["final_fp"],
        c["nonstrict_ok"],
        c["lenient_ok"],
        c["lenient_matcher_fp"],
        c["llg_ok"],
        c["llg_err"],
        c["llg_verr"],
    ]


def findings(suite: dict | None, maskbench: dict | None) -> list[dict]:
    """Every false positive (an invalid instance the matcher accepts) under defaults or lenient, with
    whether the final jsonschema check catches it."""
    out = []
    for g in (suite or {}).get("groups", []):
        for case in g["cases"]:
            for cfg in ("default", "lenient", "nonstrict"):
                if case[cfg] == "fp":
                    out.append(
                        {
                            "where": f"{g['draft']}/{g['file']}",
                            "group": g["group"],
                            "test": case["description"],
                            "config": cfg,
                            "caught_by_check": case[cfg + "_final"] != "fp",
                        }
                    )
    for f in (maskbench or {}).get("files", []):
        for i, case in enumerate(f["cases"]):
            for cfg in ("default", "lenient", "nonstrict"):
                if case[cfg] == "fp":
                    out.append(
                        {
                            "where": f"maskbench/{f['file']}",
                            "group": "",
                            "test": f"tests[{i}]",
                            "config": cfg,
                            "caught_by_check": case[cfg + "_final"] != "fp",
                        }
                    )
    return out
