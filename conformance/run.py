"""`make conformance`: the JSON Schema Test Suite (draft 2020-12 and draft 7), the MaskBench sample and
JSONSchemaBench compliance, measured with the real Qwen tokenizer. Prints markdown tables and writes
conformance/results/conformance.json (+ .md).

    python -m conformance.run                 # everything (about 10 minutes on 2 cores)
    python -m conformance.run --quick         # a fixed small sample (seconds; what CI runs)
    python -m conformance.run --parts suite   # only some parts: suite, maskbench, compliance
    python -m conformance.run --readme        # also the summary in docs/reports/conformance.md (make conformance)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from conformance.common import REPO, machine, md_table, qwen, require_data


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def slim(report: dict) -> dict:
    """The report to save: per group/file, the compile results, case counts, and only the cases whose
    outcome is not "pass" in some configuration (with their index), so the JSON stays small."""
    outcomes = ("default", "default_final", "lenient", "lenient_final", "nonstrict", "nonstrict_final")
    out = dict(report)
    for part, key in (("suite", "groups"), ("maskbench", "files")):
        if part not in report:
            continue
        items = []
        for item in report[part][key]:
            item = dict(item)
            cases = item.pop("cases")
            item["n_cases"] = len(cases)
            item["not_pass"] = [
                {"index": i, **c} for i, c in enumerate(cases) if any(c.get(o) != "pass" for o in outcomes)
            ]
            items.append(item)
        out[part] = {**report[part], key: items}
    return out


README_BEGIN, README_END = "<!-- conformance-summary:begin -->", "<!-- conformance-summary:end -->"


def summary(report: dict) -> str:
    """The README's conformance summary (markdown): Test Suite and MaskBench totals beside llguidance's
    baseline on the same cases, and the compliance totals."""
    m, t = report["machine"], report["timings"]
    out = [
        f"`make conformance`, {m['date']}, llguidance {m['versions'].get('llguidance')}, "
        f"{t['total_s'] / 60:.1f} min on {m['cpus']} cores:"
    ]
    rows = []
    for draft, c in report.get("suite", {}).get("totals", {}).items():
        rows.append(
            [
                f"Test Suite {draft}, ours",
                c.get("cases", 0),
                c.get("pass", 0),
                c.get("fp", 0),
                c.get("fn", 0),
                c.get("refused", 0),
                c.get("error", 0),
                c.get("strict_changed", 0),
                c.get("fn_check", 0),
                c.get("final_fp", 0),
            ]
        )
        if c.get("llg_cases"):
            rows.append(
                [
                    f"Test Suite {draft}, llguidance baseline",
                    c["llg_cases"],
                    c.get("llg_pass", 0),
                    c.get("llg_fp", 0),
                    c.get("llg_fn", 0),
                    c.get("llg_refused", 0),
                    c.get("llg_error", 0),
                    "-",
                    "-",
                    "-",
                ]
            )
    if "maskbench" in report:
        c = report["maskbench"]["totals"]
        rows.append(
            [
                "MaskBench files, ours (ok = every instance right)",
                c["files"],
                c.get("ok", 0),
                c.get("fp", 0),
                f"{c.get('fn', 0)} ({c.get('fn_strict', 0)} strict)",
                c.get("refused", 0),
                c.get("error", 0),
                c.get("fn_strict", 0),
                c.get("fn_check", 0),
                c.get("final_fp", 0),
            ]
        )
        rows.append(
            [
                "MaskBench files, llguidance baseline",
                c["files"],
                c.get("llg_ok", 0),
                "",
                "",
                c.get("llg_err", 0),
                "",
                "-",
                "-",
            ]
        )
    out.append(
        md_table(
            [
                "",
                "cases",
                "pass",
                "FP",
                "FN",
                "refused",
                "error",
                "changed by strict",
                "FN the final check rejects too",
                "FP after final check",
            ],
            rows,
        )
    )
    if "compliance" in report:
        from conformance.compliance import compliance_rows

        total = compliance_rows(report["compliance"])[-1]
        s = report["compliance"]["settings"]
        out.append(
            f"JSONSchemaBench (first {s['compile_sample'] or 'all'} schemas of each subset): {total[2]:,} of "
            f"{total[1]:,} compile ({total[3]}); {total[8]} random-logit generations, {total[9]} finished, "
            f"{total[10]} valid, **{total[11]} invalid**."
        )
    return "\n\n".join(out)


def update_readme(text: str, readme: Path = REPO / "docs" / "reports" / "conformance.md") -> None:
    """Replace the block between README_BEGIN and README_END with `text`."""
    body = readme.read_text()
    head, rest = body.split(README_BEGIN, 1)
    readme.write_text(f"{head}{README_BEGIN}\n{text}\n{README_END}{rest.split(README_END, 1)[1]}")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="suite,maskbench,compliance")
    ap.add_argument("--quick", action="store_true", help="a fixed small sample of every part")
    ap.add_argument("--suite-sample", type=int, default=None, help="first N groups of each Test Suite file")
    ap.add_argument("--maskbench-sample", type=int, default=None, help="first N files of each MaskBench subset")
    ap.add_argument(
        "--compile-sample",
        type=int,
        default=200,
        help="compile the first N schemas (by file name) of each JSONSchemaBench subset (default %(default)s; 0 = all)",
    )
    ap.add_argument("--jobs", type=int, default=2, help="processes for the compile-only work (default 2)")
    ap.add_argument(
        "--gen-sample",
        type=int,
        default=6,
        help="generate for the first N compiled schemas of each subset (default 6; 0 = all)",
    )
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument(
        "--gen-validated-only",
        action="store_true",
        help="generate only for schemas with keywords enforced by validate-and-rollback",
    )
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=REPO / "conformance" / "results" / "conformance.json")
    ap.add_argument("--readme", action="store_true", help="write the summary into docs/reports/conformance.md")
    args = ap.parse_args(argv)
    if args.quick:
        args.suite_sample = args.suite_sample or 1
        args.maskbench_sample = args.maskbench_sample or 2
        args.compile_sample = 3
        args.jobs = 1
        args.gen_sample = 2
        args.generations = 1
        args.max_tokens = 96
    parts = set(args.parts.split(","))
    require_data()
    t_start = time.perf_counter()
    hf, info = qwen()
    log(f"tokenizer ready ({time.perf_counter() - t_start:.1f} s)")
    report = {"machine": machine(), "settings": vars(args) | {"out": str(args.out)}, "timings": {}}
    md = [
        f"Conformance run {report['machine']['date']} on {report['machine']['processor']} "
        f"({report['machine']['cpus']} cores), llguidance {report['machine']['versions'].get('llguidance')}, "
        f"Qwen2.5 tokenizer (151,936 logits)." + (" **Quick sample.**" if args.quick else "")
    ]

    from conformance import compliance, suite

    if "suite" in parts:
        t0 = time.perf_counter()
        res = suite.run_suite(info, hf, sample=args.suite_sample)
        rows, totals = suite.suite_rows(res)
        report["suite"] = {**res, "totals": totals}
        report["timings"]["suite_s"] = round(time.perf_counter() - t0, 1)
        md += ["### JSON Schema Test Suite (per file)", md_table(suite.SUITE_HEADER, rows)]
        log(f"suite done in {report['timings']['suite_s']} s")
    if "maskbench" in parts:
        t0 = time.perf_counter()
        res = suite.run_maskbench(info, hf, sample=args.maskbench_sample, progress=log, jobs=args.jobs)
        rows, totals = suite.maskbench_rows(res)
        report["maskbench"] = {**res, "totals": totals}
        report["timings"]["maskbench_s"] = round(time.perf_counter() - t0, 1)
        md += [
            "### MaskBench sample (per subset; a file is ok when it compiles and every test behaves)",
            md_table(suite.MASKBENCH_HEADER, rows),
        ]
        log(f"maskbench done in {report['timings']['maskbench_s']} s")
    report["false_positives"] = suite.findings(report.get("suite"), report.get("maskbench"))
    if report["false_positives"]:
        fp = [f for f in report["false_positives"] if f["config"] == "default"]
        other = len(report["false_positives"]) - len(fp)
        md += [
            f"### False positives under the defaults (invalid instance accepted by the matcher): {len(fp)} "
            f"(plus {other} under lenient / strict=False, listed in the JSON)",
            md_table(
                ["where", "group", "test", "caught by the final jsonschema check"],
                [[f["where"], f["group"], f["test"], f["caught_by_check"]] for f in fp],
            ),
        ]
    if "compliance" in parts:
        t0 = time.perf_counter()
        res = compliance.run_compliance(
            info,
            hf,
            generations=args.generations,
            gen_sample=args.gen_sample or None,
            compile_sample=args.compile_sample or None,
            max_tokens=args.max_tokens,
            progress=log,
            jobs=args.jobs,
            validated_only=args.gen_validated_only,
        )
        report["compliance"] = res
        report["timings"]["compliance_s"] = round(time.perf_counter() - t0, 1)
        s = res["settings"]
        md += [
            f"### JSONSchemaBench compliance (defaults; compiled: the first {s['compile_sample'] or 'all'} schemas of "
            f"each subset by file name; {s['generations']} random-logit generations for the first "
            f"{s['gen_sample'] or 'all'} compiled schemas of each subset, max {s['max_tokens']} tokens)",
            md_table(compliance.COMPLIANCE_HEADER, compliance.compliance_rows(res)),
        ]
        if res["failures"]:
            md += ["**Invalid outputs:**"] + [
                f"- {f['subset']}/{f['file']} seed {f['seed']}: {f['errors'][:2]}" for f in res["failures"]
            ]
        log(f"compliance done in {report['timings']['compliance_s']} s")
    report["timings"]["total_s"] = round(time.perf_counter() - t_start, 1)
    md.append(f"Total run time {report['timings']['total_s']} s ({report['timings']}).")
    text = "\n\n".join(md)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(slim(report), separators=(",", ":"), default=str))
    args.out.with_suffix(".md").write_text(text + "\n")
    log(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    if args.readme:
        update_readme(summary(report))
        log("updated the summary in docs/reports/conformance.md")
    return report


if __name__ == "__main__":
    main()
