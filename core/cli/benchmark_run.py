"""`python -m core benchmark`: every proposer, patching and edge method scored against the known circuits.

The work only: the arguments, and what the command does, are in core/cli/benchmark.py, which imports this module
when the command runs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from core.errors import HeadLabError
from core.figures.benchmark import roc_figure, score_table_figure
from core.figures.bundle import export_bundle
from core.pipelines.benchmark import BenchmarkSettings, QUICK, benchmark, known_cases
from core.pipelines.benchmark_report import HEAD_TO_HEAD, SEPARATION_MIN_GAP
from core.stats.recovery import MEASURE_LABELS, MEASURES
from core.workspace import atomic_write_bytes, atomic_write_json, check_output_folder

REPORT_JSON, REPORT_MD = "report.json", "report.md"
FIGURE_FORMATS = ("png",)
GOALS = {"activation patching": 0.99, "attribution patching": 0.95}  # head AUROC on every hand-wired model (issue 34)
VERDICT_GOAL = 0.95
RANKED_MIN_HEADS = 24  # report.md ranks the true heads and edges of models this size or larger (the hard ones)


def settings_from_args(args: argparse.Namespace) -> BenchmarkSettings:
    values = dict(QUICK) if args.quick else {}
    for flag, name in (("controls", "n_controls"), ("random_groups", "n_random_groups"), ("draws", "n_draws"),
                       ("max_examples", "max_examples")):
        if getattr(args, flag) is not None:
            values[name] = getattr(args, flag)
    if args.methods:
        values["methods"] = tuple(args.methods)
    return BenchmarkSettings(**values)


def cli_benchmark(args: argparse.Namespace) -> dict:
    if args.out is not None:
        check_output_folder(args.out, "--out")
    if args.from_report is not None:
        if args.out is None:
            raise HeadLabError("--from-report redraws a report into a folder; give it with --out FOLDER.")
        try:
            report = json.loads(Path(args.from_report).read_text())
        except (OSError, ValueError) as exc:
            raise HeadLabError(f"cannot read {args.from_report} ({type(exc).__name__}); give a report.json the "
                               "benchmark wrote.") from None
        for path in write_report(report, args.out, figures=not args.no_figures, source=args.from_report):
            print(f"wrote {path}")
        return report
    settings = settings_from_args(args)
    started = time.perf_counter()
    cases, notes = known_cases(args.models, kinds=("handwired",) if args.quick and not args.models else
                               ("handwired", "planted"), build=args.build, say=print)
    for note in notes:
        print(f"note: {note}")
    report = benchmark(cases, settings, device=args.device, dtype=args.dtype, progress=True, quick=args.quick)
    report["runtime"]["command_seconds"] = time.perf_counter() - started
    report["runtime"]["left_out"] = notes
    print(summary_text(report))
    if args.out is not None:
        for path in write_report(report, args.out, figures=not args.no_figures):
            print(f"wrote {path}")
    return report


# ---------------------------------------------------------------------------------------------
# the report's text and files


def _md(text: str) -> str:
    """Text for a Markdown table cell: its pipes escaped, so |J_ij| stays one cell."""
    return str(text).replace("|", "\\|")


def _fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cell(row: dict) -> str:
    if not row.get("n_scored"):
        return "n/a"
    text = _fmt(row["mean"])
    if row.get("low") is not None:
        text += f" [{_fmt(row['low'], 2)}, {_fmt(row['high'], 2)}]"
    return text


def _rows(report: dict, level: str, measure: str) -> dict:
    return {(r["method"], r["task"]): r for r in report["table"] if r.get("level", "head") == level
            and r["measure"] == measure}


def goals(report: dict) -> list[dict]:
    """The issue's goals, checked on this report: patching head AUROC on every hand-wired model, verdict accuracy."""
    out = []
    handwired = [r for r in report["results"] if r["case"]["kind"] == "handwired"]
    for prefix, bound in GOALS.items():
        for result in handwired:
            for entry in result["methods"]:
                if entry["method"].startswith(prefix) and entry.get("recovery"):
                    value = entry["recovery"]["roc_auc"]["value"]
                    out.append({"goal": f"{prefix} head AUROC >= {bound}", "model": result["case"]["name"],
                                "method": entry["method"], "value": value, "met": value >= bound})
    for kind in ("truth", "distractor", "random"):
        acc = report["verdicts"][kind]
        if acc["rate"] is not None:
            out.append({"goal": f"disposer right on >= {VERDICT_GOAL:.0%} of {kind} groups", "model": "all",
                        "method": "disposer", "value": acc["rate"], "met": acc["rate"] >= VERDICT_GOAL})
    return out


