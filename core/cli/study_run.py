"""`python -m core study MODEL --task induction|ioi [--quick] [--out DIR]`: a real model's circuit report.

The work only: the arguments, and what the command does, are in core/cli/study.py, which imports this module
when the command runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from core.errors import HeadLabError
from core.executor import StageBars
from core.figures.bundle import export_bundle
from core.figures.study import study_figures
from core.model.refs import ModelRef
from core.pipelines.study import run_study, study_settings
from core.workspace import atomic_write_bytes, atomic_write_json, check_output_file

REPORT_JSON, REPORT_MD = "report.json", "report.md"
MIB_SOURCE = ("MIB's print_results.py `area_under_curve`: trapezoids over the edge fractions, x divided by its last "
              "value (1.0), from the first fraction to the last; HeadLab's curve_areas computes the same")


def check_out_folder(folder: Path) -> None:
    """Refuse, before any work, an --out that is a file or sits under one, or is not writable."""
    for path in (folder, *folder.parents):
        if path.exists():
            if not path.is_dir():
                raise HeadLabError(f"--out {folder}: {path} is a file, not a folder; choose a folder path.")
            break
    check_output_file(folder / REPORT_JSON, "--out")


def cli_study(args: argparse.Namespace) -> dict:
    settings = study_settings(args.task, args.quick, args.n, args.seed, args.allow_small_gap)
    if args.out is not None:
        check_out_folder(Path(args.out))
    with StageBars(lambda stage: f"study: {stage}") as progress:
        report = run_study(ModelRef.parse(args.model), settings, args.revision, args.device, args.dtype, progress,
                           tuple(name.strip() for name in args.skip.split(",") if name.strip()))
    for line in summary_lines(report):
        print(line)
    if args.out is not None:
        for path in write_report(report, Path(args.out), figures=not args.no_figures):
            print(f"wrote {path}")
    return report


def write_report(report: dict, folder: Path, figures: bool = True) -> list[Path]:
    """report.json, the figures (PNG with their data as CSV/JSON) and report.md in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / REPORT_JSON, report)
    written, shown = [folder / REPORT_JSON], {}
    if figures:
        for bundle in study_figures(report):
            written += export_bundle(bundle, folder, formats=("png",))
            shown[bundle.caption] = f"{bundle.name}.png"
    atomic_write_bytes(folder / REPORT_MD, report_markdown(report, shown).encode())
    return written + [folder / REPORT_MD]


def summary_lines(report: dict) -> list[str]:
    lines = [f"{report['model']} {report['revision']}: study --task {report['task']}"
             f"{' --quick' if report['settings']['quick'] else ''}, {report['wall_seconds']:.0f} s wall"]
    if report.get("note"):
        lines.append(f"note: {report['note']}")
    if "induction" in report:
        ind = report["induction"]
        for task in ("induction", "induction-repeat"):
            s = ind[f"screen_{task}"]
            lines.append(f"{task} probe: induction heads {', '.join(s['candidate_circuit']) or 'none'}; previous-token "
                         f"{', '.join(s['previous_token_circuit']) or 'none'}")
        a = ind["ablation"]
        loss = a["summary"]["metrics"].get("loss", {})
        lines.append(f"candidate {', '.join(ind['candidate'])} on the repeat probe: loss {a['loss_clean']:.3f} -> "
                     f"{a['loss_ablated']:.3f}; rank {loss.get('rank')} p {loss.get('p')}; verdicts "
                     + ", ".join(f"{k}: {v['label']}" for k, v in a["summary"]["verdicts"].items()))
    if "ioi" in report:
        ioi = report["ioi"]
        ld = ioi["logit_diff"]
        lines.append(f"logit difference {ld['clean_mean']:.3f} (IO beats S in {100 * ld['share_io_beats_s']:.1f}% of "
                     f"{ld['n']} pairs); ABC prompts {ld['corrupted_mean']:.3f}")
        lines.append("top heads (activation patching): " + ", ".join(f"{h} {v:.3f}" for h, v, _ in
                                                                      ioi["patching"]["top_heads"][:6]))
        for method in ("eap", "eap-ig"):
            c = ioi.get(f"edges_{method}", {}).get("curve")
            if c:
                lines.append(f"{method}: CPR {c['cpr']:.3f}, CMD {c['cmd']:.3f}")
        if "random_edges" in ioi:
            lines.append(f"random edges: CPR {ioi['random_edges']['cpr']:.3f}, CMD {ioi['random_edges']['cmd']:.3f}")
        if "stability" in ioi:
            lines.append(f"stability: top-{ioi['stability']['k']} Jaccard {ioi['stability']['mean_pairwise_jaccard']:.3f}")
    return lines