def summary_text(report: dict) -> str:
    """What the command prints: head ROC AUC per method and task, edge ROC AUC, the verdict accuracy."""
    lines = []
    tasks = list(dict.fromkeys(r["case"]["task"] for r in report["results"]))
    for level, methods in (("head", [m["name"] for m in report["methods"]]),
                           ("edge", [m["name"] for m in report["edge_methods"]])):
        if not methods:
            continue
        rows = _rows(report, level, "roc_auc")
        lines.append(f"{level} ROC AUC by task: " + " | ".join(tasks))
        for method in methods:
            lines.append(f"  {method:34s} " + " | ".join(_cell(rows[(method, t)]) for t in tasks))
    for kind, acc in report["verdicts"].items():
        if acc["n"]:
            rate = "" if acc["rate"] is None else f", right {acc['correct']}/{acc['n_judged']} ({acc['rate']:.0%})"
            lines.append(f"disposer on {kind} groups: {acc['verdicts']}{rate}")
    lines.append(f"runtime {report['runtime']['seconds']:.1f} s")
    return "\n".join(lines)


def separation_markdown(report: dict) -> list[str]:
    """report.md's sections of issue 43: the edges between heads, ACDC's threshold sweep, where the methods
    separate and why (why_markdown); none for a report made before them."""
    out = []
    between = [r for r in report["table"] if r.get("level") == HEAD_TO_HEAD and r.get("n_scored")]
    if between:
        tasks = list(dict.fromkeys(r["task"] for r in between))
        roc, ap = _rows(report, HEAD_TO_HEAD, "roc_auc"), _rows(report, HEAD_TO_HEAD, "average_precision")
        out += ["", "### Edges between heads", "",
                "The same scores on the edges between two heads only. A planted circuit's truth names the "
                "head-to-head edges it planted and those its confirmation measured (every edge into a circuit head "
                "path-patched alone; those scoring as much as a planted edge must), and nothing of the edges from the "
                "embeddings, through the MLPs or into the logits that its heads also use: on the full graph those "
                "count as false, so a method that ranks them high loses precision for finding real parts of the "
                "circuit. ROC AUC / PR AUC (mean over seeds [interval]):", "",
                "| method | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
        for method in report["edge_methods"]:
            cells = [f"{_cell(roc[(method['name'], t)])} / {_cell(ap[(method['name'], t)])}" for t in tasks]
            out.append(f"| {method['name']} | " + " | ".join(cells) + " |")
    sweep = report.get("acdc_sweep")
    if sweep and sweep["table"]:
        out += ["", "### ACDC's threshold sweep", "",
                f"ACDC run at each threshold of {', '.join(map(str, sweep['thresholds']))}; ROC: {sweep['curve']}. "
                "The area is the figure ACDC's paper reports (its anchors above).", "",
                "| task | edges | seeds | sweep ROC AUC [interval] |", "|---|---|---|---|"]
        out += [f"| {row['task']} | {'between heads' if row.get('level') == HEAD_TO_HEAD else 'all'} | "
                f"{row['n_scored']} | {_cell(row)} |" for row in sweep["table"]]
    if "separations" in report:
        out += ["", "## Where the methods separate", "",
                "Pairs of methods whose bootstrap intervals over a task's seeds do not overlap (the first lies "
                f"wholly above the second) and whose means differ by at least {SEPARATION_MIN_GAP}." if report["separations"] else
                "No two methods' intervals over seeds are disjoint on any task (with means at least "
                f"{SEPARATION_MIN_GAP} apart): on these models every method that scores heads or edges at all ranks "
                "the circuit the same way, within the seeds' spread.", ""]
        if report["separations"]:
            out += ["| level | task | measure | above [interval] | below [interval] |", "|---|---|---|---|---|"]
            for s in report["separations"]:
                out.append(f"| {s['level']} | {s['task']} | {s['measure']} | {s['above']} {_fmt(s['above_mean'])} "
                           f"[{_fmt(s['above_interval'][0], 2)}, {_fmt(s['above_interval'][1], 2)}] | {s['below']} "
                           f"{_fmt(s['below_mean'])} [{_fmt(s['below_interval'][0], 2)}, "
                           f"{_fmt(s['below_interval'][1], 2)}] |")
    out += why_markdown(report)
    return out


def why_markdown(report: dict, min_heads: int = RANKED_MIN_HEADS) -> list[str]:
    """Where each method puts the true heads and edges of the models of min_heads heads or more (the hard ones):
    a backup or a head on saturated attention ranked low shows in the head ranks, a method's precision in what it
    ranks above the true edges."""
    shapes = {case["name"]: case["shape"][0] * case["shape"][1] for case in report["models"]}
    measured = {case["name"]: set(case.get("measured_edges", [])) for case in report["models"]}
    heads = [r for r in report.get("true_head_ranks", []) if shapes.get(r["model"], 0) >= min_heads]
    edges = [r for r in report.get("true_edge_ranks", []) if shapes.get(r["model"], 0) >= min_heads]
    if not heads and not edges:
        return []
    out = ["", f"### Why: where each method puts the true heads and edges (models of {min_heads} heads or more)", "",
           "Rank of each true head among all heads by the method's score (1 = highest; ties share their mean rank; "
           "benchmark_report.true_head_ranks).", "", "| model | method | true head: rank |", "|---|---|---|"]
    for r in heads:
        out.append(f"| {r['model']} | {r['method']} | " + ", ".join(f"{h}: {v:g}" for h, v in r["ranks"].items())
                   + f" (of {r['n_heads']}) |")
    if edges:
        out += ["", "Rank of each true edge among all edges and among the edges between heads (* marks an edge the "
                "confirmation measured rather than planted), and the edges not in the truth scored above the lowest "
                "true one (how many, and the first by score; benchmark_report.true_edge_ranks).", "",
                "| model | method | true edge: rank of all / between heads | scored above the lowest | first of them |",
                "|---|---|---|---|---|"]
        for r in edges:
            ranks = ", ".join(f"{e}{'*' if e in measured.get(r['model'], ()) else ''}: {v:g} / "
                              f"{r['ranks_head_to_head'].get(e, float('nan')):g}" for e, v in r["ranks"].items())
            above = ", ".join(f"{e} {v:.3g}" for e, v in r["false_above"]) or "-"
            out.append(f"| {r['model']} | {r['method']} | {ranks} (of {r['n_edges']} / {r['n_head_to_head']}) | "
                       f"{r['n_false_above']} | {above} |")
    return out


def report_markdown(report: dict, figures: dict[str, str] | None = None) -> str:
    """report.md from report.json: every number is read from the report, none typed."""
    figures = figures or {}
    quick = "quick subset" if report.get("quick") else "full benchmark"
    s = report["settings"]
    out = [f"# Known-circuit benchmark ({quick})", "",
           "Generated by `python -m core benchmark --out docs/benchmark` from report.json "
           "(core/cli/benchmark.py `report_markdown`); do not edit by hand.", "",
           "Every method gives every head (or edge) a score; each score is compared with the circuit known by "
           "construction. Measures: " + "; ".join(MEASURE_LABELS[m] for m in MEASURES) + ". " + report["ties"], "",
           f"Baseline: {report['baseline']}. Interval: {report['interval']}.", "",
           f"Disposer: {report['disposer']}.", "",
           f"Settings: {s['n_controls']} controls per group, {s['n_random_groups']} random groups per model, "
           f"{'all' if s['max_examples'] is None else s['max_examples']} pairs per model, {s['n_draws']} permutation "
           f"draws.", "", "## Models", "",
           "| model | kind | task | layers x heads | true heads | true edges | ablation | distractors | pairs |",
           "|---|---|---|---|---|---|---|---|---|"]
    for case in report["models"]:
        distractors = "; ".join(", ".join(v) for v in case["distractors"].values()) or "-"
        out.append(f"| {case['name']} | {case['kind']} | {case['task']} | {case['shape'][0]} x {case['shape'][1]} | "
                   f"{', '.join(case['truth'])} | {len(case['edges'])} | {case['mode']} | {distractors} | "
                   f"{case['pairs']['n_examples']} x {case['pairs']['seq_len']} |")
    tasks = list(dict.fromkeys(r["case"]["task"] for r in report["results"]))
    out += ["", "## Head recovery", "", "ROC AUC by method and task (mean over the task's seeds [interval]); "
            "the random baseline's mean is 0.5 by construction.", "",
            "| method | score | " + " | ".join(tasks) + " |", "|---|---|" + "---|" * len(tasks)]
    rows = _rows(report, "head", "roc_auc")
    for method in report["methods"]:
        out.append(f"| {method['name']} | {_md(method['score'])} | "
                   + " | ".join(_cell(rows[(method['name'], t)]) for t in tasks) + " |")
    for measure in ("average_precision", "precision_at_k"):
        rows = _rows(report, "head", measure)
        out += ["", f"{MEASURE_LABELS[measure]} (in brackets after each value: the permutation baseline's mean).", "",
                "| method | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
        for method in report["methods"]:
            cells = []
            for t in tasks:
                row = rows[(method["name"], t)]
                cells.append(_cell(row) + ("" if not row.get("n_scored") else f" (baseline {_fmt(row['baseline_mean'])})"))
            out.append(f"| {method['name']} | " + " | ".join(cells) + " |")
    out += ["", "### Per model", "", "Head ROC AUC (permutation p) of each method on each model.", "",
            "| model | " + " | ".join(m["name"] for m in report["methods"]) + " |",
            "|---|" + "---|" * len(report["methods"])]
    reasons = {}
    for result in report["results"]:
        cells = []
        for entry in result["methods"]:
            if entry.get("recovery"):
                r = entry["recovery"]["roc_auc"]
                cells.append(f"{_fmt(r['value'])} (p {r['p']:.3g})")
            else:
                cells.append("n/a")
                reasons.setdefault(entry["method"], set()).add(entry["not_applicable"])
        out.append(f"| {result['case']['name']} | " + " | ".join(cells) + " |")
    if reasons:
        out += [""] + [f"- n/a, {method}: {'; '.join(sorted(why))}" for method, why in reasons.items()]
    notes = sorted({f"{m['method']}: {note}" for r in report["results"] for m in r["methods"] + r["edge_methods"]
                    for note in m.get("notes", [])})
    if notes:
        out += ["", "Notes of the methods:", ""] + [f"- {note}" for note in notes]
    out += ["", "## Edge recovery, beside published numbers", "",
            f"HeadLab's rows are edge ROC AUCs on the known models above; the published rows are "
            f"{report['published']['label']}: other models, other tasks, for scale.", "",
            "| source | method | task | ablation | edge ROC AUC |", "|---|---|---|---|---|"]
    rows = _rows(report, "edge", "roc_auc")
    for method in report["edge_methods"]:
        for t in tasks:
            out.append(f"| HeadLab | {method['name']} | {t} | resample | {_cell(rows[(method['name'], t)])} |")
    for p in report["published"]["rows"]:
        out.append(f"| {p['source']} (published, other model) | {p['method']} | {p['task']} | {p['ablation']} | "
                   f"{p['value']:.3f} |")
    edge_reasons = sorted({why for r in report["table"] if r.get("level") == "edge" for why in r["not_applicable"]})
    if edge_reasons:
        out += [""] + [f"- n/a: {why}" for why in edge_reasons]
    out += separation_markdown(report)
    out += ["", "## Disposer verdicts", "",
            "| groups | n | expected | verdicts (paper rule) | right |", "|---|---|---|---|---|"]
    for kind, acc in report["verdicts"].items():
        if not acc["n"]:
            continue
        verdicts = ", ".join(f"{k}: {v}" for k, v in sorted(acc["verdicts"].items()))
        right = "-" if acc["rate"] is None else f"{acc['correct']}/{acc['n_judged']} ({acc['rate']:.0%}; not tested: not judged)"
        out.append(f"| {kind} | {acc['n']} | {acc['expected'] or 'none (a proposal)'} | {verdicts} | {right} |")
    out += ["", "Per group: the target-logit delta of ablating the group, its controls' mean and sd, its rank among "
            "them (1 = most damaging) with p, z (none where the controls do not vary), the verdicts (the first reason "
            "when not a pass).", "",
            "| model | group | heads | controls | delta logit | controls | rank (p) | z logit | verdict (paper) "
            "| verdict (reference) | right | why |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for result in report["results"]:
        for d in result["disposals"]:
            logit = d["metrics"].get("target_logit", {}) if d["metrics"] else {}
            right = {True: "yes", False: "no", None: "-"}[d["correct"]]
            controls = ("-" if logit.get("control_mean") is None else
                        f"{logit['control_mean']:.3g} ± {logit['control_std']:.3g}")
            why = "" if d["verdict_paper"] == "pass" or not d["reasons"] else _md(d["reasons"][0])
            rank = ("-" if logit.get("rank") is None else
                    f"{logit['rank']} of {logit['n_controls'] + 1} ({logit['p']:.3g})")
            out.append(f"| {result['case']['name']} | {d['kind']}: {d['label']} | {', '.join(d['heads'])} | "
                       f"{d['n_controls']} {d['controls']} | {_fmt(logit.get('candidate_delta'), 3)} | {controls} | "
                       f"{rank} | {_fmt(logit.get('z'), 2)} | {d['verdict_paper']} | {d['verdict_reference']} | "
                       f"{right} | {why} |")
    out += ["", "## Goals (issue 34)", "", "| goal | model | method | value | met |", "|---|---|---|---|---|"]
    for g in goals(report):
        out.append(f"| {g['goal']} | {g['model']} | {g['method']} | {_fmt(g['value'])} | {'yes' if g['met'] else 'no'} |")
    rt = report["runtime"]
    out += ["", "## Runtime", "", f"This run: {rt['seconds']:.1f} s of benchmark"
            + (f", {rt['command_seconds']:.1f} s for the whole command" if "command_seconds" in rt else "")
            + f" on {report['provenance']['device']} ({report['provenance']['dtype']}). Items computed (not read "
            "from the cache) took, per model:", ""]
    for model, items in rt["items_seconds"].items():
        out.append(f"- {model}: {sum(items.values()):.1f} s")
    for name, extra in rt.get("other_runs", {}).items():
        out.append(f"- {name}: {extra}")
    if figures:
        out += ["", "## Figures", ""] + [f"![{name}]({path})" for name, path in figures.items()]
    versions = report["provenance"]["versions"]
    out += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".", ""]
    return "\n".join(out)


def report_figures(report: dict) -> list:
    """The report's figure bundles: the head score table and ROC curves (when heads were scored), the edge score
    table (when edges were)."""
    bundles = []
    if report.get("methods"):
        bundles += [score_table_figure(report, "roc_auc"), roc_figure(report)]
    if report.get("edge_methods"):
        bundles.insert(1 if bundles else 0, score_table_figure(report, "roc_auc", level="edge"))
    return bundles


def figure_links(bundles) -> dict[str, str]:
    """report.md's figure list: each bundle's caption (to its first ';') -> its PNG's file name."""
    return {bundle.caption.split(";")[0]: f"{bundle.name}.{FIGURE_FORMATS[0]}" for bundle in bundles}


def rendered_report(report: dict, figures: bool = True, source: Path | str = "the report") -> tuple[list, str]:
    """(figure bundles, report.md's text) of a report, made before any file is written, so a file that is not a
    benchmark report (or one edited by hand) is refused in one line and nothing in --out is replaced."""
    if not isinstance(report, dict) or "benchmark" not in report or "results" not in report:
        raise HeadLabError(f"{source} is not a benchmark report (it lacks the 'benchmark' and 'results' fields); give "
                           "the report.json that python -m core benchmark --out wrote.")
    try:
        bundles = report_figures(report) if figures else []
        return bundles, report_markdown(report, figure_links(bundles))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise HeadLabError(f"{source} is not a whole benchmark report ({type(exc).__name__} {exc} while reading it); "
                           "give the report.json that python -m core benchmark --out wrote, unedited.") from None


def write_report(report: dict, folder: Path, figures: bool = True, source: Path | str = "the report") -> list[Path]:
    """report.json, the figures (PNG and SVG, with their data as CSV/JSON) and report.md in `folder`; everything
    is rendered first, so a report that cannot be rendered leaves the folder as it was."""
    bundles, markdown = rendered_report(report, figures, source)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    json_path = folder / REPORT_JSON
    atomic_write_json(json_path, report, flat_lists=True)
    written.append(json_path)
    for bundle in bundles:
        written += export_bundle(bundle, folder, formats=FIGURE_FORMATS)
    md_path = folder / REPORT_MD
    atomic_write_bytes(md_path, markdown.encode())
    written.append(md_path)
    return written