def _heads(names: list) -> str:
    return ", ".join(names) if names else "none"


def _f(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def induction_markdown(report: dict) -> list[str]:
    ind = report["induction"]
    out = ["## Induction", "", "| probe | induction heads (membership) | previous-token heads | threshold |",
           "|---|---|---|---|"]
    for task in ("induction", "induction-repeat"):
        s = ind[f"screen_{task}"]
        out.append(f"| {task} | {_heads(s['candidate_circuit'])} | {_heads(s['previous_token_circuit'])} | "
                   f"{s['induction_threshold']:.3g}x |")
    a = ind["ablation"]
    loss = a["summary"]["metrics"].get("loss", {})
    out += ["", f"Candidate (the one-shot probe's induction heads): {_heads(ind['candidate'])}. Zero-ablated on the "
            f"repeated-sequence probe against {a['summary']['n_controls']} {a['controls']} random head groups:", "",
            "| repeat loss, full model | with the candidate ablated | controls' mean delta | rank | p | z |",
            "|---|---|---|---|---|---|",
            f"| {_f(a['loss_clean'])} | {_f(a['loss_ablated'])} | {_f(loss.get('control_mean'))} | {loss.get('rank')} "
            f"| {_f(loss.get('p'))} | {_f(loss.get('z'), 2)} |", ""]
    out += [f"- verdict **{k}**: {v['label']} ({v['rule']})" for k, v in a["summary"]["verdicts"].items()]
    if a.get("note"):
        out.append(f"- note: {a['note']}")
    g = ind["groups"]
    out += ["", f"Per KV group ({g['heads_per_group']} query heads share one key/value head):", "",
            "| role | groups holding it | groups where every head has it | heads |", "|---|---|---|---|"]
    out += [f"| {role} | {v['groups_with_role']} | {v['groups_all_heads']} | {v['heads']} |"
            for role, v in g["summary"].items()]
    out += ["", "| layer | group | heads | roles |", "|---|---|---|---|"]
    out += [f"| {r['layer']} | {r['group']} | {', '.join(map(str, r['heads']))} | "
            f"{', '.join(c or '-' for c in r['classes'])} |" for r in g["kv_groups"]]
    out += ["", "Per layer: " + "; ".join(f"L{r['layer']} induction {r['induction']}, previous-token "
                                          f"{r['previous-token']}" for r in g["per_layer"]), ""]
    return out


def ioi_markdown(report: dict) -> list[str]:
    ioi = report["ioi"]
    ld, p = ioi["logit_diff"], ioi["patching"]
    out = ["## IOI", "", f"{ioi['pairs']['n']} pairs over {len(ioi['pairs']['templates'])} templates and "
           f"{ioi['pairs']['names']} one-token names; counterfactual: {ioi['pairs']['corruption']} (three other names).",
           "", f"- full model's logit difference logit[IO] - logit[S]: mean **{ld['clean_mean']:.3f}** (sd "
           f"{_f(ld['clean_sd'])}), IO beats S in **{100 * ld['share_io_beats_s']:.1f}%** of pairs; on the ABC prompts "
           f"{ld['corrupted_mean']:.3f}.",
           f"- attribution patching over every head, then activation patching of its top {report['settings']['top_k_heads']}"
           f" (Spearman {_f(p['spearman'])} over those): " + ", ".join(
               f"{h} {v:.3f}{'' if exact else ' (estimate)'}" for h, v, exact in p["top_heads"][:8]), "",
           "### Edges and MIB faithfulness", "",
           "| method | edges | CPR (higher better) | CMD (lower better) | faithfulness at 0.1% / 1% / 10% |",
           "|---|---|---|---|---|"]
    for name, record in (("EAP", ioi.get("edges_eap", {}).get("curve")),
                         ("EAP-IG", ioi.get("edges_eap-ig", {}).get("curve")), ("random edges", ioi.get("random_edges"))):
        if record:
            f = dict(zip(record["fractions"], record["faithfulness"]))
            out.append(f"| {name} | {record['n_edges_kept'][-1]} | {record['cpr']:.3f} | {record['cmd']:.3f} | "
                       f"{_f(f.get(0.001))} / {_f(f.get(0.01))} / {_f(f.get(0.1))} |")
    out += ["", f"Areas: {MIB_SOURCE}.", ""]
    mib = ioi.get("mib_context")
    if mib:
        cpr, rnd = mib["eap_ig_inputs_cpr"], mib["random_cpr"]
        out += [f"Context, other models: MIB's IOI figures for {mib['models']}: EAP-IG-inputs CPR {cpr['gpt2-small']:.2f}"
                f" / {cpr['qwen2.5-0.5b']:.2f}, random-edge CPR {rnd['gpt2-small']:.2f} / {rnd['qwen2.5-0.5b']:.2f}. "
                f"Status: {mib['status']}.", ""]
    c = ioi.get("edges_eap-ig", {}).get("controls")
    if c:
        s = c["stats"]
        out.append(f"Disposer: EAP-IG's discovered set ({len(ioi['edges_eap-ig']['discovered'])} edges, heads "
                   f"{_heads(ioi['edges_eap-ig']['heads'])}) has faithfulness {c['faithfulness']:.3f} against "
                   f"{s['n_controls']} matched-random edge sets ({s['control_mean']:.3f} +- {s['control_std']:.3f}): "
                   f"rank {s['rank']}, p {s['p']:.3g}: **{c['verdict']}**.")
    st = ioi.get("stability")
    if st:
        out += ["", f"Stability: EAP's top-{st['k']} edge set over {st['resamples']} bootstrap resamples of the pairs: "
                f"mean pairwise Jaccard **{st['mean_pairwise_jaccard']:.3f}**."]
    r = ioi.get("roles")
    if not r:
        return out + [""]
    out += ["", "### Head roles (Wang et al. 2022)", ""]
    t = r["thresholds"]
    out.append(f"Rules: name mover = END attends to IO >= {t['attention']}, direct effect >= {t['effect_share']} of the "
               f"logit difference, OV copies >= {t['copy']} of names into its top-{t['copy_top_k']}; negative name "
               f"mover = the same with the effect <= -{t['effect_share']}; S-inhibition = END attends to S2 >= "
               f"{t['attention']} with a smaller direct effect; induction / duplicate-token (at S2, to S1+1 / S1) and "
               f"previous-token (at S1+1, to S1) >= {t['pattern']}.")
    out += ["", "| head | role | attn END->IO | END->S2 | S2->S1 | S2->S1+1 | S1+1->S1 | direct effect | copy | "
            "negative copy |", "|---|---|---|---|---|---|---|---|---|---|"]
    measured = bool(np.any(np.asarray(r["direct_effect"])))  # all zero: not measured on this model (a note says why)
    out += [f"| {row['head']} | {row['role']} | {row['attn_io']:.2f} | {row['attn_s2']:.2f} | {row['attn_duplicate']:.2f}"
            f" | {row['attn_induction']:.2f} | {row['attn_previous']:.2f} | "
            f"{format(row['direct_effect'], '+.3f') if measured else 'not measured'} | "
            f"{row['copy_score']:.2f} | {_f(row.get('neg_copy_score'), 2)} |" for row in r["table"]]
    out += [f"- note: {n}" for n in r["notes"]]
    if r.get("copy_input"):
        out.append(f"- copy score input: {r['copy_input']}.")
    copy = np.asarray(r["copy_score"])
    best = np.unravel_index(int(np.argmax(copy)), copy.shape)
    out.append(f"- the largest copy score is {copy[best]:.2f} (L{best[0]}H{best[1]}); {int((copy >= t['copy']).sum())} "
               f"heads copy at least {t['copy']} of the names.")
    if measured:
        out.append("- the largest direct effects, whatever their label: " + "; ".join(largest_effects(r)) + ".")
    out.append("")
    return out + circuit_markdown(ioi)


def largest_effects(roles: dict, n: int = 4) -> list[str]:
    """The n heads of largest |direct effect|, each with the attention and copy figures behind a role."""
    effect = np.asarray(roles["direct_effect"])
    attn = {k: np.asarray(v) for k, v in roles["attention"].items()}
    copy, neg = np.asarray(roles["copy_score"]), np.asarray(roles.get("neg_copy_score", roles["copy_score"]))
    out = []
    for flat in np.argsort(-np.abs(effect), axis=None)[:n]:
        l, h = np.unravel_index(int(flat), effect.shape)
        out.append(f"L{l}H{h} {effect[l, h]:+.3f} (END->IO {attn['io'][l, h]:.2f}, END->S2 {attn['s2'][l, h]:.2f}, copy "
                   f"{copy[l, h]:.2f}, negative copy {neg[l, h]:.2f})")
    return out


def _stats_cells(stats: dict) -> str:
    return (f"{_f(stats.get('control_mean'))} +- {_f(stats.get('control_std'))} | {stats.get('rank')} of "
            f"{stats.get('n_controls', 0) + 1} | {_f(stats.get('p'))}")


def disposer_markdown(ioi: dict) -> list[str]:
    out = []
    for method, label in (("eap", "EAP"), ("eap-ig", "EAP-IG")):
        d = ioi.get(f"disposer_{method}")
        if not d:
            continue
        out += [f"**{label}'s discovered circuit** ({len(d['heads'])} heads of its top edges: {_heads(d['heads'])})."]
        if d.get("not_tested"):
            out += [f"Not tested: {d['not_tested']}.", ""]
            continue
        a, loss = d["ablation"], d["ablation"]["summary"]["metrics"].get("loss", {})
        p = d["patching"]
        n = a["summary"]["n_controls"]
        control_loss = a.get("loss_controls_mean")
        out += [f"Against {n} {d['controls']} random head groups of the same size"
                f"{'; ' + d['controls_note'] if d['controls_note'] else ''}:", "",
                "| test | full model | circuit's heads ablated | controls' mean +- sd | rank | p |", "|---|---|---|---|---|---|",
                f"| zero ablation, IO loss at END | {_f(a['loss_clean'])} | {_f(a['loss_ablated'])} | "
                f"{_f(control_loss)} +- {_f(loss.get('control_std'))} | {loss.get('rank')} of {n + 1} | {_f(loss.get('p'))} |",
                f"| patched from the ABC prompts, logit difference left (clean 1, ABC 0) | 1 | {_f(p['score'])} | "
                f"{_stats_cells(p['stats'])} |", ""]
        out += [f"- verdict **{k}**: {v['label']} ({v['rule']})" for k, v in a["summary"]["verdicts"].items()]
        out += [f"- patching verdict: {p['verdict']}", ""]
    return (["### The disposer on the discovered circuits", ""] + out) if out else []


def circuit_markdown(ioi: dict) -> list[str]:
    """The circuit stages (core/pipelines/study_circuit.py): disposer, path patching, proposers, [HHG], ACDC."""
    out = disposer_markdown(ioi)
    paths = ioi.get("paths")
    if paths:
        out += ["### Path patching into the top heads' q, k and v", "",
                f"Denoising ({paths['metric']}): {paths['meaning']}; the senders against matched-random sender groups "
                "in the same layers.", "",
                "| receiver | input | senders | score | controls' mean +- sd | rank | p |", "|---|---|---|---|---|---|---|"]
        out += [f"| {r['receiver']} | {r['component']} | {_heads(r['senders'])} ({r['senders_chosen']}) | "
                f"{_f(r['score'])} | {_stats_cells(r['stats'])} |" for r in paths["rows"]]
        out += [f"- note: {n}" for n in paths["notes"]] + [""]
    prop = ioi.get("proposers")
    if prop:
        out += ["### The proposers on the IOI prompts", "",
                f"Each proposal ({prop['size']} heads where a size is chosen) zero-ablated on the clean prompts against "
                f"{prop['n_controls']} {prop['controls']} random head groups; closure rules of METHODS.md.", "",
                "| proposer | heads | verdict (paper) | verdict (reference) | IO loss delta | z | why |",
                "|---|---|---|---|---|---|---|"]
        out += [f"| {r['method']} | {r['heads'] or 'none'} | {r['verdict (paper)']} | {r['verdict (reference)']} | "
                f"{_f(r.get('delta loss'))} | {_f(r.get('z loss'), 2)} | {r['rationale']} |" for r in prop["rows"]]
        out.append("")
    hhg = ioi.get("gradient_vs_causal")
    if hhg:
        out += ["### Gradient vs causal ranks ([HHG]) on IOI", "",
                f"G: {hhg['gradient_measure']}; C: {hhg['causal']}. Over the {hhg['n_heads']} heads, Spearman rho "
                f"**{_f(hhg['spearman'])}** (p {_f(hhg['spearman_p'])}); with [HHG]'s rank threshold "
                f"{hhg['threshold']:g}, {hhg['n_heroes']} hidden heroes (small gradient, large effect) and "
                f"{hhg['n_bloats']} gradient bloats. Largest:", "",
                "| class | head | d = rank G - rank C | G | C |", "|---|---|---|---|---|"]
        out += [f"| {kind} | {name} | {d:+.0f} | {g:.3g} | {c:+.3f} |"
                for kind, rows in (("hero", hhg["heroes"][:5]), ("bloat", hhg["bloats"][:5])) for name, d, g, c in rows]
        out += [f"- note: heads only ([HHG] also ranks the MLPs); with {hhg['n_heads']} heads a rank gap of 6 is small, so read rho "
                "and the largest gaps.", ""]
    acdc = ioi.get("acdc_cost")
    if acdc:
        out += ["### ACDC", "",
                f"Not run: it tests the {acdc['n_edges']} edges one at a time, {acdc['forwards_per_edge']} patched "
                f"forward over the {acdc['n_pairs']} pairs per edge, and one such forward took "
                f"{acdc['seconds_per_trial']:.2f} s of wall time here (median of {len(acdc['trial_seconds'])})"
                + (f" and {acdc['cpu_seconds_per_trial']:.2f} s of CPU time at {acdc['threads']} thread(s), on a machine "
                   f"of {acdc['cpu_count']} cores with load average {acdc['load_average']:.1f}" if "cpu_seconds_per_trial"
                   in acdc else "")
                + f", so ACDC would take up to about **{acdc['estimated_hours']:.1f} h** of wall time"
                + (f" (**{acdc['cpu_estimated_hours']:.1f} h** of CPU time)" if "cpu_estimated_hours" in acdc else "")
                + " (edges x seconds per forward; edges of dead nodes are removed without a forward, so somewhat less).",
                ""]
    return out


def report_markdown(report: dict, figures: dict[str, str] | None = None) -> str:
    """The report's Markdown, from its JSON alone: every number here is a field of report.json."""
    settings = report["settings"]
    out = [f"# {report['model']}: {report['task']} circuit study", "",
           f"Generated from `report.json` by `python -m core study {report['model']} --task {report['task']}"
           f"{' --quick' if settings['quick'] else ''}`. Measured time: **{sum(report['stage_seconds'].values()):.0f} s** "
           f"of stage compute ({', '.join(f'{k} {v:.0f} s' for k, v in report['stage_seconds'].items())}, each timed "
           f"when it ran; a stage reused from the cache keeps its first run's time), and {report['wall_seconds']:.0f} s "
           f"wall for the invocation that wrote this report; "
           f"{report['device']}, {report['dtype']}.", ""]
    if report.get("note"):
        source = report.get("source", {})
        out += [f"**Weights: {source.get('quantization', 'quantized')} ({source.get('file', 'GGUF')}).** "
                f"{report['note'][0].upper()}{report['note'][1:]}.", ""]
    if report["task"] == "ioi":
        out += [f"Settings: {settings['n']} pairs (seed {settings['seed']}), {settings['n_controls']} matched-random "
                f"edge sets, top-{settings['top_edges']} edges, EAP-IG {settings['ig_steps']} steps, activation "
                f"patching of attribution's top {settings['top_k_heads']} heads.", ""]
    else:
        out += [f"Settings: {settings['n']} sequences of {settings['seq_len']} tokens per probe (seed "
                f"{settings['seed']}), {settings['n_controls']} matched-random head groups.", ""]
    if "induction" in report:
        out += induction_markdown(report)
    if "ioi" in report:
        out += ioi_markdown(report)
    if figures:
        out += ["## Figures", ""] + [f"- [{caption}]({path})" for caption, path in figures.items()] + [""]
    out += ["## Not measured", ""] + [f"- {line}" for line in not_measured(report)] + [""]
    return "\n".join(out)


def not_measured(report: dict) -> list[str]:
    """What the issue asks for that this report does not hold, said plainly."""
    lines = ["the full (non-quick) study: at least 100 pairs (this run used --quick)"] if report["settings"]["quick"] else []
    if report["task"] == "ioi":
        lines += [f"stage {name} (left out with --skip: it did not fit the time of this run)"
                  for name in report["ioi"].get("skipped", [])]
        lines += ["ACDC itself (its measured cost is above)" if "acdc_cost" in report["ioi"] else "ACDC",
                  "the S-inhibition rule's causal half (its output lowering name movers' attention to S)"
                  + ("; path patching above measures what the S-inhibition heads send into the top heads' inputs"
                     if "paths" in report["ioi"] else "")]
    else:
        lines += ["the candidate ablated on the one-shot probe, and the previous-token circuit's own ablation"]
    return lines
